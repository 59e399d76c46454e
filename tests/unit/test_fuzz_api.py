"""Fuzz of berth's public constructors and functions: a valid value, or ``Invalid``.

Every public entry point that takes input — value types, configuration sections, the unit
and platform parsers, the budget's admission, the scheduler's constructor and queries, the
embedded cluster's configs, the simulator's configs — is called with arguments drawn from a
mix of plausible values and hostile ones (``None``, booleans, NaN and infinities, integers
beyond int64 and with thousands of digits, bytes, control characters, strings where lists
belong, nested junk).  The invariant is the issue's: the call returns a valid value, or
raises ``Invalid`` (whose message is one short line).  A ``TypeError``, ``OverflowError``,
``AttributeError`` or pydantic's own error is a bug.

A value that *was* accepted must also be usable downstream: a ``NodeState`` is ranked by the
engine exactly as by the reference, a configuration builds an agent whose snapshot is valid,
a request's layers sum within int64.  Example counts are small (CI runs the suite on two
cores); the strategies lean on the edges rather than on volume.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth import ClusterScheduler, Invalid, Layer, Platform, Request, Spec, instance_type
from berth.embedded import embedded_configs
from berth.errors import BerthError
from berth.model import (
    MAX_BYTES,
    MAX_CORES,
    MAX_LAYERS,
    Placement,
    checked_layers,
    checked_platforms,
    checked_spec,
)
from berth.node.agent import Agent
from berth.node.budget import IDLE, BudgetLimits, NodeBudget, Reservation
from berth.node.classes import NodeClass
from berth.node.config import AgentConfig, AgentSection, BudgetSection, NodeSection
from berth.node.runtime import FakeRuntime
from berth.nodeclient.local import LocalNodes
from berth.ownership import Lease, Refused
from berth.scheduler.engine import Engine
from berth.scheduler.reference import ReferenceRanker
from berth.sim.simulator import SimConfig
from berth.sim.workload import WorkloadConfig
from berth.state import NodeState
from berth.store.memory import MemoryStore
from berth.units import format_bandwidth, format_information, parse_bandwidth, parse_information

FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# -- hostile and plausible values ----------------------------------------------------------------
EDGE_NUMBERS: list[object] = [
    0,
    1,
    -1,
    2**31,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    10**30,
    10**4000,
    0.0,
    -0.0,
    0.5,
    1e-300,
    1e300,
    -1e300,
    math.nan,
    math.inf,
    -math.inf,
    True,
    False,
]
EDGE_TEXT: list[object] = [
    "",
    " ",
    "\x00",
    "a\x00",
    "a b",
    "\n",
    "\u200b",
    "x" * 300,
    "micro",
    "huge",
    "512MiB",
    "8 GiBs",
    "-1GiB",
    "9223372036854775808",
    "1e3",
    "linux/amd64",
    "linux/amd64/v99",
    "linux/amd46",
    "linux",
    "nan",
    "inf",
    "true",
    "sha256:ab",
    "node-1",
    b"bytes",
    b"\xff",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=12),
    st.binary(max_size=6),
    st.sampled_from(EDGE_NUMBERS),
    st.sampled_from(EDGE_TEXT),
    st.builds(lambda: 10**5000),  # beyond str()'s digit limit (repr would fail in a listing)
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=6), inner, max_size=3),
        st.frozensets(st.text(max_size=6), max_size=3),
    ),
    max_leaves=6,
)


def either(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly plausible values (so later fields get exercised too), sometimes junk."""
    return st.one_of(plausible, plausible, plausible, junk)


plain_names = st.sampled_from(["a", "node-1", "sha256:3153aa", "x.y_z", "N" * 253])
keys = st.one_of(plain_names, plain_names, st.text(max_size=6), st.sampled_from(EDGE_TEXT))
# Plausible values per kind (mostly valid, with their edges); kwargs() corrupts some of them.
names = plain_names
sizes = st.sampled_from([0, 1, 512, "512MiB", "1.5GiB", 2**40, MAX_BYTES, "64GiB"])
rates = st.sampled_from([0, 1, "2GiBps", "100Mbps", 125_000_000, MAX_BYTES])
fractions = st.sampled_from([0, 0.0, 0.5, 0.9, 1, 1.0])
cores = st.sampled_from([0.25, 1, 2.0, 64, MAX_CORES])
seconds = st.sampled_from([0.001, 0.05, 1, 5.0, 30.0, 3600])
platforms = st.sampled_from(["linux/amd64", "linux/arm64/v8", "windows/amd64", "linux/arm"])
layer_pairs = st.lists(st.tuples(either(names), either(sizes)), max_size=4)
platform_lists = st.lists(either(platforms), max_size=3)
specs = st.sampled_from(["micro", "deci", Spec(vcpus=1, mem=1024, disk=1024)])
counts = st.sampled_from([0, 1, 512, 2**40, MAX_BYTES])  # snapshots: ints, no unit strings
loads = st.sampled_from([0, 0.0, 1.5, 1e9, 9.2e18])  # float rates within int64
labels = st.dictionaries(keys, st.sampled_from(["a", "", "zone-b", "x\ny"]), max_size=3)
UNKNOWN_KEYS = ["gpus", "", "mem ", "x"]


