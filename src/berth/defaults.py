"""berth's defaults: every value a caller gets when it does not say, typed once.

A default that two modules share lives here and nowhere else, so the agent's configuration,
the schedulers, the test clusters and ``berth up`` cannot drift apart (``lease_ttl_s`` was
typed as ``30.0`` in six places).  This module imports nothing of berth's: any layer may read
it.  What a value *may* be (its bounds) is not here but in the type that carries it
(:mod:`berth.model`, :mod:`berth.units`); a default is only the value chosen when none is
given.
"""

from __future__ import annotations

__all__ = [
    "API_STOP_GRACE_S",
    "CONTAINER_DATA_DIR",
    "CONTAINER_PIDS_LIMIT",
    "CONTAINER_RUNC",
    "FOLLOW_IDLE_HEARTBEAT_S",
    "FOLLOW_SYNC_TIMEOUT_S",
    "HEARTBEAT_S",
    "IDEMPOTENCY_ABANDONED_AFTER_S",
    "IDEMPOTENCY_RETENTION_S",
    "KVM_PROBE_TIMEOUT_S",
    "LEASE_TTL_S",
    "LOAD_SAMPLE_PERIOD_S",
    "LOAD_TAU_S",
    "LOCAL_HEARTBEAT_S",
    "LOG_CHUNK_BYTES",
    "LOG_DIR_BYTES",
    "LOG_KEEP_BYTES",
    "LOG_KEEP_PERIOD_S",
    "MAX_LOG_CHUNK_BYTES",
    "MAX_ORPHAN_GRACE_S",
    "MICROVM_BOOT_TIMEOUT_S",
    "MICROVM_QEMU",
    "MICROVM_STOP_GRACE_S",
    "NODE_GONE_AFTER_S",
    "ORPHAN_GRACE_S",
    "RECONCILE_ASK_AT_ONCE",
    "RECONCILE_EVERY_S",
    "RECONCILE_LEASE_TTL_S",
    "RECONCILE_PENDING_AFTER_S",
    "RESTART_ATTEMPTS",
    "RESTART_DELAY_S",
    "RESTART_INTERVAL_S",
    "RESTART_MAX_DELAY_S",
    "RUN_TIMEOUT_S",
    "SCHEDULE_TIMEOUT_S",
    "SHUTDOWN_GRACE_S",
    "STOP_GRACE_S",
    "UP_POLICY",
]

LEASE_TTL_S = 30.0
"""How long an unbound reservation is held for its owner before the node ends it."""

HEARTBEAT_S = 5.0
"""How often an agent publishes its node's snapshot (liveness is three of them)."""

LOCAL_HEARTBEAT_S = 1.0
"""The heartbeat of ``berth up``'s agents: a local cluster on one machine settles in seconds."""

LOAD_SAMPLE_PERIOD_S = 0.25
"""How often an agent's load monitor samples CPU, disk and network (``[agent]
sample_period_s``; Hyper samples CPU every 0.023 s)."""

LOAD_TAU_S = 30.0
"""The time constant of the load monitor's low-pass filters (``[agent] tau_s``; Hyper's)."""

FOLLOW_IDLE_HEARTBEAT_S = 1.0
"""The idle heartbeat of a replica's ordered consumer (:mod:`berth.nats.follow`): it resumes
about two of these after a server restart."""

FOLLOW_SYNC_TIMEOUT_S = 5.0
"""How long a watch of the routes or the records waits to catch up when it starts (it goes
on after, logged)."""

CONTAINER_DATA_DIR = "~/.local/share/berth/container"
"""Where the container runtime keeps its image layout and nodes' files (``[container]
data_dir``)."""

CONTAINER_RUNC = "runc"
"""The OCI runtime containers run under, looked up on ``PATH`` (``[container] runc``)."""

CONTAINER_PIDS_LIMIT = 1024
"""How many processes one container may hold at once (``[container] pids_limit``)."""

MICROVM_QEMU = "qemu-system-x86_64"
"""The QEMU binary microVM guests run under, looked up on ``PATH`` (``[microvm] qemu``)."""

MICROVM_BOOT_TIMEOUT_S = 300.0
"""How long a microVM guest may take to start its workload — a cold boot under emulation on
a busy host (``[microvm] boot_timeout_s``)."""

KVM_PROBE_TIMEOUT_S = 30.0
"""How long the probe guest that decides between KVM and TCG may take to report in."""

SCHEDULE_TIMEOUT_S = 10.0
"""How long a caller of the scheduler queue group waits for a placement."""

RUN_TIMEOUT_S = 60.0
"""How long a scheduler waits for a node to boot a workload (a microVM's cold start)."""

