"""The container runtime driver: each workload runs from its image's layers under ``runc``.

A workload's image comes from the node's OCI image layout (``BootSpec.image``, a reference
in it).  Its root filesystem is the node's erofs layer files, each **mounted read-only once
per node and shared** by every container that uses it
(:class:`~berth.node.container.mounts.LayerMounts`), stacked by overlayfs under an upper and
work directory of the container's own in its scratch directory ``<node_dir>/run/<id>``.  The
process runs under ``runc`` (Debian's; found on ``PATH`` or configured), from an OCI bundle
written per workload (:mod:`berth.node.container.bundle`: the image's ``Entrypoint``, the
workload's command in place of ``Cmd``, the image's ``Env``, ``WorkingDir`` and ``User`` —
``nobody`` when it names none — in its own mount, PID, UTS and IPC namespaces, on the host's
network or only loopback, with its spec's memory, CPU quota and a pids limit).

An image built for another platform than this node's is refused before anything is mounted
(``BootFailed``: ``platform_mismatch: …``): no more arm64 images on an amd64 host.

``runc run`` runs in the foreground under the supervisor the process runtime gives every
workload (:class:`~berth.node.runtime.process.ProcessRuntime`), so a container outlives its
agent for the orphan grace, then is killed, and a restarted agent adopts one that still
runs — exactly as a process workload.  ``stop`` sends ``SIGTERM`` to ``runc``, which passes
it to the container's init; after the grace the supervisor kills the whole tree (``runc``,
its init, everything in the container).  A container's end is its init's: ``runc``'s exit
status, 128 + N read as signal N; a container that the kernel's OOM killer ended (its
cgroup's ``oom_kill`` count, read before the container is deleted) says so in its reason.
What a container leaves — its ``runc`` state and cgroup (``runc delete``), its root
filesystem's overlay, its scratch directory, its references on the layers — is removed
when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from berth.defaults import ORPHAN_GRACE_S, STOP_GRACE_S
from berth.errors import BerthError, Invalid
from berth.loops import to_thread_whole
from berth.node.config import AgentConfig
from berth.node.container.bundle import Network, runtime_spec, write_bundle
from berth.node.container.mounts import LayerMounts, MountFailed, overlay, unmount
from berth.node.layer_files import LayerFiles
from berth.node.runtime.port import (
    BootFailed,
    BootSpec,
    RuntimeDriver,
    WorkloadExit,
    WorkloadHandle,
    workload_hostname,
)
from berth.node.runtime.process import ProcessRuntime
from berth.node.runtime.supervisor import atomic_write, file_stem
from berth.oci import OciImage, read_layout
from berth.platform import Platform, host
from berth.units import MiB

__all__ = ["DEFAULT_PIDS_LIMIT", "ContainerRuntime", "container_id"]

log = logging.getLogger("berth.container")

DEFAULT_PIDS_LIMIT = 1024
"""How many processes one container may hold at once."""

_CONTAINER_FILE = "container.json"
_RUNC_ID = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
_CGROUP_ROOTS = (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup"))


def container_id(workload_id: str) -> str:
    """The id ``runc`` knows a workload's container by: the workload id when ``runc`` takes
    it (letters, digits, ``_ . + -``), else a digest of it."""
    if _RUNC_ID.fullmatch(workload_id) and not workload_id.startswith("."):
        return workload_id
    return "w-" + hashlib.sha256(workload_id.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class _Start:
    """What one container's start is made of: the workload, its container id and image, the
    image's layer mounts (lowest first) and the scratch directory its files go in."""

    spec: BootSpec
    workload_id: str
    cid: str
    image: OciImage
    lowers: tuple[Path, ...]
    scratch: Path


