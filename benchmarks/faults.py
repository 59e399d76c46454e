"""The fault run of issues 20 and 21 as a reproducible figure: workers use the API while a
seeded injector kills, pauses and restarts the cluster's processes — agents, schedulers, API
endpoints, nats-servers — and the host is watched.

What it runs: a local cluster as ``berth up`` builds it (:class:`berth.processes.up.LocalCluster`:
``--nats-servers`` nats-servers — 3 by default, clustered, every bucket R3; 1 is issue 20's
setting —, 4 agent processes with the process runtime and small memory budgets of 1 to 1.5
GiB, 2 schedulers, each serving the HTTP API on its own port, 1 s heartbeat), then ``--workers``
threads creating and stopping ``sleep`` workloads through the API on 127.0.0.1 (names from a
small shared pool, so identity claims are contended), and one fault per cycle — each cycle
starting once every API endpoint answers ``/healthz`` — chosen by a seeded schedule from:

* ``agent_kill`` — ``kill -9`` of an agent process, started again after 1 s on the same state
  directory (it adopts its workloads from its journal);
* ``agent_kill_long`` — the same, started again only after its workloads' orphan grace
  (``ORPHAN_GRACE_S`` + 2 s): their supervisors have killed them, and the records must end;
* ``agent_pause`` — ``SIGSTOP`` of an agent for twice its heartbeat grace (3 heartbeats), then
  ``SIGCONT``;
* ``scheduler_kill_api`` — ``kill -9`` of the scheduler serving the API endpoint the workers
  use now (the one most of them last had an answer from: creates in flight; they fail over
  to the other endpoint), started again after 0.5 s; ``scheduler_kill_other`` — the same for
  the other scheduler;
* ``nats_restart`` — one nats-server stopped (``SIGTERM``) and started again on the same port
  and store: with one server, the only one (nothing places meanwhile); with a cluster, one of
  them chosen by the seed (a rolling restart's step);
* ``nats_server_kill`` (only with 3 or more servers) — ``kill -9`` of one nats-server, started
  again on its port and store after ``NATS_DEAD_S`` (3 s).  Two times in three (seeded) it is
  the one leading the routes stream or the API's bucket (``KV_berth_routes``, ``KV_berth_api``,
  found with ``stream_info(…).cluster.leader``) — the hard case: that stream has no leader
  until its two others elect one — otherwise any server; the fault's detail says which
  streams the killed server led.

**The workers fail over** between the API endpoints (every scheduler's, ``up.api_urls``) as
:class:`berth.api.client.ApiClient` does: a request goes to the endpoint that answered last; one
that refuses the connection (nothing was sent) is skipped for the next, whatever the method;
a read is also asked of the next after a timeout, a dropped connection or a ``503``; a change
(``POST``) sent and never answered is not sent again — its outcome is **unknown**
(``create_unknown``, ``stop_unknown``: it may have been done), counted as such, never as
failed (no ``Idempotency-Key`` is relied on).  ``create_unreachable``/``stop_unreachable``:
no endpoint took the connection — certainly not done.

**The pause**: ``pause_s`` is, per fault, the time from the fault's start to the first ``201``
answer (a placement made, booted and recorded) to a create *sent after it* — how long
placements stop.  The workers go on after the fault's window until that
has happened (at most ``PAUSE_LIMIT_S`` from the fault's start; a fault without one counts in
``pause_unmeasured``).  Killing the server that leads the API's bucket pauses creates until
its successor is elected — nats-server 2.15 does so 4-9 s after its leader died (its Raft
election timeouts, not a setting) — and no longer: the API's reads and writes are asked
again every second (:mod:`berth.registry.nats`), where each once waited out JetStream's 5 s
timeout (pauses of 5 or 10 s).  Any other fault, or another server, pauses them for well
under a second (an ``agent_pause`` up to a few seconds: placements tried on the stopped node
wait for it).

What it observes is the host and the views, never what the processes say of themselves alone:

* **the host** (``psutil``): every workload supervisor (``python3 -I …/supervisor.py ID``)
  whose files are in this cluster's state directories, the node those files are under, its
  live descendants (the ``sleep``), their RSS, the reserved memory of each — the
  ``RLIMIT_AS`` the supervisor put on it, which is the workload's ``spec.mem`` — and whose
  copy it is (the namespace/name/replica the workers put in its environment, so a ghost,
  which no record names, still says);
* **the nodes' snapshots** and **the API's records** (``GET /v1/nodes``, ``GET /v1/workloads``,
  ``GET /v1/workloads/{id}``), read with the same failover.

Invariants, each violation counted once per subject (node or workload) per fault cycle:

* ``over_commit`` — at any sample, the reserved memory running on a node's supervisors exceeds
  the node's ``mem_max`` (the hard budget);
* ``duplicate_identity`` — at any sample, two workloads of one namespace/name/replica run;
* after the settle time (workers quiet, ``--settle`` seconds from the fault's end):
  ``unrecorded_running`` — a workload runs whose id no API record names;
  ``running_marked_ended`` — a workload runs whose record says it ended;
  ``leaked_reservation`` — a node's snapshot reserves more memory than its running workloads;
  ``lost_create`` — a create the API acknowledged (``201``, in any cycle so far) has no record
  any more (``404``): nothing acknowledged may be lost;
  ``lost_stop`` — a workload whose stop the API acknowledged (``200``, or ``202``: kept for
  its node) still runs, its record live.

Convergence: after each fault ends (the process restarted, resumed), the workers are stopped
and the views are polled until every invariant holds *and* they agree — every running
workload recorded ``running`` on its node, every ``running``/``pending``/``unknown`` record
running on the host, every node's snapshot present with ``mem_reserved`` equal to what runs
on it, every acknowledged create recorded.  ``converge_s`` is the time from the fault's end
(and the workers' last answer) to that moment; a fault after which that never happens within
``--settle`` counts in ``not_converged``.  The leases' TTL is short (8 s, 4 s with
``--quick``) so that a lease a killed scheduler left behind expires within the settle time.

``--json`` prints one JSON line (``operations``, ``outcomes``, ``faults``, ``violations``,
``violations_total``, ``converge_s`` {``p50``, ``max``}, ``converge_s_by_fault``,
``not_converged``, how full the host got, ``load_average_1m``, the run's settings, and the
details of each violation and each fault that did not converge) — and, new with issue 21,
``nats_servers``, ``api_endpoints``, ``unknown_outcomes`` (changes sent and never answered),
``api_failovers`` (requests answered by another endpoint than the one asked first),
``pause_s`` {``p50``, ``max``}, ``pause_s_by_fault``, ``pause_unmeasured`` (by kind) and
``fault_detail`` (each cycle: what was done, its pause and convergence); ``violations`` gains
``lost_create`` and ``lost_stop``.  The exit status is 1 when any violation was seen.
``--quick`` is one fault of each kind with short windows (CI, about a minute).  Every
process this starts — the cluster's, and any workload supervisor found under its state
directory — is killed at the end, pass or fail, also on ^C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from berth.defaults import ORPHAN_GRACE_S, RECONCILE_EVERY_S
from berth.nats.cluster import MAX_SERVERS
from berth.nats.connection import connect
from berth.nats.names import API_BUCKET
from berth.nats.server import die_with_parent
from berth.nats.wire import node_token
from berth.node.runtime.supervisor import WORKLOADS_DIR, file_stem
from berth.processes.up import LocalCluster
from berth.registry.port import ENDED_STATES
from berth.store.nats import bucket_ttl_s
from berth.units import MiB

HEARTBEAT_S = 1.0
GRACE_S = bucket_ttl_s(HEARTBEAT_S)
"""How long a node's snapshot lives without a heartbeat (the store's grace)."""
BUDGETS_MIB = (1024, 1280, 1536, 1024)
"""Each agent's ``mem_max``: small, so a few workloads fill a node."""
WORKLOAD_MIB = (256, 512)
NAMES = 24
"""The shared pool of workload names the workers create."""
FAULTS = (
    "agent_kill",
    "agent_pause",
    "scheduler_kill_api",
    "scheduler_kill_other",
    "nats_restart",
    "agent_kill_long",
)
CLUSTER_FAULTS = ("nats_server_kill",)
"""The faults that need a cluster of (at least 3) nats-servers: one may die."""
NATS_SERVERS = 3
"""The default ``--nats-servers``: a cluster, so ``nats_server_kill`` is in every run (CI's
``--quick`` too: about 20 s more than on one server)."""
NATS_DEAD_S = 3.0
"""How long ``nats_server_kill`` keeps a nats-server dead."""
PAUSE_LIMIT_S = 30.0
"""The longest the workers go on after a fault's window for its pause to be measured."""
VIEW_TIMEOUT_S = 5.0
"""The timeout of the views' reads."""
WORKER_TIMEOUT_S = 10.0
"""The workers' timeout: a create places (``SCHEDULE_TIMEOUT_S``, 10 s, at most) and boots a
``sleep``; one unanswered in this long counts as unknown."""
AGENT_GONE_S = ORPHAN_GRACE_S + 2.0
"""How long ``agent_kill_long`` keeps an agent dead: past its workloads' orphan grace."""
SAMPLE_S = 0.25
IDENTITY_ENV = "FAULTS_IDENTITY"
"""Each workload's namespace/name/replica in its environment: the host says whose copy runs
(its record may say nothing, for a ghost)."""


