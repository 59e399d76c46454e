"""The one table of checks: its order, scalar == vectorised, and one entry reaching every stage."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth import Layer, Platform, Spec
from berth.checks import (
    CHECKS,
    COLUMN_FIELDS,
    CORDONED,
    Check,
    Demand,
    NodeColumns,
    NodeFigures,
    NodeView,
    Scratch,
    Stage,
    _bandwidth,
    _bandwidth_figures,
    _hard,
    _overcommit,
    _vcpu_figures,
    describe_reason,
    first_excluding,
    first_failed,
    narrow,
)
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.ownership import Refused
from berth.scheduler.engine import Engine
from berth.scheduler.explain import summarise, verdicts
from berth.scheduler.ranking import Stages
from berth.scheduler.reference import ReferenceRanker
from berth.state import NodeState, Overcommit, first_failed_check, fits

AMD64, ARM64, WINDOWS = (Platform.parse(p) for p in ("linux/amd64", "linux/arm64", "windows/amd64"))
PLATFORMS = [AMD64, ARM64, WINDOWS]
RISCV = Platform.parse("linux/riscv64")  # asked for, run by no node
PLATFORM_IDS = {platform: index for index, platform in enumerate(PLATFORMS)}


def test_the_table_order_and_codes() -> None:
    assert [check.code for check in CHECKS] == [
        "cordoned",
        "platform_mismatch",
        "mem_exhausted",
        "disk_exhausted",
        "cpu_overcommitted",
        "disk_bw_overcommitted",
        "net_bw_overcommitted",
        "cpu_saturated",
        "disk_bw_saturated",
        "net_bw_saturated",
    ]
    stages = [check.stage for check in CHECKS]
    assert stages == sorted(stages, key=list(Stage).index)  # cordon, platform, hard, β_max, soft
    assert [check.code for check in CHECKS if not check.sized] == ["cordoned", "platform_mismatch"]
    assert describe_reason("mem_exhausted") == "insufficient memory"
    assert describe_reason("cpu_saturated") == "cpu saturated"
    assert describe_reason("boot_failed") == "boot_failed"  # not a check: as it is


# -- scalar == vectorised ---------------------------------------------------------------------
# Small grids make exact fills (asked == free, load + asked == ceiling) common, not a fluke.
amounts = st.integers(0, 8).map(lambda x: x * 256)
loads = st.sampled_from([0.0, 0.25, 0.5, 0.55, 0.75, 0.8, 1.0, 0.1 + 0.2])
ceilings = st.sampled_from([math.inf, 2.0, 3.0, 4.0, 768.0, 1024.0])
reserved = st.sampled_from([0.0, 1.0, 2.5, 512.0])

figures = st.builds(
    NodeFigures,
    platform=st.sampled_from(PLATFORMS),
    mem_free=amounts,
    disk_free=amounts,
    cpu_load=loads,
    cpu_capacity=st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0]),
    cpu_max_load=loads,
    disk_bw_load=amounts.map(float),
    disk_bw_ceiling=amounts.map(float),
    net_bw_load=amounts.map(float),
    net_bw_ceiling=amounts.map(float),
    oc_vcpus_reserved=reserved,
    oc_vcpus_ceiling=ceilings,
    oc_disk_bw_reserved=reserved,
    oc_disk_bw_ceiling=ceilings,
    oc_net_bw_reserved=reserved,
    oc_net_bw_ceiling=ceilings,
    cordoned=st.booleans(),
)
specs = st.none() | st.builds(
    Spec,
    vcpus=st.sampled_from([0.25, 0.5, 1.0, 2.0, 0.1]),
    mem=amounts,
    disk=amounts,
    disk_bw=amounts,
    net_bw=amounts,
)
demands = st.builds(
    Demand.of, specs, st.lists(st.sampled_from([*PLATFORMS, RISCV]), unique=True, max_size=3)
)


def columns_of(views: Sequence[NodeFigures]) -> tuple[NodeColumns, Scratch]:
    """The columns an engine would hold for ``views`` (every view has a platform)."""

    def column(name: str) -> npt.NDArray[Any]:
        values = [getattr(view, name) for view in views]
        if name == "cordoned":
            return np.array(values, dtype=bool)
        return np.array(values, dtype=np.int64 if name.endswith("_free") else np.float64)

    platform_id = [PLATFORM_IDS[view.platform] for view in views if view.platform is not None]
    columns = NodeColumns(
        np.array(platform_id, dtype=np.int16),
        PLATFORM_IDS,
        *(column(name) for name in COLUMN_FIELDS),
    )
    size = len(views)
    return columns, Scratch(np.ones(size, dtype=bool), np.zeros(size, dtype=np.float64))


@settings(max_examples=300, deadline=None)
@given(st.lists(figures, min_size=1, max_size=30), demands)
def test_every_check_agrees_scalar_and_vectorised(views: list[NodeFigures], demand: Demand) -> None:
    columns, scratch = columns_of(views)
    for check in CHECKS:
        fit = np.ones(len(views), dtype=bool)
        check.narrow(columns, demand, fit, scratch)
        assert fit.tolist() == [check.test(view, demand) for view in views], check.code
    fit = np.ones(len(views), dtype=bool)
    narrow(columns, demand, fit, scratch)
    assert fit.tolist() == [first_failed(view, demand) is None for view in views]


@settings(max_examples=100, deadline=None)
@given(st.lists(figures, min_size=1, max_size=10), demands)
def test_overcommit_checks_may_skip_when_no_node_runs_the_stage(
    views: list[NodeFigures], demand: Demand
) -> None:
    unstaged = [
        view._replace(
            oc_vcpus_ceiling=math.inf, oc_disk_bw_ceiling=math.inf, oc_net_bw_ceiling=math.inf
        )
        for view in views
    ]
    columns, scratch = columns_of(unstaged)
    columns.overcommitting = False
    fit = np.ones(len(views), dtype=bool)
    narrow(columns, demand, fit, scratch)
    assert fit.tolist() == [first_failed(view, demand) is None for view in unstaged]


def test_the_cordon_check_skips_its_pass_when_no_slot_is_cordoned() -> None:
    """With ``any_cordoned`` off the cordon check leaves ``fit`` alone without reading the
    column (a cordoned slot here shows that nothing was read)."""
    view = NodeFigures(AMD64, 10, 10, 0.0, 1.0, 1.0, 0.0, 9.0, 0.0, 9.0, cordoned=True)
    columns, scratch = columns_of([view])
    fit = np.ones(1, dtype=bool)
    CORDONED.narrow(columns, Demand(), fit, scratch)
    assert fit.tolist() == [False]
    columns.any_cordoned = False
    fit[:] = True
    CORDONED.narrow(columns, Demand(), fit, scratch)
    assert fit.tolist() == [True]


def test_exact_fills_pass_every_check() -> None:
    view = NodeFigures(
        platform=AMD64,
        mem_free=512,
        disk_free=256,
        cpu_load=0.5,
        cpu_capacity=4.0,
        cpu_max_load=0.75,
        disk_bw_load=256.0,
        disk_bw_ceiling=512.0,
        net_bw_load=0.0,
        net_bw_ceiling=256.0,
        oc_vcpus_reserved=2.0,
        oc_vcpus_ceiling=3.0,
        oc_disk_bw_reserved=512.0,
        oc_disk_bw_ceiling=768.0,
        oc_net_bw_ceiling=256.0,
    )
    exact = Demand.of(Spec(vcpus=1, mem=512, disk=256, disk_bw=256, net_bw=256), [AMD64])
    assert first_failed(view, exact) is None
    columns, scratch = columns_of([view])
    fit = np.ones(1, dtype=bool)
    narrow(columns, exact, fit, scratch)
    assert fit.tolist() == [True]


def test_a_demand_without_a_spec_is_judged_on_the_platform_only() -> None:
    empty = NodeFigures(AMD64, 0, 0, 1.0, 1.0, 0.5, 9.0, 0.0, 9.0, 0.0)
    assert first_failed(empty, Demand.of(None)) is None
    failed = first_failed(empty, Demand.of(None, [ARM64]))
    assert failed is not None and failed.code == "platform_mismatch"
    anything = empty._replace(platform=None)  # a bare budget runs anything
    assert first_failed(anything, Demand.of(None, [ARM64])) is None


def test_a_snapshot_is_a_node_view() -> None:
    state = NodeState(
        node="n",
        platform=AMD64,
        mem_free=1,
        disk_free=1,
        cpu_capacity=1.0,
        disk_bw_ceiling=1.0,
        net_bw_ceiling=1.0,
    )
    view: NodeView = state
    assert (view.oc_vcpus_reserved, view.oc_vcpus_ceiling) == (0.0, math.inf)
    staged = state.model_copy(
        update={"overcommit": Overcommit(net_bw_reserved=3.0, net_bw_ceiling=8.0)}
    )
    assert (staged.oc_net_bw_reserved, staged.oc_net_bw_ceiling) == (3.0, 8.0)
    assert staged.oc_disk_bw_ceiling == math.inf


# -- one entry reaches every stage ------------------------------------------------------------
def _reserve_test(view: NodeView, demand: Demand) -> bool:
    return demand.mem + 256 <= view.mem_free


def _reserve_narrow(
    columns: NodeColumns, demand: Demand, fit: npt.NDArray[np.bool_], scratch: Scratch
) -> None:
    np.greater_equal(columns.mem_free, demand.mem + 256, out=scratch.mask)
    fit &= scratch.mask


MEM_RESERVE = Check(
    code="mem_reserve",
    phrase="would eat the memory reserve",
    stage=Stage.HARD,
    test=_reserve_test,
    narrow=_reserve_narrow,
    detail=lambda view, demand: f"{demand.mem} + 256 B reserve > {view.mem_free} B free",
)
"""A toy rule: always leave 256 bytes of memory free."""
WITH_RESERVE = (*CHECKS, MEM_RESERVE)

SPEC = Spec(vcpus=0.5, mem=1024, disk=1)
LAYERS = [Layer(id="l", size=5)]


def snapshot(node: str, mem_free: int) -> NodeState:
    return NodeState(
        node=node,
        platform=AMD64,
        mem_free=mem_free,
        disk_free=10,
        cpu_capacity=1.0,
        disk_bw_ceiling=1.0,
        net_bw_ceiling=1.0,
        layers=frozenset({"l"}),
    )


CLUSTER = [snapshot("exact", 1024), snapshot("roomy", 1280), snapshot("tiny", 512)]


def test_an_added_check_filters_the_reference_and_the_engine() -> None:
    for checks, expected in ((CHECKS, ["exact", "roomy"]), (WITH_RESERVE, ["roomy"])):
        reference, engine = ReferenceRanker(checks), Engine(checks=checks)
        for state in CLUSTER:
            reference.upsert(state)
            engine.upsert(state)
        assert list(reference.rank(SPEC, LAYERS)) == expected
        assert engine.rank(SPEC, LAYERS).pairs() == reference.rank(SPEC, LAYERS).pairs()
    assert fits(CLUSTER[0], SPEC)
    assert first_failed_check(CLUSTER[0], SPEC, checks=WITH_RESERVE) == "mem_reserve"
    assert first_failed_check(CLUSTER[2], SPEC, checks=WITH_RESERVE) == "mem_exhausted"


def test_an_added_check_is_enforced_by_admission() -> None:
    limits = BudgetLimits(mem_max=1024, disk_max=10, cpu_capacity=1.0, disk_bw_cap=1, net_bw_cap=1)
    NodeBudget(limits).admit_leased(SPEC, 5.0)  # an exact fill, by the default table
    budget = NodeBudget(limits, checks=WITH_RESERVE)
    with pytest.raises(Refused) as caught:
        budget.admit_leased(SPEC, 5.0)
    assert caught.value.reason == "mem_reserve"
    assert caught.value.detail == "1024 + 256 B reserve > 1024 B free"
    assert budget.reservations() == []


def test_an_added_check_is_explained() -> None:
    explanation = verdicts(CLUSTER, SPEC, LAYERS, [], {"roomy": 0}, checks=WITH_RESERVE)
    assert {v.node: v.verdict for v in explanation.verdicts} == {
        "roomy": "fits",
        "exact": "mem_reserve",
        "tiny": "mem_exhausted",
    }
    assert explanation.summary() == (
        "1/3 nodes can run it: 1 would eat the memory reserve, 1 insufficient memory"
    )
    default = verdicts(CLUSTER, SPEC, LAYERS, [], {})
    assert summarise(default.verdicts) == "2/3 nodes can run it: 1 insufficient memory"


# -- a filter beside the table ----------------------------------------------------------------
class Maintenance:
    """A filter on what no node's figures hold: the nodes an operator listed take nothing new."""

    code = "maintenance"
    described = "the maintenance window"

    def __init__(self, *nodes: str) -> None:
        self.nodes = set(nodes)

    def exclusion(self, node: str) -> str | None:
        return f"{node} is in its maintenance window" if node in self.nodes else None


