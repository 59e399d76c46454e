"""``python -m berth.cli``: the ``berth`` command, as the console script runs it."""

from berth.cli.main import main

main()
