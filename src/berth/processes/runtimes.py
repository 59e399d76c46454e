"""Which runtime ``berth up``'s agents run, and each one's node configurations.

``berth up`` (:mod:`berth.processes.up`) gives its agents the embedded cluster's node classes
(:func:`~berth.embedded.embedded_configs`); for the runtimes that run images it also checks,
before anything starts, that this host can run them — each missing piece named with its fix,
as ``berth agent --check`` names it:

* :func:`microvm_configs` — QEMU guests from what ``berth microvm setup`` made, all on
  :data:`MICROVM_PLATFORM`;
* :func:`container_configs` — containers under ``runc``, all on this host's platform;
  :func:`container_problems` is also what ``berth up --runtime auto`` asks to choose between
  containers and host processes;
* :func:`labelled` — whatever the runtime, labels on every node (``--label``) and a ``zone``
  label dealt out in turn (``--zones``), so a zone spread has zones to spread over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from berth.defaults import MICROVM_STOP_GRACE_S
from berth.embedded import embedded_configs
from berth.errors import Invalid
from berth.node.config import AgentConfig, ContainerSection, MicrovmSection, NodeSection
from berth.node.microvm.paths import GuestFiles
from berth.platform import host as host_platform

__all__ = [
    "MICROVM_PLATFORM",
    "ZONE_LABEL",
    "container_configs",
    "container_problems",
    "labelled",
    "microvm_configs",
    "zone_name",
]

MICROVM_PLATFORM = "linux/amd64"
"""The microVM runtime boots guests of the host's platform only."""


def microvm_configs(nodes: int, heartbeat_s: float, files: GuestFiles) -> list[AgentConfig]:
    """The embedded cluster's node classes as ``microvm`` agents booting guests from
    ``files``; ``Invalid`` naming ``--runtime`` with each missing piece and its fix (the
    checks of ``berth agent --check``) when this host cannot boot guests."""
    from berth.node.microvm.setup import check_rows

    plain = embedded_configs(
        nodes, platforms=(MICROVM_PLATFORM,), runtime="fake", heartbeat_s=heartbeat_s
    )  # checks nodes and heartbeat_s, naming them
    agent = plain[0].agent.model_copy(
        update={"runtime": "microvm", "stop_grace_s": MICROVM_STOP_GRACE_S}
    )
    section = MicrovmSection(data_dir=str(files.data_dir))
    configs = [c.model_copy(update={"agent": agent, "microvm": section}) for c in plain]
    _, missing = check_rows(configs[0])
    if missing:
        raise Invalid(
            f"microVM guests cannot boot on this host: {'; '.join(missing)}", field="--runtime"
        )
    return configs


def container_configs(nodes: int, heartbeat_s: float) -> list[AgentConfig]:
    """The embedded cluster's node classes as ``container`` agents, all on this host's
    platform (a container runs the host's architecture only); ``Invalid`` naming
    ``--runtime`` with each missing piece and its fix when this host cannot run them."""
    here = (str(host_platform()),)
    plain = embedded_configs(nodes, platforms=here, runtime="fake", heartbeat_s=heartbeat_s)
    agent = plain[0].agent.model_copy(update={"runtime": "container"})
    configs = [c.model_copy(update={"agent": agent}) for c in plain]
    missing = container_problems()
    if missing:
        raise Invalid(
            f"containers cannot run on this host: {'; '.join(missing)}", field="--runtime"
        )
    return configs


def container_problems() -> list[str]:
    """What this host lacks to run ``berth up``'s containers (empty: nothing): the OCI
    runtime, root, erofs and overlay mounts, a static busybox for the starter image."""
    from berth.node.container.setup import problems
    from berth.node.microvm.images import BUSYBOX

    missing = problems(ContainerSection())
    if not BUSYBOX.is_file():
        missing.append(f"no static busybox at {BUSYBOX} (apt-get install busybox-static)")
    return missing


ZONE_LABEL = "zone"


def zone_name(index: int) -> str:
    """The ``index``-th zone of ``berth up --zones``: ``a``, ``b``, … ``z``, ``z26``, …"""
    return chr(ord("a") + index) if index < 26 else f"z{index}"


def labelled(
    configs: Sequence[AgentConfig], zones: int, labels: Mapping[str, str]
) -> list[AgentConfig]:
    """``configs`` with ``labels`` on every node and, with ``zones``, a ``zone`` label that
    deals the nodes out in turn (``node-00`` in ``a``, ``node-01`` in ``b``, …); a bad label
    or count is ``Invalid`` naming ``--label`` or ``--zones``."""
    if isinstance(zones, bool) or not isinstance(zones, int) or not 0 <= zones <= len(configs):
        raise Invalid(
            f"must be a whole number from 0 to the number of nodes ({len(configs)}), got {zones!r}",
            field="--zones",
        )
    if zones and ZONE_LABEL in labels:
        raise Invalid(
            f"--label {ZONE_LABEL}={labels[ZONE_LABEL]} and --zones {zones} both set the "
            f"'{ZONE_LABEL}' label: give one",
            field="--label",
        )
    out = []
    for index, config in enumerate(configs):
        wanted = {**config.node.labels, **labels}
        if zones:
            wanted[ZONE_LABEL] = zone_name(index % zones)
        try:
            node = NodeSection.model_validate({**config.node.model_dump(), "labels": wanted})
        except ValidationError as error:
            raise Invalid(
                error.errors()[0]["msg"].removeprefix("Value error, "), field="--label"
            ) from None
        out.append(config.model_copy(update={"node": node}))
    return out
