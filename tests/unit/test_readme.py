"""The README's library example runs as written, and its two fresh-machine commands are real."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_library_example_runs(capsys: object) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "the README has a python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


def test_fresh_machine_commands_use_existing_entry_points() -> None:
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", README)
    assert len(commands) == 2
    main_job, tests = commands
    assert main_job.endswith(".venv/bin/berth demo")
    assert tests.endswith(".venv/bin/python -m pytest")