def test_a_filter_beside_the_table_is_explained_by_its_code_after_the_checks() -> None:
    explanation = verdicts(
        CLUSTER, SPEC, LAYERS, [], {}, stages=Stages(filters=(Maintenance("roomy", "tiny"),))
    )
    by_node = {v.node: v for v in explanation.verdicts}
    assert {node: v.verdict for node, v in by_node.items()} == {
        "exact": "fits",
        "roomy": "maintenance",
        "tiny": "mem_exhausted",  # the table first: a filter judges only what passes it
    }
    assert by_node["roomy"].description == (
        "excluded by the maintenance: roomy is in its maintenance window"
    )
    assert explanation.summary() == (
        "1/3 nodes can run it: 1 excluded by the maintenance window, 1 insufficient memory"
    )
    assert explanation.spread == "the maintenance window"
    assert first_excluding("exact", [Maintenance("roomy")]) is None
    excluded = first_excluding("roomy", [Maintenance(), Maintenance("roomy")])
    assert excluded is not None and excluded[1] == "roomy is in its maintenance window"


# -- platform ---------------------------------------------------------------------------------
def test_admission_refuses_platform_mismatch_naming_both_sides() -> None:
    limits = BudgetLimits(mem_max=1024, disk_max=10, cpu_capacity=1.0, disk_bw_cap=1, net_bw_cap=1)
    budget = NodeBudget(limits, platform="linux/arm64")
    with pytest.raises(Refused) as caught:
        budget.admit_leased(SPEC, 5.0, [AMD64, RISCV])
    refused = caught.value
    assert refused.reason == "platform_mismatch"
    assert refused.detail == "node runs linux/arm64/v8, asked for linux/amd64, linux/riscv64"
    assert "(platform not offered)" in str(refused)
    assert budget.reservations() == []
    budget.admit_leased(SPEC, 5.0, [RISCV, ARM64])  # one of them is enough
    assert NodeBudget(limits).admit_leased(SPEC, 5.0, [RISCV])  # a bare budget runs anything