@dataclass
class Settings:
    seed: int
    faults: int
    workers: int
    window_s: float
    settle_s: float
    lease_ttl_s: float
    nats_servers: int = 1  # the command line's default is NATS_SERVERS; 1 starts faster


def fault_kinds(nats_servers: int) -> tuple[str, ...]:
    """The faults a run with ``nats_servers`` servers draws from."""
    return FAULTS + (CLUSTER_FAULTS if nats_servers >= 3 else ())


class Unreachable(httpx.TransportError):
    """No endpoint took the connection: nothing was sent, so nothing was done."""


class OutcomeUnknown(httpx.TransportError):
    """A change was sent and never answered (the connection dropped, the answer did not come
    in time): it may have been done."""


UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""The errors of a request that never left: any method may go to the next endpoint."""


class Endpoints:
    """The API's endpoints with failover, by the rules of :class:`berth.api.client.ApiClient`
    (see the module docstring) but keeping each answer's status, which the tally counts by.
    ``transport`` is httpx's port (tests pass a ``MockTransport``)."""

    def __init__(
        self,
        urls: Sequence[str],
        token: str | None,
        *,
        timeout_s: float,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.urls = list(urls)
        self.clients = [
            httpx.Client(base_url=url, headers=headers, timeout=timeout_s, transport=transport)
            for url in self.urls
        ]
        self.current = 0
        """The endpoint that answered last (an index into ``urls``): asked first."""
        self.failovers = 0
        """Requests answered by another endpoint than the one asked first."""

    def __enter__(self) -> Endpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)

    def post(self, path: str, json: Any = None) -> httpx.Response:
        return self.request("POST", path, json)

    def request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """The first answer of an endpoint, starting with the one that answered last;
        :class:`Unreachable` when none took the connection, :class:`OutcomeUnknown` for a
        change sent and not answered, a read's last error when no endpoint answered it."""
        last: httpx.HTTPError | None = None
        busy: httpx.Response | None = None  # a read's 503, answered if nothing better comes
        count = len(self.clients)
        for step in range(count):
            index = (self.current + step) % count
            try:
                answer = self.clients[index].request(method, path, json=body)
            except UNSENT as error:
                last = error
                continue
            except httpx.HTTPError as error:
                if method == "GET":
                    last = error
                    continue
                raise OutcomeUnknown(
                    f"{method} {self.urls[index]}{path}: {type(error).__name__}"
                ) from error
            if answer.status_code == 503 and method == "GET" and step < count - 1:
                busy = busy or answer
                continue
            self.failovers += index != self.current
            self.current = index
            return answer
        if busy is not None:
            return busy
        if last is None or isinstance(last, UNSENT):
            raise Unreachable(f"{method} {path}: no endpoint of {self.urls} took the connection")
        raise last


