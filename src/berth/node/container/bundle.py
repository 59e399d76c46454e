"""One container's OCI bundle: the runtime spec (``config.json``) written for ``runc``.

A bundle is a directory holding ``config.json`` and the ``rootfs`` it names
(the `OCI runtime specification <https://github.com/opencontainers/runtime-spec>`_).  This
module turns a workload — its :class:`~berth.boot.BootSpec` and its image's
:class:`~berth.oci.OciConfig` — into that document:

* **the process**: the image's ``Entrypoint`` followed by the command the workload was given
  (it stands where the image's ``Cmd`` would, as ``docker run IMAGE CMD`` does; with none,
  the image's ``Cmd`` runs — :meth:`~berth.oci.OciConfig.args`); the image's
  ``Env`` overlaid with the workload's; the image's ``WorkingDir`` (``/`` when none); as the
  image's ``User`` — a name or id resolved in the image's own ``/etc/passwd`` and
  ``/etc/group`` — or, when the image names none, as ``nobody`` (uid and gid 65534), never
  as root by default.  The program must exist in the image (looked up on the image's
  ``PATH``), else the boot fails with ``command not found``;
* **isolation**: its own mount, PID, UTS and IPC namespaces; the host's network by default,
  or a network namespace of its own holding only loopback (``network = "none"``); the
  default capabilities of ``runc spec`` (``AUDIT_WRITE``, ``KILL``, ``NET_BIND_SERVICE``),
  no new privileges, ``/proc`` and ``/sys`` paths masked as ``runc spec`` masks them;
* **limits** from the spec: memory (``mem_limit``, swap included), a CPU quota of ``vcpus``
  cores per 100 ms period, and a pids limit; the cgroup is ``/berth/<container id>``.

Paths inside the image are resolved as the container will see them (:func:`inside`):
symbolic links are followed relative to the root filesystem, never out of it.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from berth.boot import BootFailed, BootSpec
from berth.oci import OciConfig

__all__ = [
    "CPU_PERIOD_US",
    "NOBODY",
    "Network",
    "find_program",
    "inside",
    "runtime_spec",
    "user_ids",
]

Network = Literal["host", "none"]
"""A container's network: the host's (``host``), or only loopback of its own (``none``)."""

NOBODY = (65534, 65534)
"""Whom a container runs as when its image names no ``User``: ``nobody:nogroup``."""

CPU_PERIOD_US = 100_000
"""The CPU quota's period: 100 ms, the kernel's default."""

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MAX_LINKS = 40
_CAPABILITIES = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
_MASKED = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
]
_READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def inside(root: Path, path: str) -> Path | None:
    """``path`` (absolute, as the container sees it) resolved within ``root``: symbolic links
    followed as the container would follow them (an absolute target from ``root``, ``..``
    never above it); ``None`` when it does not exist or links loop."""
    pending = [part for part in path.split("/") if part]
    done: list[str] = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, part)
        try:
            info = os.lstat(here)
        except OSError:
            return None
        if not stat.S_ISLNK(info.st_mode):
            done.append(part)
            continue
        links += 1
        if links > _MAX_LINKS:
            return None
        target = os.readlink(here)
        if target.startswith("/"):
            done = []
        pending = [piece for piece in target.split("/") if piece] + pending
    return root.joinpath(*done)


def find_program(root: Path, program: str, env: Mapping[str, str], workdir: str) -> bool:
    """Whether ``program`` names an executable file in the image at ``root``: a path
    (relative ones from ``workdir``) or a name on the container's ``PATH``."""
    if "/" in program:
        candidates = [posixpath.join(workdir, program)]
    else:
        path = env.get("PATH", DEFAULT_PATH)
        candidates = [posixpath.join(entry or "/", program) for entry in path.split(":")]
    for candidate in candidates:
        found = inside(root, candidate)
        if found is not None and found.is_file() and os.access(found, os.X_OK):
            return True
    return False