def test_snapshot_filter_and_explanations_use_the_same_platform_code() -> None:
    arm = snapshot("arm", 4096).model_copy(update={"platform": ARM64})
    assert first_failed_check(arm, SPEC, [AMD64]) == "platform_mismatch"
    assert first_failed_check(arm, None, [AMD64]) == "platform_mismatch"
    assert first_failed_check(arm, None, [ARM64]) is None
    explanation = verdicts([arm, *CLUSTER], SPEC, LAYERS, [AMD64], {})
    assert {v.node: v.verdict for v in explanation.verdicts}["arm"] == "platform_mismatch"
    assert explanation.summary() == (
        "2/4 nodes can run it: 1 platform linux/amd64 not offered, 1 insufficient memory"
    )


def test_admission_details_come_from_the_table() -> None:
    limits = BudgetLimits(
        mem_max=2**27,
        disk_max=2**30,
        cpu_capacity=4.0,
        cpu_max_load=0.8,
        disk_bw_cap=1000,
        disk_bw_max_load=0.5,
        net_bw_cap=1000,
        net_bw_max_load=0.5,
        cpu_overcommit=1.0,
    )
    load = StaticLoad(cpu_load=0.6)
    budget = NodeBudget(limits, load)

    def refusal(spec: Spec) -> Refused:
        with pytest.raises(Refused) as caught:
            budget.admit_leased(spec, 5.0)
        return caught.value

    # figures that would read alike rounded are shown exactly
    assert refusal(Spec(vcpus=1, mem=2**27 + 1, disk=1)).detail == "asks 134217729B, 128MiB free"
    assert refusal(Spec(vcpus=1, mem=1, disk=1)).detail == (
        "asks 1 vCPU of 4 cores: load 60.0% + 25.0% > 80.0% limit"
    )
    assert refusal(Spec(vcpus=5, mem=1, disk=1)).detail == (
        "asks 5 vCPUs, 0 vCPUs reserved of a 4 vCPUs over-commit ceiling"
    )
    load.cpu_load = 0.0
    assert refusal(Spec(vcpus=1, mem=1, disk=1, net_bw=501)).detail == (
        "asks 501Bps, 0Bps in use of a 500Bps ceiling"
    )


