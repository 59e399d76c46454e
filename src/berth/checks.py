"""The fit rule, written once: a table of named checks that every stage iterates.

"Can this node hold this workload?" is asked in four places — the reference ranker
(:func:`berth.state.fits`), the NumPy engine's filter (:meth:`Engine.fit_mask`), the node's
authoritative admission (:class:`berth.node.budget.NodeBudget`) and the explanations
(:mod:`berth.scheduler.explain`).  They all walk :data:`CHECKS`, so a rule (a GPU check, a
label check) is added by adding one :class:`Check`, and a refusal, a filtered node and an
explanation always name the same reason code.

A check has a reason code, a human phrase, a *scalar* test on one :class:`NodeView`, a
*vectorised* test on :class:`NodeColumns` (one NumPy column per view field, over every node
slot) and a detail message for refusals.  The two tests evaluate the same float64
expression in the same order, so they agree bit for bit (property tests hold the engine
equal to the reference); ``<=`` everywhere, so an exact fill fits.  In table order:

* **cordoned** — an operator marked the node as taking no new workloads (node maintenance:
  ``berth cordon``, a drain); unsized, so it judges every request, with or without a spec.
  Workloads already running are not affected: the check is about *new* admissions;
* **platform** — the node runs one of the demand's platforms (none asked: any);
* **hard** — ``mem <= mem_free``, ``disk <= disk_free``;
* **over-commit** (the β_max stage, only on nodes that run it; an absent ceiling is
  ``+inf``) — ``oc_β_reserved + β <= oc_β_ceiling`` for β in vcpus, disk_bw, net_bw;
* **soft** — ``cpu_load + vcpus / cpu_capacity <= cpu_max_load``,
  ``disk_bw_load + disk_bw <= disk_bw_ceiling``, ``net_bw_load + net_bw <= net_bw_ceiling``.

The first failing check is the verdict.  A :class:`Demand` without a size (a request with no
spec) is judged on the unsized checks only (the cordon and the platform).

**Filters, beside the table.**  A check reads a node's own figures, so every stage — snapshot
filter, admission, explanation — can judge it.  A rule that needs what only the scheduler
knows (a hard spread: where the function's other replicas are) cannot be a check: it is a
:class:`Filter`, judged by node name after the table, for one request at one moment.  A
ranking leaves out the nodes a filter excludes (:class:`~berth.scheduler.ranking.Stages`),
the walk re-judges each node just before asking it, and an explanation or a ``NoCapacity``
names such a node by the filter's ``code`` (``spread``).  A node that fails a check is named
by the check: filters judge only the nodes the whole table passes.

What this module is not: it holds no node state and decides nothing about ranking.  Each
stage brings its own view — a snapshot is approximate, the budget's live view is
authoritative — and the table only says what a view must satisfy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from operator import attrgetter
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from berth.model import Spec
from berth.platform import Platform, matches_any
from berth.units import format_bandwidth, format_information

__all__ = [
    "CHECKS",
    "COLUMN_FIELDS",
    "CORDONED",
    "CORDONED_DETAIL",
    "HELD_STAGES",
    "Check",
    "Demand",
    "Filter",
    "NodeColumns",
    "NodeFigures",
    "NodeView",
    "Scratch",
    "Stage",
    "describe_reason",
    "first_excluding",
    "first_failed",
    "narrow",
]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Stage(Enum):
    """Which budget a check guards (admission's ``reserve`` runs only the held stages)."""

    CORDON = "cordon"
    PLATFORM = "platform"
    HARD = "hard"
    OVERCOMMIT = "overcommit"
    SOFT = "soft"


HELD_STAGES = frozenset({Stage.HARD, Stage.OVERCOMMIT})
"""Stages judged on what reservations hold (not on the platform or the live load)."""


class NodeView(Protocol):
    """The figures of one node the checks read (a snapshot, or a budget's live view).

    ``platform`` is ``None`` for a node that runs anything (a bare budget in a test).  Sizes
    are bytes, bandwidths bytes/s, ``cpu_load`` the busy fraction of the machine,
    ``cpu_capacity`` cores; the ``oc_*`` figures are the β_max stage's reserved sums and
    ceilings (``0`` and ``+inf`` on a node that does not run it).
    """

    @property
    def platform(self) -> Platform | None: ...
    @property
    def cordoned(self) -> bool: ...
    @property
    def mem_free(self) -> int: ...
    @property
    def disk_free(self) -> int: ...
    @property
    def oc_vcpus_reserved(self) -> float: ...
    @property
    def oc_vcpus_ceiling(self) -> float: ...
    @property
    def oc_disk_bw_reserved(self) -> float: ...
    @property
    def oc_disk_bw_ceiling(self) -> float: ...
    @property
    def oc_net_bw_reserved(self) -> float: ...
    @property
    def oc_net_bw_ceiling(self) -> float: ...
    @property
    def cpu_load(self) -> float: ...
    @property
    def cpu_capacity(self) -> float: ...
    @property
    def cpu_max_load(self) -> float: ...
    @property
    def disk_bw_load(self) -> float: ...
    @property
    def disk_bw_ceiling(self) -> float: ...
    @property
    def net_bw_load(self) -> float: ...
    @property
    def net_bw_ceiling(self) -> float: ...


class NodeFigures(NamedTuple):
    """A :class:`NodeView` as plain values (the budget's live view, tests)."""

    platform: Platform | None
    mem_free: int
    disk_free: int
    cpu_load: float
    cpu_capacity: float
    cpu_max_load: float
    disk_bw_load: float
    disk_bw_ceiling: float
    net_bw_load: float
    net_bw_ceiling: float
    oc_vcpus_reserved: float = 0.0
    oc_vcpus_ceiling: float = math.inf
    oc_disk_bw_reserved: float = 0.0
    oc_disk_bw_ceiling: float = math.inf
    oc_net_bw_reserved: float = 0.0
    oc_net_bw_ceiling: float = math.inf
    cordoned: bool = False


@dataclass(slots=True)
class NodeColumns:
    """The :class:`NodeView` fields as columns over node slots (the engine's struct of arrays).

    ``platform_id`` holds each slot's platform as an id of ``platform_ids``.  Absent β_max
    ceilings are ``+inf``; ``overcommitting`` is ``False`` when no slot runs the β_max stage,
    so the over-commit checks, which would pass everywhere, skip their passes; likewise
    ``any_cordoned`` is ``False`` when no slot is cordoned, and the cordon check skips its.
    """

    platform_id: npt.NDArray[np.integer[Any]]
    platform_ids: Mapping[Platform, int]
    mem_free: IntArray
    disk_free: IntArray
    oc_vcpus_reserved: FloatArray
    oc_vcpus_ceiling: FloatArray
    oc_disk_bw_reserved: FloatArray
    oc_disk_bw_ceiling: FloatArray
    oc_net_bw_reserved: FloatArray
    oc_net_bw_ceiling: FloatArray
    cpu_load: FloatArray
    cpu_capacity: FloatArray
    cpu_max_load: FloatArray
    disk_bw_load: FloatArray
    disk_bw_ceiling: FloatArray
    net_bw_load: FloatArray
    net_bw_ceiling: FloatArray
    cordoned: BoolArray
    overcommitting: bool = field(default=True, init=False)
    any_cordoned: bool = field(default=True, init=False)


COLUMN_FIELDS: tuple[str, ...] = tuple(
    column.name
    for column in fields(NodeColumns)
    if column.init and column.name not in {"platform_id", "platform_ids"}
)
"""The numeric :class:`NodeView` fields, one column each in :class:`NodeColumns` (in the
order of its constructor's arguments after ``platform_id`` and ``platform_ids``)."""


class Scratch(NamedTuple):
    """Preallocated buffers (as long as the columns) a vectorised test computes into."""

    mask: BoolArray
    total: FloatArray


class Demand(NamedTuple):
    """What is asked of a node: the spec's amounts and the acceptable platforms.

    ``sized`` is ``False`` for a request without a spec: only the unsized checks (the
    platform) judge it, and the amounts are zero.
    """

    platforms: tuple[Platform, ...] = ()
    sized: bool = False
    vcpus: float = 0.0
    mem: int = 0
    disk: int = 0
    disk_bw: int = 0
    net_bw: int = 0

    @classmethod
    def of(cls, spec: Spec | None, platforms: Sequence[Platform] = ()) -> Demand:
        if spec is None:
            return cls(tuple(platforms))
        return cls(
            tuple(platforms), True, spec.vcpus, spec.mem, spec.disk, spec.disk_bw, spec.net_bw
        )


ScalarTest = Callable[[NodeView, Demand], bool]
VectorTest = Callable[[NodeColumns, Demand, BoolArray, Scratch], None]
Detail = Callable[[NodeView, Demand], str]


@dataclass(frozen=True)
class Check:
    """One named check (see the module docstring).

    * ``test(view, demand)`` — does the node pass?
    * ``narrow(columns, demand, fit, scratch)`` — the same test over every slot: clears the
      slots of ``fit`` that fail, computing in ``scratch`` so that it allocates nothing;
    * ``detail(view, demand)`` — the figures behind a failure, for a refusal's message;
    * ``group(demand)`` — how a summary names the nodes failing it (default: ``phrase``);
    * ``sized`` — reads the demand's amounts (skipped for a demand without a spec).
    """

    code: str
    phrase: str
    stage: Stage
    test: ScalarTest
    narrow: VectorTest
    detail: Detail
    group: Callable[[Demand], str] | None = None
    sized: bool = True

    def summary(self, demand: Demand) -> str:
        """The phrase for a group of nodes failing this check for ``demand``."""
        return self.phrase if self.group is None else self.group(demand)


class Filter(Protocol):
    """A fit rule beside the table, on what no node's figures hold (see the module docstring).

    One request's rule at one moment — a value: what it judges by (a copy of the replica
    counts, say) was fixed when it was made.  ``exclusion(node)`` is why ``node`` cannot take
    the request, ``None`` if it can; ``code`` names the excluded nodes in explanations and in
    ``NoCapacity`` (like a check's code) and ``described`` is the rule in words, for a summary
    ("3 excluded by hard spread (one replica per node)").
    """

    @property
    def code(self) -> str: ...

    @property
    def described(self) -> str: ...

    def exclusion(self, node: str) -> str | None: ...


# -- platform ------------------------------------------------------------------------------
def _wanted(demand: Demand) -> str:
    return ", ".join(str(platform) for platform in demand.platforms)


def _platform_test(view: NodeView, demand: Demand) -> bool:
    return view.platform is None or matches_any(view.platform, demand.platforms)


def _platform_narrow(
    columns: NodeColumns, demand: Demand, fit: BoolArray, scratch: Scratch
) -> None:
    if not demand.platforms:
        return
    known = columns.platform_ids
    ids = [known[platform] for platform in demand.platforms if platform in known]
    if not ids:
        fit[:] = False
    elif len(ids) == 1:
        np.equal(columns.platform_id, ids[0], out=scratch.mask)
        fit &= scratch.mask
    else:
        fit &= np.isin(columns.platform_id, ids)


PLATFORM = Check(
    code="platform_mismatch",
    phrase="platform not offered",
    stage=Stage.PLATFORM,
    test=_platform_test,
    narrow=_platform_narrow,
    detail=lambda view, demand: f"node runs {view.platform}, asked for {_wanted(demand)}",
    group=lambda demand: f"platform {_wanted(demand)} not offered",
    sized=False,
)


# -- cordon ----------------------------------------------------------------------------------
CORDONED_DETAIL = "it takes no new workloads until it is uncordoned"


def _cordon_narrow(columns: NodeColumns, demand: Demand, fit: BoolArray, scratch: Scratch) -> None:
    if not columns.any_cordoned:
        return  # no node is cordoned: the check passes everywhere
    np.logical_not(columns.cordoned, out=scratch.mask)
    fit &= scratch.mask


CORDONED = Check(
    code="cordoned",
    phrase="node cordoned",
    stage=Stage.CORDON,
    test=lambda view, demand: not view.cordoned,
    narrow=_cordon_narrow,
    detail=lambda view, demand: CORDONED_DETAIL,
    sized=False,
)


# -- the figures a refusal shows -------------------------------------------------------------
Amounts = Callable[..., tuple[str, ...]]
"""Figures of one kind (bytes, bytes a second, vCPUs) as a refusal's detail shows them."""


def _amounts(unit: Callable[..., str], *values: float) -> tuple[str, ...]:
    """``values`` in ``unit`` (``format_information``, ``format_bandwidth``), short — or exact
    where two different values would read alike ("128MiB asked, 128MiB free")."""
    rounded = [round(value) for value in values]

    def each(exact: bool) -> tuple[str, ...]:
        return tuple(
            ("-" if value < 0 else "") + unit(abs(value), exact=exact) for value in rounded
        )

    short = each(False)
    alike = len(set(short)) < len(set(rounded))
    return each(True) if alike else short


def _vcpus(count: float) -> str:
    return f"{count:g} vCPU" + ("" if count == 1 else "s")


def _vcpu_figures(*values: float) -> tuple[str, ...]:
    return tuple(_vcpus(value) for value in values)


def _bandwidth_figures(*values: float) -> tuple[str, ...]:
    return _amounts(format_bandwidth, *values)


# -- hard, over-commit and bandwidth checks ------------------------------------------------
# Each factory derives the vectorised test and the detail from field names; the scalar test is
# written out in the table below, so each rule reads as its formula (and stays fast in the
# reference ranker, which calls it once per node).  Property tests hold the two forms equal.
def _hard(resource: str, code: str, phrase: str, test: ScalarTest) -> Check:
    """``demand.<resource> <= view.<resource>_free`` (exact integers)."""
    asked = attrgetter(resource)
    free = attrgetter(f"{resource}_free")

    def narrow(columns: NodeColumns, demand: Demand, fit: BoolArray, scratch: Scratch) -> None:
        np.greater_equal(free(columns), asked(demand), out=scratch.mask)
        fit &= scratch.mask

    def detail(view: NodeView, demand: Demand) -> str:
        wanted, left = _amounts(format_information, asked(demand), free(view))
        return f"asks {wanted}, {left} free"

    return Check(code, phrase, Stage.HARD, test, narrow, detail)


def _narrow_sum(
    used: FloatArray, asked: float, ceiling: FloatArray, fit: BoolArray, scratch: Scratch
) -> None:
    """``fit &= used + asked <= ceiling``, computed in ``scratch`` (the over-commit and
    bandwidth checks' vectorised test)."""
    np.add(used, asked, out=scratch.total)
    np.less_equal(scratch.total, ceiling, out=scratch.mask)
    fit &= scratch.mask


def _overcommit(resource: str, code: str, phrase: str, unit: Amounts, test: ScalarTest) -> Check:
    """``oc_<resource>_reserved + demand.<resource> <= oc_<resource>_ceiling`` (β_max)."""
    asked = attrgetter(resource)
    reserved = attrgetter(f"oc_{resource}_reserved")
    ceiling = attrgetter(f"oc_{resource}_ceiling")

    def narrow(columns: NodeColumns, demand: Demand, fit: BoolArray, scratch: Scratch) -> None:
        if not columns.overcommitting:
            return  # every ceiling is +inf: the check passes everywhere
        _narrow_sum(reserved(columns), asked(demand), ceiling(columns), fit, scratch)

    def detail(view: NodeView, demand: Demand) -> str:
        wanted, held, most = unit(asked(demand), reserved(view), ceiling(view))
        return f"asks {wanted}, {held} reserved of a {most} over-commit ceiling"

    return Check(code, phrase, Stage.OVERCOMMIT, test, narrow, detail)


def _bandwidth(resource: str, code: str, phrase: str, test: ScalarTest) -> Check:
    """``<resource>_load + demand.<resource> <= <resource>_ceiling`` (bytes/s, live load)."""
    asked = attrgetter(resource)
    load = attrgetter(f"{resource}_load")
    ceiling = attrgetter(f"{resource}_ceiling")

    def narrow(columns: NodeColumns, demand: Demand, fit: BoolArray, scratch: Scratch) -> None:
        _narrow_sum(load(columns), asked(demand), ceiling(columns), fit, scratch)

    def detail(view: NodeView, demand: Demand) -> str:
        wanted, used, most = _amounts(format_bandwidth, asked(demand), load(view), ceiling(view))
        return f"asks {wanted}, {used} in use of a {most} ceiling"

    return Check(code, phrase, Stage.SOFT, test, narrow, detail)


# -- cpu load --------------------------------------------------------------------------------
def _cpu_test(view: NodeView, demand: Demand) -> bool:
    return view.cpu_load + demand.vcpus / view.cpu_capacity <= view.cpu_max_load


def _cpu_narrow(columns: NodeColumns, demand: Demand, fit: BoolArray, scratch: Scratch) -> None:
    # ``vcpus / capacity`` then ``+ load``: addition commutes exactly in IEEE arithmetic, so
    # this is bit-identical to the scalar ``load + vcpus / capacity``.
    np.divide(demand.vcpus, columns.cpu_capacity, out=scratch.total)
    np.add(scratch.total, columns.cpu_load, out=scratch.total)
    np.less_equal(scratch.total, columns.cpu_max_load, out=scratch.mask)
    fit &= scratch.mask


def _cpu_detail(view: NodeView, demand: Demand) -> str:
    share = demand.vcpus / view.cpu_capacity
    return (
        f"asks {_vcpus(demand.vcpus)} of {view.cpu_capacity:g} cores: load "
        f"{view.cpu_load:.1%} + {share:.1%} > {view.cpu_max_load:.1%} limit"
    )


CHECKS: tuple[Check, ...] = (
    CORDONED,
    PLATFORM,
    _hard(
        "mem",
        "mem_exhausted",
        "insufficient memory",
        lambda view, demand: demand.mem <= view.mem_free,
    ),
    _hard(
        "disk",
        "disk_exhausted",
        "insufficient disk",
        lambda view, demand: demand.disk <= view.disk_free,
    ),
    _overcommit(
        "vcpus",
        "cpu_overcommitted",
        "cpu over-commit ceiling reached",
        _vcpu_figures,
        lambda view, demand: view.oc_vcpus_reserved + demand.vcpus <= view.oc_vcpus_ceiling,
    ),
    _overcommit(
        "disk_bw",
        "disk_bw_overcommitted",
        "disk bandwidth over-commit ceiling reached",
        _bandwidth_figures,
        lambda view, demand: view.oc_disk_bw_reserved + demand.disk_bw <= view.oc_disk_bw_ceiling,
    ),
    _overcommit(
        "net_bw",
        "net_bw_overcommitted",
        "network bandwidth over-commit ceiling reached",
        _bandwidth_figures,
        lambda view, demand: view.oc_net_bw_reserved + demand.net_bw <= view.oc_net_bw_ceiling,
    ),
    Check("cpu_saturated", "cpu saturated", Stage.SOFT, _cpu_test, _cpu_narrow, _cpu_detail),
    _bandwidth(
        "disk_bw",
        "disk_bw_saturated",
        "disk bandwidth saturated",
        lambda view, demand: view.disk_bw_load + demand.disk_bw <= view.disk_bw_ceiling,
    ),
    _bandwidth(
        "net_bw",
        "net_bw_saturated",
        "network bandwidth saturated",
        lambda view, demand: view.net_bw_load + demand.net_bw <= view.net_bw_ceiling,
    ),
)
"""The fit rule, in the order checks are judged (the first failure is the verdict)."""


# -- walking the table ---------------------------------------------------------------------
def first_failed(view: NodeView, demand: Demand, checks: Sequence[Check] = CHECKS) -> Check | None:
    """The first check of ``checks`` that ``view`` fails for ``demand``; ``None`` if it fits."""
    if demand.sized:
        for check in checks:
            if not check.test(view, demand):
                return check
    else:
        for check in checks:
            if not check.sized and not check.test(view, demand):
                return check
    return None


def narrow(
    columns: NodeColumns,
    demand: Demand,
    fit: BoolArray,
    scratch: Scratch,
    checks: Sequence[Check] = CHECKS,
) -> None:
    """Clear every slot of ``fit`` that fails some check of ``checks`` (vectorised)."""
    sized = demand.sized
    for check in checks:
        if sized or not check.sized:
            check.narrow(columns, demand, fit, scratch)


def first_excluding(node: str, filters: Sequence[Filter]) -> tuple[Filter, str] | None:
    """The first filter of ``filters`` that excludes ``node``, with why; ``None`` if none does."""
    for each in filters:
        why = each.exclusion(node)
        if why is not None:
            return each, why
    return None


def describe_reason(code: str, checks: Sequence[Check] = CHECKS) -> str:
    """The human phrase for a reason code (codes of no check are returned as they are)."""
    for check in checks:
        if check.code == code:
            return check.phrase
    return code