@dataclass(eq=False)
class _Container:
    workload: WorkloadHandle
    runc: WorkloadHandle
    scratch: Path
    cid: str
    layers: tuple[str, ...]
    stop_requested: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class ContainerRuntime(RuntimeDriver):
    """Runs each workload in a container from its image's layers (see the module docstring).

    ``layers`` — the node's layer files (give its ``registry`` to the node); ``images`` — the
    OCI image layout workloads' images are read from; ``node_dir`` — where the layer mounts
    (``mounts/``), the containers' scratch directories (``run/``) and ``runc``'s state
    (``runc/``) go; ``runc`` — the OCI runtime's binary; ``network`` — ``host`` or ``none``;
    ``platform`` — what this node runs (default: this host's); ``log_dir`` — where each
    workload's output goes (``<id>.log``), if anywhere; ``state_dir`` and ``orphan_grace_s``
    — the supervisors' (as the process runtime's).
    """

    def __init__(
        self,
        layers: LayerFiles,
        images: str | Path,
        node_dir: str | Path,
        *,
        runc: str = "runc",
        network: Network = "host",
        pids_limit: int = DEFAULT_PIDS_LIMIT,
        platform: Platform | None = None,
        stop_grace_s: float = STOP_GRACE_S,
        log_dir: str | Path | None = None,
        state_dir: Path | None = None,
        orphan_grace_s: float = ORPHAN_GRACE_S,
    ) -> None:
        super().__init__(stop_grace_s)
        if not isinstance(layers, LayerFiles):
            raise Invalid(f"expected the node's LayerFiles, got {layers!r}", field="layers")
        if network not in ("host", "none"):
            raise Invalid(f"must be 'host' or 'none', got {network!r}", field="network")
        if isinstance(pids_limit, bool) or not isinstance(pids_limit, int) or pids_limit < 1:
            raise Invalid(f"must be a positive count, got {pids_limit!r}", field="pids_limit")
        found = shutil.which(runc)
        if found is None:
            raise Invalid(f"{runc!r} is not installed (apt-get install runc)", field="runc")
        self.runc = found
        self.layer_files = layers
        self.images = Path(images)
        self.node_dir = Path(node_dir)
        self.network: Network = network
        self.pids_limit = pids_limit
        self.platform = platform if platform is not None else host()
        self.work_dir = self.node_dir / "run"
        self.runc_root = self.node_dir / "runc"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.mounts = LayerMounts(layers, self.node_dir / "mounts")
        self._host = ProcessRuntime(
            stop_grace_s=self.stop_grace_s,
            log_dir=log_dir,
            state_dir=state_dir,
            orphan_grace_s=orphan_grace_s,
        )
        self._containers: dict[str, _Container] = {}
        self._starting: set[str] = set()
        self._watchers: set[asyncio.Task[None]] = set()

    @classmethod
    def from_config(
        cls,
        config: AgentConfig,
        *,
        state_dir: Path | None = None,
    ) -> ContainerRuntime:
        """The runtime an agent's ``[container]`` table describes: its layer files under
        ``<node_dir>/layers`` with the agent's ``layer_cache`` budget, the node's platform,
        the agent's stop and orphan graces; ``state_dir`` the agent's (where its journal is)."""
        section = config.container
        images, node_dir = section.directories(config.node.name)
        return cls(
            LayerFiles(node_dir / "layers", config.agent.layer_cache),
            images,
            node_dir,
            runc=section.runc,
            network=section.network,
            pids_limit=section.pids_limit,
            platform=config.node.platform,
            stop_grace_s=config.agent.stop_grace_s,
            log_dir=Path(section.log_dir).expanduser() if section.log_dir else None,
            state_dir=state_dir,
            orphan_grace_s=config.agent.orphan_grace_s,
        )

    @property
    def labels(self) -> dict[str, str]:
        """What the node's snapshot says of its containers."""
        return {"container.network": self.network}

    @property
    def log_dir(self) -> Path | None:
        """Where its containers' output goes (``[container] log_dir``), if anywhere."""
        return self._host.log_dir

    def log_of(self, workload_id: str) -> Path | None:
        """Where ``workload_id``'s output goes (with a ``log_dir``)."""
        return self._host.log_of(workload_id)

    # -- the port ----------------------------------------------------------------------------
    def list(self) -> tuple[WorkloadHandle, ...]:
        return tuple(container.workload for container in self._containers.values())

    async def start(self, spec: BootSpec, workload_id: str | None = None) -> WorkloadHandle:
        """Run ``spec`` in a new container; return once ``runc`` runs it (``BootFailed`` when
        it cannot: an image not in the layout or of another platform, a program or user the
        image lacks, a mount or ``runc`` that fails).  A start that ends early — failed or
        cancelled — undoes what it made."""
        if not isinstance(spec, BootSpec):
            raise Invalid(f"expected a BootSpec, got {spec!r}", field="spec")
        workload_id = self._ids.choose(spec, workload_id, self._containers.keys() | self._starting)
        self._starting.add(workload_id)  # a concurrent start of this id is refused meanwhile
        try:
            return await self._start(spec, workload_id)
        finally:
            self._starting.discard(workload_id)

    async def _start(self, spec: BootSpec, workload_id: str) -> WorkloadHandle:
        image = self._image(spec.image)
        cid = container_id(workload_id)
        try:
            lowers = await self.mounts.acquire(image.layers)
        except BerthError as error:
            raise BootFailed(f"layers of {image.ref or image.digest}: {error}") from None
        digests = tuple(layer.digest for layer in image.layers)
        scratch = self.work_dir / file_stem(workload_id)
        try:
            runc = await self._launch(_Start(spec, workload_id, cid, image, lowers, scratch))
        except BaseException as error:
            await asyncio.to_thread(self._clean, scratch, cid)
            self.mounts.release(digests)
            if isinstance(error, OSError):
                raise BootFailed(f"cannot make the container's files: {error}") from None
            raise
        workload = WorkloadHandle(workload_id, spec, pid=runc.pid)
        workload.locator = runc.locator
        self._watch(_Container(workload, runc, scratch, cid, digests))
        return workload

    async def _launch(self, start: _Start) -> WorkloadHandle:
        """Make the container's root filesystem and bundle in its scratch directory and
        start ``runc`` on it under a supervisor; ``runc``'s handle, its locator naming the
        container."""
        # mounts, the image's passwd and fsynced files: off the agent's event loop
        await to_thread_whole(self._bundle, start)
        workload_id, cid, image, scratch = start.workload_id, start.cid, start.image, start.scratch
        argv = (self.runc, "--root", str(self.runc_root), "run", "--keep", "--bundle")
        command = (*argv, str(scratch), cid)
        try:
            runc = await self._host.start(
                BootSpec(name=workload_id, command=command), workload_id=workload_id
            )
        except BootFailed as error:
            raise BootFailed(f"cannot run {self.runc}: {error.reason}") from None
        assert runc.locator is not None
        runc.locator = {
            **runc.locator,
            "scratch": str(scratch),
            "container": cid,
            "layers": ",".join(layer.digest for layer in image.layers),
        }
        record = json.dumps({"workload_id": workload_id, **runc.locator})
        await to_thread_whole(atomic_write, scratch / _CONTAINER_FILE, record)
        return runc

    def _bundle(self, start: _Start) -> None:
        """The container's root filesystem (an overlay on the layers' mounts) and its bundle
        in its scratch directory (what an earlier start left there removed first)."""
        scratch, cid = start.scratch, start.cid
        if scratch.exists():
            self._clean(scratch, cid)
        rootfs = scratch / "rootfs"
        for directory in (scratch / "upper", scratch / "work", rootfs):
            directory.mkdir(parents=True)
        try:
            overlay(list(reversed(start.lowers)), scratch / "upper", scratch / "work", rootfs)
        except MountFailed as error:
            raise BootFailed(str(error)) from None
        config = runtime_spec(
            start.spec,
            start.image.config,
            rootfs,
            hostname=workload_hostname(start.workload_id),
            container_id=cid,
            network=self.network,
            pids_limit=self.pids_limit,
        )
        write_bundle(scratch, config)

    def _image(self, ref: str | None) -> OciImage:
        """``ref``'s image for this node's platform, or ``BootFailed`` saying why not."""
        try:
            image = read_layout(self.images, ref=ref, platform=self.platform)
        except Invalid as error:
            which = "the only image" if ref is None else f"image {ref!r}"
            if error.field == "platform":  # the layout has it, but not for this node
                raise BootFailed(f"platform_mismatch: {which}: {error.message}") from None
            raise BootFailed(f"{which} of {self.images}: {error}") from None
        if not self.platform.matches(image.platform):
            raise BootFailed(
                f"platform_mismatch: image {image.ref or image.digest} is built for "
                f"{image.platform}; this node runs {self.platform}"
            )
        return image

    def _watch(self, container: _Container) -> None:
        self._containers[container.workload.id] = container
        watcher = asyncio.get_running_loop().create_task(
            self._wait(container), name=f"berth-container-{container.workload.id}"
        )
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _wait(self, container: _Container) -> None:
        try:
            ended = await container.runc.wait()
        except asyncio.CancelledError:  # the agent's loop is ending: the container is left
            # running, as after a crash (a restarted agent adopts it); nothing waits on it here
            self._containers.pop(container.workload.id, None)
            raise
        oom_kills = _oom_kills(container.cid)
        await asyncio.to_thread(self._clean, container.scratch, container.cid)
        self.mounts.release(container.layers)
        self._containers.pop(container.workload.id, None)
        status = _exit(ended.code, ended.signal, oom_kills, container.workload.spec)
        status = WorkloadExit(status.code, status.signal, container.stop_requested, status.detail)
        if container.workload._end(status):
            self._listeners.notify(container.workload)

    def _clean(self, scratch: Path, cid: str) -> None:
        """Remove what a container left: its ``runc`` state and cgroup, its root filesystem's
        overlay, its scratch directory."""
        subprocess.run(
            [self.runc, "--root", str(self.runc_root), "delete", "--force", cid],
            capture_output=True,
            timeout=30,
            check=False,
        )
        unmount(scratch / "rootfs")
        shutil.rmtree(scratch, ignore_errors=True)

    async def stop(self, workload_id: str, *, grace_s: float | None = None) -> None:
        """``SIGTERM`` to the container's init (through ``runc``); the whole container killed
        after ``grace_s`` (else ``stop_grace_s``); returns once it has ended and been
        removed."""
        grace = self._grace(grace_s)
        container = self._containers.get(workload_id)
        if container is None or container.workload.done:
            return
        container.stop_requested = True
        await self._host.stop(workload_id, grace_s=grace)
        await container.workload.wait()

    # -- finding containers again after a restart --------------------------------------------
    def adopt(
        self, workload_id: str, spec: BootSpec, locator: dict[str, Any] | None
    ) -> WorkloadHandle | None:
        """Watch (and be able to stop) a container another agent on this state directory
        started: its ``runc``'s supervisor must still run, and its image must still name the
        layers it runs from, their files here; ``None`` otherwise (a container that runs but
        cannot be adopted is killed)."""
        found = _located(locator)
        if found is None or workload_id in self._containers or workload_id in self._starting:
            return None
        scratch, cid, digests = found
        runc = self._host.adopt(workload_id, spec, locator)
        if runc is None:
            return None
        try:
            image = self._image(spec.image)
        except BootFailed as error:
            log.warning("container %s is not adopted: %s", workload_id, error.reason)
            image = None
        layers = () if image is None else image.layers
        if tuple(layer.digest for layer in layers) != digests or not self.mounts.hold(layers):
            self._host.kill(workload_id)
            return None
        runc.locator = dict(locator or {})
        workload = WorkloadHandle(workload_id, spec, pid=runc.pid)
        workload.locator = runc.locator
        self._watch(_Container(workload, runc, scratch, cid, digests))
        log.info("adopted container %s (runc %s)", workload_id, runc.pid)
        return workload

    def ended(
        self, workload_id: str, locator: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """How a container that ended while no agent watched it ended (its supervisor's
        record of ``runc``'s exit: ``code``, or ``signal`` for 128 + N); what it left is
        removed."""
        record = self._host.ended(workload_id)
        found = _located(locator)
        if found is not None:
            scratch, cid, _ = found
            oom_kills = _oom_kills(cid)
            self._clean(scratch, cid)
            if record is not None:
                code, signum = record.get("code"), record.get("signal")
                status = _exit(
                    code if isinstance(code, int) else None,
                    signum if isinstance(signum, int) else None,
                    oom_kills,
                    None,
                )
                record = {k: v for k, v in record.items() if k not in ("code", "signal")}
                record.update(
                    {"code": status.code} if status.code is not None else {"signal": status.signal}
                )
                if status.detail:
                    record["lost"] = status.detail
        return record

    def abandon(self, workload_id: str, locator: dict[str, Any] | None) -> None:
        """Kill a container of this state directory that will not be adopted, if it runs,
        and remove what it left."""
        self._host.abandon(workload_id, locator)
        found = _located(locator)
        if found is not None:
            self._clean(found[0], found[1])

    async def aclose(self) -> None:
        """Stop every container, then unmount the layers (:meth:`LayerMounts.close`)."""
        await asyncio.gather(*(self.stop(workload.id) for workload in self.list()))
        await asyncio.to_thread(self.mounts.close)

    def __repr__(self) -> str:
        return f"ContainerRuntime(running={len(self._containers)}, network={self.network!r})"


def _located(locator: dict[str, Any] | None) -> tuple[Path, str, tuple[str, ...]] | None:
    """The scratch directory, container id and layer digests a locator names."""
    if not isinstance(locator, dict):
        return None
    scratch, cid, layers = locator.get("scratch"), locator.get("container"), locator.get("layers")
    if not isinstance(scratch, str) or not isinstance(cid, str) or not isinstance(layers, str):
        return None
    if not _RUNC_ID.fullmatch(cid):
        return None
    return Path(scratch), cid, tuple(digest for digest in layers.split(",") if digest)


def _oom_kills(cid: str) -> int:
    """How many times the kernel's OOM killer ran in the container's cgroup (v1's
    ``memory.oom_control``, or v2's ``memory.events``); 0 when unknown."""
    for root, name in zip(_CGROUP_ROOTS, ("memory.oom_control", "memory.events"), strict=True):
        with contextlib.suppress(OSError):
            for line in (root / "berth" / cid / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    return 0


def _exit(
    code: int | None, signum: int | None, oom_kills: int, spec: BootSpec | None
) -> WorkloadExit:
    """A container's end from ``runc``'s: its exit status, 128 + N as signal N; an OOM kill
    named with the limit it met."""
    detail = None
    if oom_kills:
        limit = spec.mem_limit if spec is not None else None
        detail = "out of memory" + (f": its limit is {limit / MiB:g} MiB" if limit else "")
    if code is not None:
        return WorkloadExit.from_status(code, detail=detail)
    return WorkloadExit(signal=signum, detail=detail)