@dataclass
class HostWorkload:
    """One workload running on the host, as ``psutil`` sees it."""

    workload_id: str
    node: str
    identity: str
    reserved: int
    rss: int


@dataclass
class Tally:
    operations: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    seen: set[tuple[int, str, str]] = field(default_factory=set)
    examples: list[str] = field(default_factory=list)
    converge_s: list[float] = field(default_factory=list)
    converge_by_fault: dict[str, list[float]] = field(default_factory=dict)
    not_converged: list[str] = field(default_factory=list)
    fault_started: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Each cycle's fault: its kind and when it started (``time.monotonic``)."""
    pause_s: dict[int, float] = field(default_factory=dict)
    """Each cycle's pause: from its fault's start to the first ``201`` of a create sent after."""
    fault_detail: list[str] = field(default_factory=list)
    acknowledged: dict[str, int] = field(default_factory=dict)
    """Every create answered ``201``: its record's id, and in which cycle."""
    stopped: dict[str, str] = field(default_factory=dict)
    """Every acknowledged stop (``200``, ``202``): the node's workload id, the record's id."""
    rss_peak: int = 0
    running_peak: int = 0
    fill_peak: float = 0.0
    in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def violation(self, cycle: int, kind: str, subject: str, detail: str) -> None:
        with self.lock:
            if (cycle, kind, subject) in self.seen:
                return
            self.seen.add((cycle, kind, subject))
            self.violations[kind] += 1
            self.examples.append(f"cycle {cycle}: {kind} {subject}: {detail}")

    def created(self, record_id: str, cycle: int, sent_at: float, answered_at: float) -> None:
        """A create answered ``201``: acknowledged, and the end of its cycle's pause if it
        was the first sent after the fault's start."""
        with self.lock:
            self.acknowledged[record_id] = cycle
            fault = self.fault_started.get(cycle)
            if fault is not None and cycle not in self.pause_s and sent_at >= fault[1]:
                self.pause_s[cycle] = answered_at - fault[1]


def address_space_limit(pid: int) -> int:
    """The ``RLIMIT_AS`` of process ``pid``, from ``/proc/<pid>/limits`` (world-readable;
    ``prlimit`` on a workload running as another user, ``nobody``, needs a privilege this
    host's root may lack); ``RLIM_INFINITY`` when unlimited."""
    try:
        with open(f"/proc/{pid}/limits") as limits:
            for line in limits:
                if line.startswith("Max address space"):
                    soft = line.split()[3]
                    return resource.RLIM_INFINITY if soft == "unlimited" else int(soft)
    except FileNotFoundError:
        raise psutil.NoSuchProcess(pid) from None
    return resource.RLIM_INFINITY


