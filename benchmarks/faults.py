"""The fault run of issue 20 as a reproducible figure: workers use the API while a seeded
injector kills, pauses and restarts the cluster's processes, and the host is watched.

What it runs: a local cluster as ``berth up`` builds it (:class:`berth.up.LocalCluster`: a
nats-server, 4 agent processes with the process runtime and small memory budgets of 1 to 1.5
GiB, 2 schedulers, the first serving the HTTP API, 1 s heartbeat), then ``--workers`` threads
creating and stopping ``sleep`` workloads through the API on 127.0.0.1 (names from a small
shared pool, so identity claims are contended), and one fault per cycle, chosen by a seeded
schedule from:

* ``agent_kill`` — ``kill -9`` of an agent process, started again after 1 s on the same state
  directory (it adopts its workloads from its journal);
* ``agent_kill_long`` — the same, started again only after its workloads' orphan grace
  (``ORPHAN_GRACE_S`` + 2 s): their supervisors have killed them, and the records must end;
* ``agent_pause`` — ``SIGSTOP`` of an agent for twice its heartbeat grace (3 heartbeats), then
  ``SIGCONT``;
* ``scheduler_kill_api`` / ``scheduler_kill_other`` — ``kill -9`` of the scheduler serving the
  API (creates in flight) or of the other one, started again after 0.5 s;
* ``nats_restart`` — the nats-server stopped and started on the same port and store.

What it observes is the host and the views, never what the processes say of themselves alone:

* **the host** (``psutil``): every workload supervisor (``python3 -I …/supervisor.py ID``)
  whose files are in this cluster's state directories, the node those files are under, its
  live descendants (the ``sleep``), their RSS, the reserved memory of each — the
  ``RLIMIT_AS`` the supervisor put on it, which is the workload's ``spec.mem`` — and whose
  copy it is (the namespace/name/replica the workers put in its environment, so a ghost,
  which no record names, still says);
* **the nodes' snapshots** and **the API's records** (``GET /v1/nodes``, ``GET /v1/workloads``,
  ``GET /v1/workloads/{id}``).

Invariants, each violation counted once per subject (node or workload) per fault cycle:

* ``over_commit`` — at any sample, the reserved memory running on a node's supervisors exceeds
  the node's ``mem_max`` (the hard budget);
* ``duplicate_identity`` — at any sample, two workloads of one namespace/name/replica run;
* after the settle time (workers quiet, ``--settle`` seconds from the fault's end):
  ``unrecorded_running`` — a workload runs whose id no API record names;
  ``running_marked_ended`` — a workload runs whose record says it ended;
  ``leaked_reservation`` — a node's snapshot reserves more memory than its running workloads.

Convergence: after each fault ends (the process restarted, resumed), the workers are stopped
and the views are polled until every invariant holds *and* they agree — every running
workload recorded ``running`` on its node, every ``running``/``pending``/``unknown`` record
running on the host, every node's snapshot present with ``mem_reserved`` equal to what runs
on it.  ``converge_s`` is the time from the fault's end (and the workers' last answer) to
that moment; a fault after which that never happens within ``--settle`` counts in
``not_converged``.  The leases' TTL is short (8 s, 4 s with ``--quick``) so that a lease a
killed scheduler left behind expires within the settle time.

``--json`` prints one JSON line (``operations``, ``outcomes``, ``faults``, ``violations``,
``violations_total``, ``converge_s`` {``p50``, ``max``}, ``converge_s_by_fault``,
``not_converged``, how full the host got, ``load_average_1m``, the run's settings, and the
details of each violation and each fault that did not converge); the exit status is 1 when
any violation was seen.  ``--quick`` is one fault of each kind with short windows (CI, under
a minute).  Every process this starts — the cluster's, and any workload supervisor found
under its state directory — is killed at the end, pass or fail, also on ^C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from berth.defaults import ORPHAN_GRACE_S, RECONCILE_EVERY_S
from berth.nats.server import die_with_parent
from berth.nats.wire import node_token
from berth.node.runtime.supervisor import WORKLOADS_DIR, file_stem
from berth.registry.port import ENDED_STATES
from berth.store.nats import bucket_ttl_s
from berth.units import MiB
from berth.up import LocalCluster

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
        )
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
                reserved = max(c.rlimit(psutil.RLIMIT_AS)[0] for c in children)
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
    def api(self) -> httpx.Client:
        assert self.up.api_url is not None
        headers = {"Authorization": f"Bearer {self.up.api_token}"}
        return httpx.Client(base_url=self.up.api_url, headers=headers, timeout=5.0)

    def views(self, api: httpx.Client) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        """The API's live records and its nodes' snapshots (``None``: it does not answer)."""
        try:
            records = api.get("/v1/workloads").json()["items"]
            nodes = {item["name"]: item for item in api.get("/v1/nodes").json()["items"]}
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        return records, nodes

    def agreement(self, api: httpx.Client, *, final: bool) -> list[str]:
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

        return self.disagreements(running, *views, lookup, final=final)

    def disagreements(
        self,
        running: list[HostWorkload],
        records: list[dict[str, Any]],
        nodes: dict[str, Any],
        lookup: Callable[[str], dict[str, Any] | None],
        *,
        final: bool,
    ) -> list[str]:
        """What keeps the host (``running``), the API's records (``records``, ``lookup`` for
        one not listed) and the nodes' snapshots from agreeing; with ``final`` (the settle time
        is over), the settle-time invariants' violations among them are counted."""
        by_node_id = {r["node_workload_id"]: r for r in records}
        problems = []
        for workload in running:
            record = by_node_id.get(workload.workload_id) or lookup(workload.workload_id)
            kind = ""
            if record is None:
                kind = "unrecorded_running"
            elif record["state"] in ENDED_STATES:
                kind = "running_marked_ended"
            if kind:
                state = "no record" if record is None else f"recorded {record['state']}"
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
        with self.api() as api:
            while not self.done.is_set():
                with self.tally.lock:  # the same lock as quiet's setting: none slips past it
                    go = not self.quiet.is_set()
                    self.tally.in_flight += go
                if not go:
                    time.sleep(0.05)
                    continue
                try:
                    if mine and rng.random() < 0.4:
                        workload_id = mine.pop(rng.randrange(len(mine)))
                        answer = api.post(
                            f"/v1/workloads/{workload_id}/stop", json={"grace_s": 0.5}
                        )
                        outcome = f"stop_{answer.status_code}"
                    else:
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
                        answer = api.post("/v1/workloads", json=body)
                        outcome = f"create_{answer.status_code}"
                        if answer.status_code == 409:  # no_capacity or identity_taken
                            problem = str(answer.json().get("type", ""))
                            outcome += "_" + problem.rsplit("/", 1)[-1]
                        if answer.status_code == 201:
                            mine.append(answer.json()["id"])
                except httpx.HTTPError as error:
                    outcome = f"error_{type(error).__name__}"
                    time.sleep(0.1)
                with self.tally.lock:
                    self.tally.operations[outcome] += 1
                    self.tally.in_flight -= 1

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
            index = 0 if kind.endswith("api") else 1
            self.up.scheduler_processes[index].kill()
            self.up.scheduler_processes[index].wait()
            time.sleep(0.5)
            self._respawn(self.up.scheduler_processes, index)
            return f"kill -9 scheduler {index}, restarted after 0.5 s"
        assert kind == "nats_restart" and self.up.server is not None
        self.up.server.restart()
        return "nats-server restarted"

    def schedule(self) -> list[str]:
        if self.settings.faults <= len(FAULTS):
            kinds = list(FAULTS[: self.settings.faults])
            self.rng.shuffle(kinds)
            return kinds
        return [self.rng.choice(FAULTS) for _ in range(self.settings.faults)]

    def converged(self, kind: str, seconds: float) -> None:
        self.tally.converge_s.append(seconds)
        self.tally.converge_by_fault.setdefault(kind, []).append(seconds)

    def converge(self, api: httpx.Client, kind: str, ended_at: float, what: str) -> None:
        """Poll until the views agree; the clock starts when the fault has ended and the
        workers' last operation has been answered."""
        deadline = ended_at + self.settings.settle_s
        while self.tally.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        ended_at = max(ended_at, time.monotonic())
        problems: list[str] = []
        while time.monotonic() < deadline:
            problems = self.agreement(api, final=False)
            if not problems:
                self.converged(kind, time.monotonic() - ended_at)
                return
            time.sleep(SAMPLE_S)
        problems = self.agreement(api, final=True)
        if problems:
            self.tally.not_converged.append(f"cycle {self.cycle} ({what}): {problems[:4]}")
        else:
            self.converged(kind, time.monotonic() - ended_at)

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
                    self.cycle += 1
                    self.quiet.clear()
                    window = self.settings.window_s
                    time.sleep(self.rng.uniform(0.3, 0.7) * window)  # creates in flight
                    what = self.inject(kind)
                    self.tally.faults[kind] += 1
                    ended_at = time.monotonic()
                    time.sleep(self.rng.uniform(0.3, 0.7) * window)
                    with self.tally.lock:
                        self.quiet.set()
                    self.converge(api, kind, ended_at, what)
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