def user_ids(root: Path, user: str) -> tuple[int, int, list[int]]:
    """The uid, gid and supplementary gids the image's ``User`` names (``name``, ``uid``,
    ``name:group``, ``uid:gid``), resolved in the image's ``/etc/passwd`` and ``/etc/group``;
    ``""`` is :data:`NOBODY`.  ``BootFailed`` for a name the image does not know."""
    user = user.strip()
    if not user:
        return NOBODY[0], NOBODY[1], []
    name, _, group = user.partition(":")
    passwd = _database(root, "/etc/passwd")
    if name.isdigit():
        uid = int(name)
        entry = next((row for row in passwd if row[2] == name), None)
        gid = int(entry[3]) if entry is not None and entry[3].isdigit() else 0
        login = entry[0] if entry is not None else None
    else:
        entry = next((row for row in passwd if row[0] == name), None)
        if entry is None or not entry[2].isdigit() or not entry[3].isdigit():
            raise BootFailed(f"the image's user {user!r} is not in its /etc/passwd")
        uid, gid, login = int(entry[2]), int(entry[3]), name
    groups = _database(root, "/etc/group")
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            row = next((row for row in groups if row[0] == group), None)
            if row is None or not row[2].isdigit():
                raise BootFailed(f"the image's group {group!r} is not in its /etc/group")
            gid = int(row[2])
    extra = sorted(
        {
            int(row[2])
            for row in groups
            if login is not None and row[2].isdigit() and login in row[3].split(",")
        }
        - {gid}
    )
    return uid, gid, extra


def _database(root: Path, path: str) -> list[list[str]]:
    """The rows of a colon-separated file of the image (``[]`` when it has none)."""
    found = inside(root, path)
    if found is None or not found.is_file():
        return []
    try:
        text = found.read_text(errors="replace")[: 1 << 20]
    except OSError:
        return []
    rows = [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]
    return [row + [""] * (4 - len(row)) for row in rows]


def runtime_spec(
    spec: BootSpec,
    image: OciConfig,
    root: Path,
    *,
    hostname: str,
    container_id: str,
    network: Network,
    pids_limit: int,
) -> dict[str, Any]:
    """The ``config.json`` of a container running ``spec`` from an image with config
    ``image`` whose root filesystem is mounted at ``root`` (see the module docstring);
    ``BootFailed`` when its program or user is not in the image."""
    env = {"PATH": DEFAULT_PATH, **image.environment(), **spec.env}
    workdir = posixpath.normpath("/" + image.working_dir.lstrip("/"))
    args = list(image.args(spec.command))
    if not args:
        raise BootFailed("no command: the workload gives none and its image has no Cmd")
    if not find_program(root, args[0], env, workdir):
        raise BootFailed(f"command not found: {args[0]!r}")
    uid, gid, extra = user_ids(root, image.user)
    namespaces = [{"type": kind} for kind in ("pid", "ipc", "uts", "mount")]
    if network == "none":
        namespaces.append({"type": "network"})
    resources: dict[str, Any] = {
        "devices": [{"allow": False, "access": "rwm"}],
        "pids": {"limit": pids_limit},
    }
    if spec.mem_limit is not None:
        resources["memory"] = {"limit": spec.mem_limit, "swap": spec.mem_limit}
    if spec.vcpus is not None:
        quota = max(1000, math.ceil(float(spec.vcpus) * CPU_PERIOD_US))
        resources["cpu"] = {"quota": quota, "period": CPU_PERIOD_US}
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid, "additionalGids": extra},
            "args": args,
            "env": [f"{key}={value}" for key, value in env.items()],
            "cwd": workdir,
            "capabilities": {
                kind: list(_CAPABILITIES)
                for kind in ("bounding", "effective", "permitted", "ambient")
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": str(root), "readonly": False},
        "hostname": hostname,
        "mounts": _mounts(),
        "linux": {
            "namespaces": namespaces,
            "resources": resources,
            "cgroupsPath": f"/berth/{container_id}",
            "maskedPaths": list(_MASKED),
            "readonlyPaths": list(_READONLY),
        },
    }


def _mounts() -> list[dict[str, Any]]:
    """``/proc``, a small ``/dev``, ``/dev/pts``, ``/dev/shm``, ``/dev/mqueue`` and a
    read-only ``/sys``: what ``runc spec`` gives every container."""
    nosuid = ["nosuid", "noexec", "nodev"]
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": [*nosuid, "mode=1777", "size=65536k"],
        },
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": nosuid},
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": [*nosuid, "ro"],
        },
    ]


def write_bundle(directory: Path, config: dict[str, Any]) -> Path:
    """Write ``config`` as ``directory/config.json``; its path."""
    path = directory / "config.json"
    path.write_text(json.dumps(config, indent=1))
    return path