class Harness:
    """The cluster, its observers and its fault injector (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.up = LocalCluster(
            len(BUDGETS_MIB),
            schedulers=2,
            heartbeat_s=HEARTBEAT_S,
            http=("127.0.0.1", 0),
            lease_ttl_s=settings.lease_ttl_s,
            nats_servers=settings.nats_servers,
        )
        self.kinds = fault_kinds(settings.nats_servers)
        self.up.configs = [
            config.model_copy(
                update={"budget": config.budget.model_copy(update={"mem_max": mib * MiB})}
            )
            for config, mib in zip(self.up.configs, BUDGETS_MIB, strict=True)
        ]
        self.mem_max = {c.node.name: c.budget.mem_max for c in self.up.configs}
        self.state_dirs = {
            name: self.up.directory / "state" / node_token(name) / WORKLOADS_DIR
            for name in self.mem_max
        }
        self.tally = Tally()
        self.cycle = 0
        self.quiet = threading.Event()
        self.done = threading.Event()
        self.supervisors: dict[int, float] = {}  # pid -> create_time, every one ever seen
        self.restarts = 0
        self.clients: list[Endpoints] = []
        """The workers' clients (which endpoint each uses now: ``scheduler_kill_api``'s)."""

    # -- the host ---------------------------------------------------------------------------
    def _node_of(self, workload_id: str) -> str | None:
        stem = file_stem(workload_id)
        for node, directory in self.state_dirs.items():
            if (directory / f"{stem}.run").exists() or (directory / f"{stem}.json").exists():
                return node
        return None

    def host(self) -> list[HostWorkload]:
        """Every workload of this cluster running on the host now."""
        found = []
        for process in psutil.process_iter(["pid", "cmdline", "create_time"]):
            cmdline = process.info["cmdline"] or []
            if len(cmdline) < 4 or cmdline[1] != "-I" or not cmdline[2].endswith("supervisor.py"):
                continue
            workload_id = cmdline[3]
            node = self._node_of(workload_id)
            if node is None:
                continue  # not this cluster's (another run's, or gone from its directory)
            self.supervisors[process.pid] = process.info["create_time"]
            try:
                children = [c for c in process.children(recursive=True) if c.status() != "zombie"]
                if not children:
                    continue
                reserved = max(address_space_limit(c.pid) for c in children)
                identity = children[0].environ().get(IDENTITY_ENV, f"?{workload_id}")
                rss = process.memory_info().rss + sum(c.memory_info().rss for c in children)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            found.append(HostWorkload(workload_id, node, identity, reserved, rss))
        return found

    def hard_checks(self, running: list[HostWorkload]) -> None:
        """The invariants that hold at every moment: the budget, one copy per identity."""
        per_node: Counter[str] = Counter()
        for workload in running:
            per_node[workload.node] += workload.reserved
        for node, reserved in per_node.items():
            budget = self.mem_max[node]
            with self.tally.lock:
                self.tally.fill_peak = max(self.tally.fill_peak, reserved / budget)
            if reserved > budget:
                self.tally.violation(
                    self.cycle,
                    "over_commit",
                    node,
                    f"{reserved // MiB} MiB reserved running, mem_max {budget // MiB} MiB",
                )
        copies: dict[str, list[str]] = {}
        for workload in running:
            copies.setdefault(workload.identity, []).append(workload.workload_id)
        for identity, ids in copies.items():
            if len(ids) > 1:
                self.tally.violation(
                    self.cycle, "duplicate_identity", identity, f"running as {sorted(ids)}"
                )
        with self.tally.lock:
            self.tally.rss_peak = max(self.tally.rss_peak, sum(w.rss for w in running))
            self.tally.running_peak = max(self.tally.running_peak, len(running))

    def watch(self) -> None:
        """The sampler thread: the hard invariants, every ``SAMPLE_S``."""
        while not self.done.wait(SAMPLE_S):
            with contextlib.suppress(Exception):  # a racing scan is skipped, not fatal
                self.hard_checks(self.host())

    # -- the views --------------------------------------------------------------------------
    def api(self, timeout_s: float = VIEW_TIMEOUT_S) -> Endpoints:
        """A client of every API endpoint, with failover (:class:`Endpoints`)."""
        assert self.up.api_urls
        return Endpoints(self.up.api_urls, self.up.api_token, timeout_s=timeout_s)

    def views(self, api: Endpoints) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        """The API's live records and its nodes' snapshots (``None``: it does not answer)."""
        try:
            records = api.get("/v1/workloads").json()["items"]
            nodes = {item["name"]: item for item in api.get("/v1/nodes").json()["items"]}
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        return records, nodes

    def agreement(self, api: Endpoints, *, final: bool) -> list[str]:
        """One look at the host and the views: what keeps them from agreeing (empty:
        converged)."""
        running = self.host()
        self.hard_checks(running)
        views = self.views(api)
        if views is None:
            return ["the API does not answer"]

        def lookup(workload_id: str) -> dict[str, Any] | None:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                answer = api.get(f"/v1/workloads/{workload_id}")
                if answer.status_code == 200:
                    record: dict[str, Any] = answer.json()
                    return record
            return None

        records = views[0]
        listed = {record["id"] for record in records}
        with self.tally.lock:
            unlisted = [key for key in self.tally.acknowledged if key not in listed]
        gone = []
        for record_id in unlisted:  # a definite 404, not a read that failed
            with contextlib.suppress(httpx.HTTPError):
                if api.get(f"/v1/workloads/{record_id}").status_code == 404:
                    gone.append(record_id)
        return self.disagreements(running, *views, lookup, final=final, gone=gone)

    def disagreements(
        self,
        running: list[HostWorkload],
        records: list[dict[str, Any]],
        nodes: dict[str, Any],
        lookup: Callable[[str], dict[str, Any] | None],
        *,
        final: bool,
        gone: Collection[str] = (),
    ) -> list[str]:
        """What keeps the host (``running``), the API's records (``records``, ``lookup`` for
        one not listed; ``gone``: acknowledged creates whose record the API does not know)
        and the nodes' snapshots from agreeing; with ``final`` (the settle time is over), the
        settle-time invariants' violations among them are counted."""
        by_node_id = {r["node_workload_id"]: r for r in records}
        problems = []
        for workload in running:
            record = by_node_id.get(workload.workload_id) or lookup(workload.workload_id)
            kind = ""
            if record is None:
                kind = "unrecorded_running"
            elif record["state"] in ENDED_STATES:
                kind = "running_marked_ended"
            elif workload.workload_id in self.tally.stopped:
                kind = "lost_stop"
            if kind:
                state = "no record" if record is None else f"recorded {record['state']}"
                if kind == "lost_stop":
                    state += ", its stop acknowledged"
                problems.append(f"{kind} {workload.workload_id} on {workload.node}")
                if final:
                    self.tally.violation(
                        self.cycle,
                        kind,
                        workload.workload_id,
                        f"runs on {workload.node}, {state}",
                    )
                continue
            assert record is not None
            if record["state"] != "running" or record["node"] != workload.node:
                shown = (record["state"], record["node"])
                problems.append(f"{workload.workload_id} runs on {workload.node}, record {shown}")
        host_ids = {w.workload_id for w in running}
        for record in records:
            if record["state"] in ("running", "pending", "unknown") and (
                record["node_workload_id"] not in host_ids
            ):
                problems.append(f"record {record['id']} {record['state']} runs nowhere")
        for record_id in gone:
            cycle = self.tally.acknowledged.get(record_id)
            problems.append(f"lost_create {record_id}: acknowledged, no record")
            if final:
                self.tally.violation(
                    self.cycle,
                    "lost_create",
                    record_id,
                    f"answered 201 in cycle {cycle}, the API now answers 404",
                )
        reserved: Counter[str] = Counter()
        for workload in running:
            reserved[workload.node] += workload.reserved
        for node in self.mem_max:
            if node not in nodes:
                problems.append(f"{node} missing from the API's nodes")
                continue
            snapshot = nodes[node]["mem_reserved"]
            if snapshot != reserved[node]:
                problems.append(
                    f"{node} reserves {snapshot // MiB} MiB, runs {reserved[node] // MiB} MiB"
                )
                if final and snapshot > reserved[node]:
                    self.tally.violation(
                        self.cycle,
                        "leaked_reservation",
                        node,
                        f"snapshot {snapshot // MiB} MiB, running {reserved[node] // MiB} MiB",
                    )
        return problems

    # -- the workers ------------------------------------------------------------------------
    def worker(self, index: int) -> None:
        rng = random.Random(self.settings.seed * 1000 + index)
        mine: list[str] = []
        with self.api(WORKER_TIMEOUT_S) as api:
            with self.tally.lock:
                self.clients.append(api)
            while not self.done.is_set():
                with self.tally.lock:  # the same lock as quiet's setting: none slips past it
                    go = not self.quiet.is_set()
                    self.tally.in_flight += go
                    cycle = self.cycle
                if not go:
                    time.sleep(0.05)
                    continue
                if mine and rng.random() < 0.4:
                    outcome = self.stop(api, mine.pop(rng.randrange(len(mine))))
                else:
                    outcome = self.create(api, rng, mine, cycle)
                with self.tally.lock:
                    self.tally.operations[outcome] += 1
                    self.tally.in_flight -= 1

    def create(self, api: Endpoints, rng: random.Random, mine: list[str], cycle: int) -> str:
        """One create of a name from the pool; its outcome (``create_201``, …)."""
        name = f"svc-{rng.randrange(NAMES)}"
        body = {
            "name": name,
            "spec": {
                "vcpus": 0.05,
                "mem": f"{rng.choice(WORKLOAD_MIB)}MiB",
                "disk": "64MiB",
                "disk_bw": "1MiBps",
                "net_bw": "1MiBps",
            },
            "command": ["sleep", "600"],
            "env": {IDENTITY_ENV: f"default/{name}/0"},
        }
        sent_at = time.monotonic()
        try:
            answer = api.post("/v1/workloads", json=body)
            outcome = f"create_{answer.status_code}"
            if answer.status_code == 409:  # no_capacity or identity_taken
                problem = str(answer.json().get("type", ""))
                outcome += "_" + problem.rsplit("/", 1)[-1]
            if answer.status_code == 201:
                record_id = answer.json()["id"]
                mine.append(record_id)
                self.tally.created(record_id, cycle, sent_at, time.monotonic())
        except httpx.HTTPError as error:
            outcome = self.failed("create", error)
        except (ValueError, KeyError, TypeError, AttributeError):  # an answer not as documented
            outcome += "_unreadable"
        return outcome

    def stop(self, api: Endpoints, record_id: str) -> str:
        """One stop of a workload this worker created; its outcome (``stop_200``, …)."""
        try:
            answer = api.post(f"/v1/workloads/{record_id}/stop", json={"grace_s": 0.5})
            outcome = f"stop_{answer.status_code}"
            if answer.status_code in (200, 202):
                with self.tally.lock:
                    self.tally.stopped[answer.json()["node_workload_id"]] = record_id
        except httpx.HTTPError as error:
            outcome = self.failed("stop", error)
        except (ValueError, KeyError, TypeError, AttributeError):
            outcome += "_unreadable"
        return outcome

    @staticmethod
    def failed(operation: str, error: httpx.HTTPError) -> str:
        """A request without an answer: ``unknown`` when it was sent (it may have been done),
        ``unreachable`` when no endpoint took it; a pause before the next."""
        time.sleep(0.1)
        if isinstance(error, OutcomeUnknown):
            return f"{operation}_unknown"
        if isinstance(error, Unreachable):
            return f"{operation}_unreachable"
        return f"{operation}_error_{type(error).__name__}"

    # -- the faults -------------------------------------------------------------------------
    def _respawn(self, group: list[subprocess.Popen[bytes]], index: int) -> None:
        self.restarts += 1
        old = group[index]
        log = self.up.directory / "logs" / f"restart-{self.restarts:03d}.log"
        with open(log, "ab") as out:
            group[index] = subprocess.Popen(
                old.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )

    def inject(self, kind: str) -> str:
        """Inject one fault and end it (restart, resume); what was done, in words."""
        if kind in ("agent_kill", "agent_kill_long"):
            index = self.rng.randrange(len(self.up.agent_processes))
            self.up.agent_processes[index].kill()
            self.up.agent_processes[index].wait()
            dead_s = 1.0 if kind == "agent_kill" else AGENT_GONE_S
            time.sleep(dead_s)
            self._respawn(self.up.agent_processes, index)
            return f"kill -9 agent {index}, restarted after {dead_s:g} s"
        if kind == "agent_pause":
            index = self.rng.randrange(len(self.up.agent_processes))
            process = self.up.agent_processes[index]
            process.send_signal(signal.SIGSTOP)
            try:
                time.sleep(2 * GRACE_S)
            finally:
                process.send_signal(signal.SIGCONT)
            return f"SIGSTOP agent {index} for {2 * GRACE_S:g} s"
        if kind.startswith("scheduler_kill"):
            with self.tally.lock:
                used = Counter(client.current for client in self.clients).most_common(1)
            in_use = used[0][0] if used else 0
            count = len(self.up.scheduler_processes)
            index = in_use if kind.endswith("api") else (in_use + 1) % count
            self.up.scheduler_processes[index].kill()
            self.up.scheduler_processes[index].wait()
            time.sleep(0.5)
            self._respawn(self.up.scheduler_processes, index)
            serving = "the workers' API endpoint" if index == in_use else "another endpoint"
            return f"kill -9 scheduler {index} (serving {serving}), restarted after 0.5 s"
        if kind == "nats_server_kill":
            return self.kill_nats_server()
        assert kind == "nats_restart"
        if self.up.nats_cluster is None:
            assert self.up.server is not None
            self.up.server.restart()
            return "nats-server restarted"
        index = self.rng.randrange(self.up.nats_cluster.size)
        self.up.nats_cluster.restart(index)
        return f"nats-server {index} restarted (SIGTERM; same port and store)"

    def kill_nats_server(self) -> str:
        """``kill -9`` of one nats-server — two times in three the leader of the routes stream
        or of the API's bucket — then started again on its port and store."""
        cluster = self.up.nats_cluster
        assert cluster is not None
        aim = self.rng.choice(("routes", "api", "any"))
        index = self.rng.randrange(cluster.size)  # drawn always: the schedule stays seeded
        streams = {"routes": f"KV_{self.up.names.routes_bucket}", "api": f"KV_{API_BUCKET}"}
        leaders = self.stream_leaders(list(streams.values()))
        aimed_at = leaders.get(streams.get(aim, ""))
        if aimed_at is not None:
            index = aimed_at
        led = sorted(stream for stream, leader in leaders.items() if leader == index)
        cluster.kill(index)
        time.sleep(NATS_DEAD_S)
        cluster.restart(index)
        aimed = "any server" if aim == "any" else f"{streams[aim]}'s leader"
        if aim != "any" and aimed_at is None:
            aimed += " (not known: any server)"
        return (
            f"kill -9 nats-server {index} (aimed at {aimed}; it led "
            f"{', '.join(led) or 'neither stream'}), restarted after {NATS_DEAD_S:g} s"
        )

    def stream_leaders(self, streams: list[str]) -> dict[str, int | None]:
        """Which server leads each stream now (``None``: not known — no leader, no answer)."""
        cluster = self.up.nats_cluster
        assert cluster is not None
        names = [cluster.server_name(index) for index in range(cluster.size)]
        creds = None if self.up.auth is None else self.up.auth.scheduler

        async def ask() -> dict[str, int | None]:
            client = await connect(self.up.url, name="faults-leaders", credentials=creds)
            found: dict[str, int | None] = {}
            try:
                for stream in streams:
                    found[stream] = None
                    with contextlib.suppress(Exception):
                        info = await client.jetstream().stream_info(stream)
                        leader = None if info.cluster is None else info.cluster.leader
                        found[stream] = names.index(leader) if leader in names else None
            finally:
                await client.close()
            return found

        try:
            return asyncio.run(asyncio.wait_for(ask(), 10.0))
        except Exception:
            return dict.fromkeys(streams)

    def schedule(self) -> list[str]:
        if self.settings.faults <= len(self.kinds):
            kinds = list(self.kinds[: self.settings.faults])
            self.rng.shuffle(kinds)
            return kinds
        return [self.rng.choice(self.kinds) for _ in range(self.settings.faults)]

    def converged(self, kind: str, seconds: float) -> None:
        self.tally.converge_s.append(seconds)
        self.tally.converge_by_fault.setdefault(kind, []).append(seconds)

    def converge(
        self, api: Endpoints, kind: str, ended_at: float, what: str, extra_s: float = 0.0
    ) -> float | None:
        """Poll until the views agree; the clock starts when the fault has ended and the
        workers' last operation has been answered; the settle time is ``--settle`` from the
        fault's end (plus ``extra_s``, the time the workers went on for the pause).  How long
        it took (``None``: it did not converge)."""
        deadline = ended_at + extra_s + self.settings.settle_s
        while self.tally.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        ended_at = max(ended_at, time.monotonic())
        problems: list[str] = []
        while time.monotonic() < deadline:
            problems = self.agreement(api, final=False)
            if not problems:
                self.converged(kind, time.monotonic() - ended_at)
                return time.monotonic() - ended_at
            time.sleep(SAMPLE_S)
        problems = self.agreement(api, final=True)
        if problems:
            self.tally.not_converged.append(f"cycle {self.cycle} ({what}): {problems[:4]}")
            return None
        self.converged(kind, time.monotonic() - ended_at)
        return time.monotonic() - ended_at

    def await_endpoints(self) -> None:
        """Wait (at most ``--settle``) until every API endpoint answers ``/healthz``: each
        fault starts from a cluster whose restarted processes are all back, so killing the
        endpoint in use leaves another to fail over to."""
        deadline = time.monotonic() + self.settings.settle_s
        with httpx.Client(timeout=1.0) as http:
            for url in self.up.api_urls:
                while time.monotonic() < deadline:
                    with contextlib.suppress(httpx.HTTPError):
                        if http.get(f"{url}/healthz").status_code == 200:
                            break
                    time.sleep(0.05)

    def await_pause(self, started_at: float) -> float:
        """Let the workers go on until a create sent after the fault's start has been
        answered ``201`` (at most ``PAUSE_LIMIT_S`` from the start); how long it waited."""
        began = time.monotonic()
        while self.cycle not in self.tally.pause_s and (
            time.monotonic() < started_at + PAUSE_LIMIT_S
        ):
            time.sleep(0.05)
        return time.monotonic() - began

    def said(self, kind: str, what: str, fault_s: float, converged_s: float | None) -> str:
        """One line of ``fault_detail``: the cycle, what was done, its pause, convergence."""
        pause = self.tally.pause_s.get(self.cycle)
        shown = f"{pause:.2f} s" if pause is not None else f"none within {PAUSE_LIMIT_S:g} s"
        settled = f"{converged_s:.2f} s" if converged_s is not None else "not converged"
        return (
            f"cycle {self.cycle} {kind}: {what} (fault {fault_s:.1f} s); pause {shown}; "
            f"converged {settled}"
        )

    def run(self) -> None:
        self.up.start()
        threads = [threading.Thread(target=self.watch, daemon=True)]
        threads += [
            threading.Thread(target=self.worker, args=(i,), daemon=True)
            for i in range(self.settings.workers)
        ]
        for thread in threads:
            thread.start()
        try:
            with self.api() as api:
                for kind in self.schedule():
                    self.await_endpoints()
                    self.cycle += 1
                    self.quiet.clear()
                    window = self.settings.window_s
                    time.sleep(self.rng.uniform(0.3, 0.7) * window)  # creates in flight
                    started_at = time.monotonic()
                    with self.tally.lock:
                        self.tally.fault_started[self.cycle] = (kind, started_at)
                    what = self.inject(kind)
                    self.tally.faults[kind] += 1
                    ended_at = time.monotonic()
                    time.sleep(self.rng.uniform(0.3, 0.7) * window)
                    extra_s = self.await_pause(started_at)
                    with self.tally.lock:
                        self.quiet.set()
                    took = self.converge(api, kind, ended_at, what, extra_s)
                    self.tally.fault_detail.append(
                        self.said(kind, what, ended_at - started_at, took)
                    )
        finally:
            self.done.set()
            for thread in threads:
                thread.join(10.0)

    def close(self) -> None:
        """Stop the cluster and every supervisor of it still alive, whatever happened."""
        for process in self.up.agent_processes:
            with contextlib.suppress(OSError):
                process.send_signal(signal.SIGCONT)
        with contextlib.suppress(Exception):
            self.host()  # the last supervisors, before their files go with the directory
        self.up.stop()
        for pid, created in self.supervisors.items():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                supervisor = psutil.Process(pid)
                if supervisor.create_time() != created:
                    continue  # a recycled pid: not ours
                for child in supervisor.children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
                supervisor.kill()