SHUTDOWN_GRACE_S = 5.0
"""How long a stopping scheduler service lets its requests in flight finish before it fails
them (``berth scheduler --grace``)."""

STOP_GRACE_S = 2.0
"""How long a process workload gets after ``SIGTERM`` before ``SIGKILL`` (``[agent]
stop_grace_s``), when a stop names no grace of its own."""

LOG_CHUNK_BYTES = 64 * 1024
"""The most of a workload's output one read returns (``berth logs``, the API's ``limit``)."""

MAX_LOG_CHUNK_BYTES = 128 * 1024
"""The largest ``limit`` a read of a workload's output may ask for: its answer is one NATS
reply (at most 1 MiB by default), and JSON may write one byte of output as six."""

LOG_KEEP_BYTES = 8 * 1024 * 1024
"""How much of each workload's output its node keeps: the last 8 MiB (whole 4 KiB blocks;
older bytes are dropped as it writes more, and offsets into the output stay as they were)."""

LOG_DIR_BYTES = 1024 * 1024 * 1024
"""How much workload output a node keeps in all: past it, the output of ended workloads is
removed, the longest-ended first (a running workload's is only ever trimmed)."""

LOG_KEEP_PERIOD_S = 2.0
"""How often a node agent trims and prunes the output it keeps."""

UP_POLICY = "berth"
"""The policy ``berth up``'s schedulers rank with: ``berth`` (layer bytes on the node first,
room priced by scarcity), what the demo shows pulling about 0.4× the seed ordering's bytes."""

API_STOP_GRACE_S = 10.0
"""The grace of an API stop or drain that names none: how long a stop waits for its node,
and each drained workload's grace (seconds)."""

MICROVM_STOP_GRACE_S = 5.0
"""How long a guest's workload gets after ``SIGTERM`` before QEMU is killed."""

NODE_GONE_AFTER_S = 300.0
"""How long the API keeps a workload ``unknown`` (its node unreachable and out of the
schedulers' view) before it declares the node gone and the workload ``lost`` — releasing its
identity and placing a restartable one again.  Kubernetes' pod eviction waits as long."""

ORPHAN_GRACE_S = 10.0
"""How long a process workload outlives its agent: when no live agent has owned the node's
state directory for this long, the workload's supervisor kills it (``[agent]
orphan_grace_s``, ``berth agent --orphan-grace``).  An agent that restarts within it adopts its
workloads."""

MAX_ORPHAN_GRACE_S = 3600.0
"""The longest orphan grace: an hour; a workload must not outlive its node unnoticed."""

RECONCILE_EVERY_S = 5.0
"""How often the reconciler compares the API's records with the nodes' reports
(``berth scheduler --reconcile-every``): a ghost is stopped, and a node's report acted on,
within two of these."""

RECONCILE_ASK_AT_ONCE = 256
"""How many questions to nodes a reconciler pass has in flight at once (their reports, the
status of each record it converges): ten thousand questions
sent together time out on the pass's own event loop (every answer waits behind all of them),
and a node that does not answer is taken for unreachable."""

RECONCILE_LEASE_TTL_S = 15.0
"""How long a reconciler's lease lasts unrenewed: the longest a dead reconciler keeps another
from taking over (it renews every third of it)."""

RECONCILE_PENDING_AFTER_S = 2 * RUN_TIMEOUT_S + 10.0
"""How old a ``pending`` record whose node does not run it must be before the reconciler asks
the node to run it again (same id: idempotent): by then its create's own attempts are over."""

IDEMPOTENCY_RETENTION_S = 24 * 3600.0
"""How long the API remembers a create's ``Idempotency-Key``: a repeat within it is answered
with the first attempt's workload, a key older than that is a new create."""

IDEMPOTENCY_ABANDONED_AFTER_S = 30.0
"""How long a create's key claim that names no recorded workload yet is respected: a repeat
meanwhile is ``409`` (in progress, retry); after it the first attempt is taken to have died
before recording anything, and a repeat takes the key over.  Longer than a create takes from
its claim to its record (the identity claim, then a placement of at most
:data:`SCHEDULE_TIMEOUT_S`)."""

RESTART_ATTEMPTS = 3
"""How many restarts a workload's restart policy allows within its interval, when it names
no number (``--restart-attempts``)."""

RESTART_INTERVAL_S = 600.0
"""The window a restart policy counts its attempts in: a workload restarted ``attempts``
times within it is ``failed`` (restarts exhausted) at its next end (``--restart-interval``)."""

RESTART_DELAY_S = 1.0
"""The first restart's delay; each next one doubles it, up to the maximum
(``--restart-delay``)."""

RESTART_MAX_DELAY_S = 60.0
"""The longest delay between two restarts of a workload (``--restart-max-delay``)."""
