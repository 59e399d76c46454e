"""Secrets are owner-only from their creation (security finding 5): the one writer
(``berth.private.write_private``) and every file of secrets berth writes — the nats-server
configuration (every password), the credentials files, the CLI's API file — is ``0600`` even
under a permissive umask, and a file replaced is replaced whole."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth.api.server import write_api_file
from berth.nats.auth import generate
from berth.private import write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that would leave every new file world-readable (and writable)."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.usefixtures("open_umask")
def test_the_server_configuration_and_every_credentials_file_is_owner_only(
    tmp_path: Path,
) -> None:
    paths = generate(["node-00", "node-01"]).write(tmp_path / "auth")
    assert set(paths) >= {"server", "scheduler", "client", "node-node-00", "node-node-01"}
    assert {name: mode(path) for name, path in paths.items()} == dict.fromkeys(paths, 0o600)
    assert "password" in paths["server"].read_text()


@pytest.mark.usefixtures("open_umask")
def test_the_api_file_is_owner_only(tmp_path: Path) -> None:
    path = write_api_file("http://127.0.0.1:1", "t" * 32, tmp_path / "cli" / "api.json")
    assert mode(path) == 0o600 and mode(path.parent) == 0o700


@pytest.mark.usefixtures("open_umask")
def test_a_secret_replaced_is_replaced_whole_and_stays_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("old")
    path.chmod(0o644)  # an older, wider file in the way
    write_private(path, "new")
    assert path.read_text() == "new" and mode(path) == 0o600
    write_private(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]  # no temporary left


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_private(path, "kept")
    with pytest.raises(TypeError):
        write_private(path, 12)  # type: ignore[arg-type]
    assert path.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]