def test_engine_and_reference_agree_with_an_added_check_on_random_clusters() -> None:
    import random

    rng = random.Random(5)
    reference, engine = ReferenceRanker(WITH_RESERVE), Engine(checks=WITH_RESERVE)
    for index in range(300):
        state = snapshot(f"n{index:03d}", rng.randrange(0, 9) * 256)
        state = state.model_copy(update={"platform": rng.choice(PLATFORMS)})
        reference.upsert(state)
        engine.upsert(state)
    for mem in (0, 256, 1024):
        spec = Spec(vcpus=0.5, mem=mem, disk=1)
        for platforms in ([], [AMD64], [RISCV]):
            expected = reference.rank(spec, LAYERS, platforms).pairs()
            assert engine.rank(spec, LAYERS, platforms).pairs() == expected


# -- the factories, called at test time -------------------------------------------------------
# The table is built once, when berth.checks is imported.  Mutation testing
# (scripts/mutation.py) switches a mutant in when a function is *called*, so the factories'
# code is only exercised by tests that call them; these build every sized check of the table
# again and hold the result to the table's scalar tests and to literal details.
TABLE = {check.code: check for check in CHECKS}


def rebuilt_checks() -> list[Check]:
    def test(code: str) -> Any:
        return TABLE[code].test

    return [
        _hard("mem", "mem_exhausted", "insufficient memory", test("mem_exhausted")),
        _hard("disk", "disk_exhausted", "insufficient disk", test("disk_exhausted")),
        _overcommit(
            "vcpus",
            "cpu_overcommitted",
            "cpu over-commit ceiling reached",
            _vcpu_figures,
            test("cpu_overcommitted"),
        ),
        _overcommit(
            "disk_bw",
            "disk_bw_overcommitted",
            "disk bandwidth over-commit ceiling reached",
            _bandwidth_figures,
            test("disk_bw_overcommitted"),
        ),
        _overcommit(
            "net_bw",
            "net_bw_overcommitted",
            "network bandwidth over-commit ceiling reached",
            _bandwidth_figures,
            test("net_bw_overcommitted"),
        ),
        _bandwidth(
            "disk_bw", "disk_bw_saturated", "disk bandwidth saturated", test("disk_bw_saturated")
        ),
        _bandwidth(
            "net_bw", "net_bw_saturated", "network bandwidth saturated", test("net_bw_saturated")
        ),
    ]