def percentiles(times: list[float]) -> dict[str, float | None]:
    """``p50`` and ``max`` of ``times`` (``None`` for none), rounded to 10 ms."""
    if not times:
        return {"p50": None, "max": None}
    return {"p50": round(statistics.median(times), 2), "max": round(max(times), 2)}


def pauses(tally: Tally) -> tuple[list[float], dict[str, list[float]], Counter[str]]:
    """Every measured pause, the pauses by fault kind, and the faults without one by kind."""
    every: list[float] = []
    by_fault: dict[str, list[float]] = {}
    unmeasured: Counter[str] = Counter()
    for cycle, (kind, _) in sorted(tally.fault_started.items()):
        pause = tally.pause_s.get(cycle)
        if pause is None:
            unmeasured[kind] += 1
            continue
        every.append(pause)
        by_fault.setdefault(kind, []).append(pause)
    return every, by_fault, unmeasured


def result(harness: Harness, elapsed_s: float) -> dict[str, Any]:
    tally = harness.tally
    converge = sorted(tally.converge_s)
    every_pause, pause_by_fault, unmeasured = pauses(tally)
    return {
        "benchmark": "faults",
        "seed": harness.settings.seed,
        "workers": harness.settings.workers,
        "settle_s": harness.settings.settle_s,
        "lease_ttl_s": harness.settings.lease_ttl_s,
        "nats_servers": harness.settings.nats_servers,
        "api_endpoints": len(harness.up.api_urls),
        "operations": sum(tally.operations.values()),
        "outcomes": dict(sorted(tally.operations.items())),
        "unknown_outcomes": sum(
            count for outcome, count in tally.operations.items() if outcome.endswith("_unknown")
        ),
        "api_failovers": sum(client.failovers for client in harness.clients),
        "faults": dict(sorted(tally.faults.items())),
        "violations": {kind: tally.violations.get(kind, 0) for kind in VIOLATIONS},
        "violations_total": sum(tally.violations.values()),
        "converge_s": {
            "p50": round(statistics.median(converge), 2) if converge else None,
            "max": round(converge[-1], 2) if converge else None,
        },
        "converge_s_by_fault": {
            kind: {"p50": round(statistics.median(times), 2), "max": round(max(times), 2)}
            for kind, times in sorted(tally.converge_by_fault.items())
        },
        "pause_s": percentiles(every_pause),
        "pause_s_by_fault": {
            kind: percentiles(times) for kind, times in sorted(pause_by_fault.items())
        },
        "pause_unmeasured": dict(sorted(unmeasured.items())),
        "pause_limit_s": PAUSE_LIMIT_S,
        "converge_target_s": 2 * RECONCILE_EVERY_S,  # 2 reconciler periods
        "converge_within_target": bool(converge)
        and not tally.not_converged
        and converge[-1] <= 2 * RECONCILE_EVERY_S,
        "not_converged": len(tally.not_converged),
        "not_converged_detail": tally.not_converged,
        "violation_detail": tally.examples,
        "fault_detail": tally.fault_detail,
        "running_peak": tally.running_peak,
        "budget_fill_peak": round(tally.fill_peak, 3),
        "workload_rss_peak_mib": round(tally.rss_peak / MiB, 1),
        "elapsed_s": round(elapsed_s, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


VIOLATIONS = (
    "over_commit",
    "duplicate_identity",
    "unrecorded_running",
    "running_marked_ended",
    "leaked_reservation",
    "lost_create",
    "lost_stop",
)


def summary(found: dict[str, Any], harness: Harness) -> str:
    lines = [
        f"faults: seed {found['seed']}, {found['operations']} operations by "
        f"{found['workers']} workers in {found['elapsed_s']} s (load {found['load_average_1m']}), "
        f"{found['nats_servers']} nats-server(s), {found['api_endpoints']} API endpoints",
        f"  outcomes:   {found['outcomes']}",
        f"              {found['unknown_outcomes']} unknown (sent, never answered), "
        f"{found['api_failovers']} answered after a failover",
        f"  faults:     {found['faults']}",
        f"  host:       up to {found['running_peak']} workloads running, a node's budget up to "
        f"{found['budget_fill_peak']:.0%} reserved, {found['workload_rss_peak_mib']} MiB RSS",
        f"  violations: {found['violations_total']} {found['violations']}",
        f"  converged:  p50 {found['converge_s']['p50']} s, max {found['converge_s']['max']} s; "
        f"not within {found['settle_s']:g} s: {found['not_converged']}",
        f"  pause:      p50 {found['pause_s']['p50']} s, max {found['pause_s']['max']} s "
        f"{found['pause_s_by_fault']}; none within {PAUSE_LIMIT_S:g} s: "
        f"{found['pause_unmeasured']}",
    ]
    lines += [f"    {line}" for line in harness.tally.fault_detail]
    lines += [f"    {line}" for line in harness.tally.examples]
    lines += [f"    not converged, {line}" for line in harness.tally.not_converged]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="one JSON line")
    parser.add_argument("--quick", action="store_true", help="one fault of each kind (CI)")
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--faults", type=int, default=None, help="faults injected (default 15)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--settle", type=float, default=None, help="seconds (default 20; 8 quick)")
    parser.add_argument(
        "--nats-servers",
        type=int,
        choices=range(1, MAX_SERVERS + 1),
        default=NATS_SERVERS,
        metavar="N",
        help=f"nats-servers, clustered; from 3 with nats_server_kill (default {NATS_SERVERS})",
    )
    args = parser.parse_args(argv)
    settings = Settings(
        seed=args.seed,
        faults=args.faults or (len(fault_kinds(args.nats_servers)) if args.quick else 15),
        workers=args.workers,
        window_s=2.0 if args.quick else 5.0,
        settle_s=args.settle or (8.0 if args.quick else 20.0),
        lease_ttl_s=4.0 if args.quick else 8.0,
        nats_servers=args.nats_servers,
    )
    harness = Harness(settings)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    started = time.monotonic()
    try:
        harness.run()
    except KeyboardInterrupt:
        print("faults: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    finally:
        harness.close()
        signal.signal(signal.SIGTERM, previous)
    found = result(harness, time.monotonic() - started)
    print(json.dumps(found) if args.json else summary(found, harness))
    if args.json and (harness.tally.examples or harness.tally.not_converged):
        print(summary(found, harness), file=sys.stderr)
    return 1 if found["violations_total"] else 0


if __name__ == "__main__":
    sys.exit(main())