@st.composite
def _record(
    draw: st.DrawFn,
    fields: dict[str, st.SearchStrategy[Any]],
    required: frozenset[str],
    extra: bool,
) -> dict[str, Any]:
    out = {
        name: draw(strategy)
        for name, strategy in fields.items()
        if name in required or draw(st.booleans())
    }
    mode = draw(st.integers(0, 3))  # 0: as drawn; 1, 2: one field spoiled; 3: several
    if out and mode in (1, 2):
        name = draw(st.sampled_from(sorted(out)))
        if draw(st.integers(0, 4)) == 0:
            del out[name]  # a missing field
        else:
            out[name] = draw(junk)
    elif mode == 3:
        for name in sorted(out):
            if draw(st.booleans()):
                out[name] = draw(junk)
    if extra and draw(st.integers(0, 7)) == 0:  # a model refuses keys it does not know
        out[draw(st.sampled_from(UNKNOWN_KEYS))] = draw(junk)
    return out


def kwargs(
    *, required: tuple[str, ...] = (), extra: bool = True, **fields: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments: plausible fields (``required`` ones always there, the rest now and
    then), then none, one or several spoiled with junk — so an example is as often entirely
    valid (and its value checked downstream) as it tests one field's error path."""
    return _record(fields, frozenset(required), extra)


def valid_or_invalid(call: Callable[[], Any]) -> Any:
    """Call; return the value, or ``None`` after checking the ``Invalid`` is a short line."""
    try:
        return call()
    except Invalid as error:
        text = str(error)
        assert "\n" not in text and len(text) < 2000, text
        for internal in ("Input should", "pydantic", "instance of", "validation error"):
            assert internal not in text, text
        return None


# -- value types ---------------------------------------------------------------------------------
@FUZZ
@given(
    kwargs(
        required=("vcpus", "mem", "disk"),
        vcpus=cores,
        mem=sizes,
        disk=sizes,
        disk_bw=rates,
        net_bw=rates,
    )
)
def test_spec(fields: dict[str, Any]) -> None:
    spec = valid_or_invalid(lambda: Spec(**fields))
    if spec is not None:
        assert 0 < spec.vcpus <= MAX_CORES and math.isfinite(spec.vcpus)
        for amount in (spec.mem, spec.disk, spec.disk_bw, spec.net_bw):
            assert type(amount) is int and 0 <= amount <= MAX_BYTES
        assert isinstance(str(spec), str)  # formatting never fails
        assert Spec.from_json(spec.to_json()) == spec


@FUZZ
@given(kwargs(required=("id", "size"), id=names, size=sizes), junk)
def test_layer(fields: dict[str, Any], value: Any) -> None:
    layer = valid_or_invalid(lambda: Layer(**fields))
    if layer is not None:
        assert 0 <= layer.size <= MAX_BYTES
    valid_or_invalid(lambda: Layer.of(value))


@FUZZ
@given(
    kwargs(
        required=("namespace", "name"),
        namespace=names,
        name=names,
        replica=st.integers(0, 5),
        platforms=platform_lists,
        spec=specs,
        layers=layer_pairs,
        preferred_node=names,
    )
)
def test_request(fields: dict[str, Any]) -> None:
    request = valid_or_invalid(lambda: Request(**fields))
    if request is not None:
        assert len(request.layers) <= MAX_LAYERS
        assert sum(layer.size for layer in request.layers) <= MAX_BYTES
        assert len({layer.id for layer in request.layers}) == len(request.layers)
        assert Request.from_json(request.to_json()) == request


@FUZZ
@given(
    kwargs(
        required=("worker_node",),
        worker_node=names,
        reservation_id=names,
        colocated_bytes=counts,
        rank=st.integers(0, 9),
        refusals=st.lists(st.tuples(either(names), names), max_size=2),
    )
)
def test_placement(fields: dict[str, Any]) -> None:
    placement = valid_or_invalid(lambda: Placement(**fields))
    if placement is not None:
        assert Placement.from_json(placement.to_json()) == placement


@FUZZ
@given(
    junk | platforms,
    kwargs(
        required=("os", "arch"),
        os=st.sampled_from(["linux", "Windows", "darwin"]),
        arch=st.sampled_from(["amd64", "x86_64", "arm64", "arm", "s390x"]),
        variant=st.sampled_from(["", "v7", "v8", "v3", "v8.2"]),
    ),
)
def test_platform(text: Any, fields: dict[str, Any]) -> None:
    for call in (lambda: Platform.parse(text), lambda: Platform(**fields)):
        platform = valid_or_invalid(call)
        if platform is not None:
            assert Platform.parse(str(platform)) == platform


@FUZZ
@given(junk | sizes | rates)
def test_units(value: Any) -> None:
    for parse in (parse_information, parse_bandwidth):
        parsed = valid_or_invalid(lambda parse=parse: parse(value))  # type: ignore[misc]
        if parsed is not None:
            assert type(parsed) is int and 0 <= parsed <= MAX_BYTES
    for fmt in (format_information, format_bandwidth):
        text = valid_or_invalid(lambda fmt=fmt: fmt(value))  # type: ignore[misc]
        if text is not None:
            assert isinstance(text, str) and text


@FUZZ
@given(junk | specs, junk | layer_pairs, junk | platform_lists)
def test_checked_arguments(spec: Any, layers: Any, platform_list: Any) -> None:
    valid_or_invalid(lambda: checked_spec(spec))
    valid_or_invalid(lambda: instance_type(spec))
    checked = valid_or_invalid(lambda: checked_layers(layers))
    if checked is not None:
        assert sum(layer.size for layer in checked) <= MAX_BYTES
    valid_or_invalid(lambda: checked_platforms(platform_list))


# -- snapshots: accepted means representable by the engine ---------------------------------------
@FUZZ
@given(
    kwargs(
        required=(
            "node",
            "platform",
            "mem_free",
            "disk_free",
            "cpu_capacity",
            "disk_bw_ceiling",
            "net_bw_ceiling",
        ),
        node=names,
        platform=platforms,
        generation=st.integers(0, 3),
        admitted=st.integers(0, 3),
        published_at=seconds,
        labels=labels,
        mem_free=counts,
        disk_free=counts,
        mem_max=counts,
        disk_max=counts,
        cpu_load=fractions,
        cpu_capacity=cores,
        cpu_max_load=fractions,
        disk_bw_load=loads,
        disk_bw_ceiling=loads,
        net_bw_load=loads,
        net_bw_ceiling=loads,
        layers=st.frozensets(keys, max_size=3),
        cached_layers=st.frozensets(keys, max_size=3),
    ),
    either(specs),
)
def test_node_state_and_what_the_engine_makes_of_it(fields: dict[str, Any], spec: Any) -> None:
    state = valid_or_invalid(lambda: NodeState(**fields))
    if state is None:
        return
    assert NodeState.from_json(state.to_json()) == state
    engine, reference = Engine(), ReferenceRanker()
    other = state.model_copy(update={"node": state.node + "-2"})
    for ranker in (engine, reference):
        ranker.upsert(state)
        ranker.upsert(other)
    checked = valid_or_invalid(lambda: checked_spec(spec))
    held = [Layer(id=layer_id, size=MAX_BYTES // 4) for layer_id in sorted(state.layers)[:2]]
    layers = [*held, Layer(id="zz-not-held", size=5)]
    got = engine.rank(checked, layers).pairs()
    assert got == reference.rank(checked, layers).pairs()
    assert all(0 <= colocated <= MAX_BYTES for _, colocated in got)
    engine.remove(state.node)
    assert [node for node, _ in engine.rank(None, []).pairs()] == [other.node]


# -- configuration: accepted means an agent can run it -------------------------------------------
budget_tables = either(
    kwargs(
        required=(
            "mem_max",
            "disk_max",
            "cpu_max_load",
            "disk_bw_cap",
            "disk_bw_max_load",
            "net_bw_cap",
            "net_bw_max_load",
        ),
        mem_max=sizes,
        disk_max=sizes,
        cpu_max_load=fractions,
        cpu_max_cap=cores,
        disk_bw_cap=rates,
        disk_bw_max_load=fractions,
        net_bw_cap=rates,
        net_bw_max_load=fractions,
        cpu_overcommit=cores,
        disk_bw_overcommit=cores,
    )
)
agent_tables = either(
    kwargs(
        heartbeat_s=seconds,
        sample_period_s=seconds,
        tau_s=seconds,
        layer_cache=sizes,
        lease_ttl_s=seconds,
        runtime=st.sampled_from(["process", "fake"]),
        stop_grace_s=seconds,
    )
)
node_tables = either(kwargs(required=("name",), name=names, platform=platforms, labels=labels))


@FUZZ
@given(node_tables, budget_tables, agent_tables)
def test_agent_config_and_the_agent_it_builds(node: Any, budget: Any, agent: Any) -> None:
    document = {"node": node, "budget": budget, "agent": agent}
    for section, data in ((NodeSection, node), (BudgetSection, budget), (AgentSection, agent)):
        valid_or_invalid(lambda section=section, data=data: section.from_dict(data))  # type: ignore[misc]
    config = valid_or_invalid(lambda: AgentConfig.from_dict(document))
    if config is None:
        return
    assert AgentConfig.from_json(config.to_json()) == config
    built = Agent.from_config(config, MemoryStore(), runtime=FakeRuntime(), readings=IDLE)
    snapshot = built.snapshot()  # a valid NodeState: every limit fits the snapshot's bounds
    assert snapshot.node == config.node.name and snapshot.mem_free == config.budget.mem_max


@FUZZ
@given(
    kwargs(
        required=("name", "mem", "disk", "cpus", "disk_bw", "net_bw"),
        name=names,
        mem=sizes,
        disk=sizes,
        cpus=cores,
        disk_bw=rates,
        net_bw=rates,
        cpu_max_load=fractions,
        weight=st.sampled_from([0, 1, 0.5]),
    )
)
def test_node_class(fields: dict[str, Any]) -> None:
    node_class = valid_or_invalid(lambda: NodeClass(**fields))
    if node_class is not None:
        # NodeClass.cpus is Cores: a class the model accepts always makes a budget.
        assert 0 < node_class.cpus <= MAX_CORES
        assert node_class.limits().mem_max == node_class.mem


@FUZZ
@given(
    kwargs(
        required=("mem_max", "disk_max", "cpu_capacity", "disk_bw_cap", "net_bw_cap"),
        mem_max=counts,
        disk_max=counts,
        cpu_capacity=cores,
        cpu_max_load=fractions,
        disk_bw_cap=counts,
        disk_bw_max_load=fractions,
        net_bw_cap=counts,
        net_bw_max_load=fractions,
        cpu_overcommit=cores,
        net_bw_overcommit=cores,
    ),
    either(specs),
    either(platform_lists),
    either(seconds),
)
def test_budget_admission(fields: dict[str, Any], spec: Any, platform_list: Any, ttl: Any) -> None:
    limits = valid_or_invalid(lambda: BudgetLimits(**fields))
    if limits is None:
        return
    budget = NodeBudget(limits, clock=lambda: 0.0, platform="linux/amd64")
    before = (budget.reservations(), budget.headroom(), budget.admitted, budget.overcommit())
    call: Callable[[], Reservation]  # lambdas over Any values: say what they return
    for call in (
        lambda: budget.admit(spec, Lease(1.0, lambda: 0.0), platform_list),
        lambda: budget.admit_leased(spec, ttl, platform_list),
        lambda: budget.reserve(spec, Lease(1.0, lambda: 0.0)),
    ):
        try:
            reservation = call()
        except Invalid:
            after = (budget.reservations(), budget.headroom(), budget.admitted, budget.overcommit())
            assert after == before  # a refused call changed nothing
            continue
        except Refused:
            continue
        assert budget.release(reservation.id)
        headroom = budget.headroom()
        assert (headroom.mem_free, headroom.disk_free) == (limits.mem_max, limits.disk_max)
        before = (budget.reservations(), headroom, budget.admitted, budget.overcommit())


@FUZZ
@given(junk | seconds)
def test_lease(ttl: Any) -> None:
    lease = valid_or_invalid(lambda: Lease(ttl, lambda: 0.0))
    if lease is not None:
        assert lease.deadline is not None and 0 < lease.deadline < math.inf
        valid_or_invalid(lambda: lease.renew(ttl))


# -- the scheduler and the embedded cluster ------------------------------------------------------
def small_cluster() -> MemoryStore:
    store = MemoryStore()
    for index, platform in enumerate(("linux/amd64", "linux/arm64", "linux/amd64")):
        store.publish_now(
            NodeState(
                node=f"n{index}",
                platform=platform,
                mem_free=2**30,
                disk_free=2**34,
                cpu_capacity=4.0,
                disk_bw_ceiling=2.0**30,
                net_bw_ceiling=2.0**30,
                layers=frozenset({"sha256:3153aa", "a"} if index else {"a"}),
            )
        )
    return store


STORE = small_cluster()


@FUZZ
@given(
    kwargs(
        extra=False,
        ranker=st.sampled_from(["engine", "reference"]),
        lease_ttl_s=seconds,
        assume=st.booleans(),
        assume_ttl_s=seconds,
    ),
    either(specs),
    either(layer_pairs),
    either(platform_lists),
)
def test_cluster_scheduler(fields: dict[str, Any], spec: Any, layers: Any, where: Any) -> None:
    scheduler = valid_or_invalid(lambda: ClusterScheduler(STORE, LocalNodes({}), **fields))
    if scheduler is None:
        return
    try:
        call: Callable[[], Sequence[str]]  # lambdas over Any values: say what they return
        for call in (
            lambda: scheduler.candidates(spec, layers, where),
            lambda: scheduler.rank(spec, layers, where),
        ):
            try:
                result = call()
            except Invalid:
                continue  # NoMatchingPlatform included: an artifact no node runs
            assert set(result) <= {"n0", "n1", "n2"}
        request = valid_or_invalid(
            lambda: Request(namespace="a", name="b", spec=spec, layers=layers, platforms=where)
        )
        if request is not None:
            try:
                explanation = scheduler.explain(request)
            except BerthError as error:  # pragma: no cover - explain never raises for a Request
                pytest.fail(f"explain raised {error!r}")
            assert {verdict.node for verdict in explanation.verdicts} == {"n0", "n1", "n2"}
    finally:
        scheduler.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    either(st.integers(1, 4)),
    either(st.lists(platforms, min_size=1, max_size=2)),
    either(st.sampled_from(["fake", "process"])),
    either(seconds),
)
def test_embedded_configs(nodes: Any, platform_list: Any, runtime: Any, heartbeat: Any) -> None:
    configs = valid_or_invalid(
        lambda: embedded_configs(
            nodes, platforms=platform_list, runtime=runtime, heartbeat_s=heartbeat
        )
    )
    if configs is not None:
        assert len(configs) == nodes and all(isinstance(c, AgentConfig) for c in configs)


# -- the simulator's configurations --------------------------------------------------------------
@FUZZ
@given(
    kwargs(
        requests=st.integers(0, 100),
        rate=st.sampled_from([0.5, 2, 1e-6, 1e6]),
        arrival=st.sampled_from(["poisson", "bursty"]),
        burst_factor=cores,
        burst_fraction=fractions,
        burst_length=cores,
        flatten=fractions,
        instance_types=st.dictionaries(
            st.sampled_from(["micro", "deci", "huge"]), st.sampled_from([0, 1, 0.5]), max_size=2
        ),
        lifetime=st.sampled_from(["exponential", "lognormal"]),
        lifetime_mean=seconds,
        lifetime_sigma=fractions,
        platforms=platform_lists,
        namespace=names,
        seed=st.integers(0, 9),
    ),
    kwargs(
        nodes=st.integers(1, 5),
        cache_bytes=sizes,
        pull_bandwidth=rates,
        boot_seconds=seconds,
        concurrency=st.integers(1, 4),
        staleness=seconds,
        assume=st.booleans(),
        samples=st.integers(1, 9),
        seed=st.integers(0, 9),
        node_platforms=st.dictionaries(keys | platforms, st.sampled_from([0, 1, math.nan])),
    ),
)
def test_sim_configs(workload: dict[str, Any], sim: dict[str, Any]) -> None:
    config = valid_or_invalid(lambda: WorkloadConfig(**workload))
    if config is not None:
        assert config.requests <= 1_000_000 and math.isfinite(config.rate)
        sim = {**sim, "workload": config}
    valid_or_invalid(lambda: SimConfig(**sim))


def test_the_fuzz_reaches_both_outcomes() -> None:
    # A guard on the strategies: hostile arguments are refused, plausible ones accepted.
    assert valid_or_invalid(lambda: Spec(vcpus=math.nan, mem=0, disk=0)) is None
    assert valid_or_invalid(lambda: Spec(vcpus=1, mem="512MiB", disk=0)) is not None
    assert asyncio.run(STORE.states()).keys() == {"n0", "n1", "n2"}