def test_the_factories_build_the_tables_checks() -> None:
    for check in rebuilt_checks():
        original = TABLE[check.code]
        assert (check.phrase, check.stage, check.sized, check.group) == (
            original.phrase,
            original.stage,
            original.sized,
            original.group,
        )


@settings(max_examples=150, deadline=None)
@given(st.lists(figures, min_size=1, max_size=12), demands)
def test_factory_built_checks_agree_scalar_and_vectorised(
    views: list[NodeFigures], demand: Demand
) -> None:
    columns, scratch = columns_of(views)
    for check in rebuilt_checks():
        fit = np.ones(len(views), dtype=bool)
        check.narrow(columns, demand, fit, scratch)
        assert fit.tolist() == [check.test(view, demand) for view in views], check.code
        ruled_out = np.zeros(len(views), dtype=bool)  # narrowing never lets a slot back in
        check.narrow(columns, demand, ruled_out, scratch)
        assert not ruled_out.any(), check.code


def test_factory_built_checks_detail_their_figures() -> None:
    view = NodeFigures(
        platform=AMD64,
        mem_free=512,
        disk_free=256,
        cpu_load=0.5,
        cpu_capacity=4.0,
        cpu_max_load=0.75,
        disk_bw_load=256.0,
        disk_bw_ceiling=512.0,
        net_bw_load=100.0,
        net_bw_ceiling=256.0,
        oc_vcpus_reserved=2.5,
        oc_vcpus_ceiling=3.0,
        oc_disk_bw_reserved=512.0,
        oc_disk_bw_ceiling=768.0,
        oc_net_bw_reserved=64.0,
        oc_net_bw_ceiling=128.0,
    )
    demand = Demand.of(Spec(vcpus=1, mem=1024, disk=300, disk_bw=300, net_bw=200))
    details = {check.code: check.detail(view, demand) for check in rebuilt_checks()}
    assert details == {
        "mem_exhausted": "asks 1KiB, 512B free",
        "disk_exhausted": "asks 300B, 256B free",
        "cpu_overcommitted": "asks 1 vCPU, 2.5 vCPUs reserved of a 3 vCPUs over-commit ceiling",
        "disk_bw_overcommitted": "asks 300Bps, 512Bps reserved of a 768Bps over-commit ceiling",
        "net_bw_overcommitted": "asks 200Bps, 64Bps reserved of a 128Bps over-commit ceiling",
        "disk_bw_saturated": "asks 300Bps, 256Bps in use of a 512Bps ceiling",
        "net_bw_saturated": "asks 200Bps, 100Bps in use of a 256Bps ceiling",
    }
    assert details == {code: TABLE[code].detail(view, demand) for code in details}
    assert all(not check.test(view, demand) for check in rebuilt_checks())


def test_overcommit_checks_skip_their_pass_when_no_slot_runs_the_stage() -> None:
    """With ``overcommitting`` off the β_max checks leave ``fit`` alone without reading the
    columns (every ceiling is +inf then; finite ones here show that nothing was read)."""
    full = NodeFigures(
        AMD64, 10, 10, 0.0, 1.0, 1.0, 0.0, 9.0, 0.0, 9.0, 5.0, 1.0, 5.0, 1.0, 5.0, 1.0
    )
    columns, scratch = columns_of([full, full])
    demand = Demand.of(Spec(vcpus=1, mem=1, disk=1, disk_bw=1, net_bw=1))
    for check in rebuilt_checks():
        fit = np.ones(2, dtype=bool)
        check.narrow(columns, demand, fit, scratch)
        assert fit.tolist() == [check.stage is not Stage.OVERCOMMIT] * 2, check.code
    columns.overcommitting = False
    for check in rebuilt_checks():
        fit = np.ones(2, dtype=bool)
        check.narrow(columns, demand, fit, scratch)
        assert fit.tolist() == [True, True], check.code