def result(harness: Harness, elapsed_s: float) -> dict[str, Any]:
    tally = harness.tally
    converge = sorted(tally.converge_s)
    return {
        "benchmark": "faults",
        "seed": harness.settings.seed,
        "workers": harness.settings.workers,
        "settle_s": harness.settings.settle_s,
        "lease_ttl_s": harness.settings.lease_ttl_s,
        "operations": sum(tally.operations.values()),
        "outcomes": dict(sorted(tally.operations.items())),
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
        "converge_target_s": 2 * RECONCILE_EVERY_S,  # 2 reconciler periods
        "converge_within_target": bool(converge)
        and not tally.not_converged
        and converge[-1] <= 2 * RECONCILE_EVERY_S,
        "not_converged": len(tally.not_converged),
        "not_converged_detail": tally.not_converged,
        "violation_detail": tally.examples,
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
)


def summary(found: dict[str, Any], harness: Harness) -> str:
    lines = [
        f"faults: seed {found['seed']}, {found['operations']} operations by "
        f"{found['workers']} workers in {found['elapsed_s']} s (load {found['load_average_1m']})",
        f"  outcomes:   {found['outcomes']}",
        f"  faults:     {found['faults']}",
        f"  host:       up to {found['running_peak']} workloads running, a node's budget up to "
        f"{found['budget_fill_peak']:.0%} reserved, {found['workload_rss_peak_mib']} MiB RSS",
        f"  violations: {found['violations_total']} {found['violations']}",
        f"  converged:  p50 {found['converge_s']['p50']} s, max {found['converge_s']['max']} s; "
        f"not within {found['settle_s']:g} s: {found['not_converged']}",
    ]
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
    args = parser.parse_args(argv)
    settings = Settings(
        seed=args.seed,
        faults=args.faults or (len(FAULTS) if args.quick else 15),
        workers=args.workers,
        window_s=2.0 if args.quick else 5.0,
        settle_s=args.settle or (8.0 if args.quick else 20.0),
        lease_ttl_s=4.0 if args.quick else 8.0,
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
