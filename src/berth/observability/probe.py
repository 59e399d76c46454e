"""What one placement decision reports — its spans and its metrics — behind one small object.

The scheduler's walk (:meth:`berth.scheduler.multinode.ClusterScheduler.place`) tells a
probe what happens: a ranking, a confirmation asked of a node, a refusal, the node that
confirmed; the probe turns that into the ``berth.scheduler.place`` span (with a
``berth.scheduler.rank`` child per ranking and a ``berth.scheduler.confirm`` child per node
asked, refusals as events) and into :class:`~berth.observability.metrics.Metrics`.  The walk
keeps one way of saying what happened, whatever is listening.

With neither metrics nor tracing on, :func:`placement_probe` returns :data:`SILENT`, a shared
probe whose methods do nothing: the uninstrumented walk pays a few no-op calls.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import INVALID_SPAN, Span

from berth.observability import tracing
from berth.observability.outcomes import outcome_of, reason_of

if TYPE_CHECKING:  # the metrics (and prometheus-client) load only where they are made
    from berth.observability.metrics import Metrics

__all__ = ["SILENT", "PlacementProbe", "Probe", "placement_probe"]

_NOTHING: AbstractContextManager[Any] = contextlib.nullcontext()


class Probe:
    """A probe that reports nothing (the base of :class:`PlacementProbe`)."""

    __slots__ = ()

    def __enter__(self) -> Probe:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        return None

    def ranking(self) -> AbstractContextManager[Any]:
        """Around one ranking of the view."""
        return _NOTHING

    def confirming(self, node: str) -> AbstractContextManager[Any]:
        """Around one confirmation asked of ``node``."""
        return _NOTHING

    def refused(self, node: str, error: BaseException) -> None:
        """``node`` refused (``Refused``) or could not be reached (``Unavailable``)."""

    def placed(self, node: str, rank: int, colocated_bytes: int) -> None:
        """``node`` confirmed; it was at ``rank`` with ``colocated_bytes`` already there."""


SILENT = Probe()


class PlacementProbe(Probe):
    """Spans and metrics of one decision (see the module docstring); one use only."""

    __slots__ = (
        "_span",
        "_span_cm",
        "_started",
        "attempts",
        "layers",
        "metrics",
        "passes",
        "platforms",
        "spec",
    )

    def __init__(
        self,
        metrics: Metrics | None,
        spec: object,
        layers: Sequence[object],
        platforms: Sequence[object],
    ) -> None:
        self.metrics = metrics
        self.spec, self.layers, self.platforms = spec, layers, platforms
        self.attempts = 0
        self.passes = 0
        self._started = 0.0
        self._span_cm: AbstractContextManager[Span] | None = None
        self._span: Span = INVALID_SPAN

    def __enter__(self) -> PlacementProbe:
        if tracing.enabled():
            attributes = {
                "berth.spec": "none" if self.spec is None else str(self.spec),
                "berth.layers": len(self.layers),
                "berth.platforms": [str(platform) for platform in self.platforms],
            }
            self._span_cm = tracing.span("berth.scheduler.place", attributes=attributes)
            self._span = self._span_cm.__enter__()
        self._started = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        seconds = time.perf_counter() - self._started
        if self.metrics is not None:
            self.metrics.decided(error, seconds, self.attempts)
        if self._span_cm is not None:
            self._span.set_attributes(
                {
                    "berth.outcome": outcome_of(error),
                    "berth.attempts": self.attempts,
                    "berth.passes": self.passes,
                }
            )
            self._span_cm.__exit__(kind, error, trace)

    def ranking(self) -> AbstractContextManager[Any]:
        rerank = self.passes > 0
        self.passes += 1
        timer = _RankingTimer(self.metrics, rerank)
        if self._span_cm is None:
            return timer
        stack = contextlib.ExitStack()  # the rank span around the timer
        stack.enter_context(
            tracing.span("berth.scheduler.rank", attributes={"berth.pass": self.passes})
        )
        stack.enter_context(timer)
        return stack

    def confirming(self, node: str) -> AbstractContextManager[Any]:
        self.attempts += 1
        if self._span_cm is None:
            return _NOTHING
        return tracing.span("berth.scheduler.confirm", attributes={"berth.node": node})

    def refused(self, node: str, error: BaseException) -> None:
        if self.metrics is not None:
            self.metrics.refused(error)
        if self._span_cm is not None:
            self._span.add_event("refused", {"berth.node": node, "berth.reason": reason_of(error)})

    def placed(self, node: str, rank: int, colocated_bytes: int) -> None:
        if self._span_cm is not None:
            self._span.set_attributes(
                {"berth.node": node, "berth.rank": rank, "berth.colocated_bytes": colocated_bytes}
            )


class _RankingTimer:
    """Times one ranking into ``metrics`` — a failed one too (no node runs the platform)."""

    __slots__ = ("metrics", "rerank", "started")

    def __init__(self, metrics: Metrics | None, rerank: bool) -> None:
        self.metrics, self.rerank, self.started = metrics, rerank, 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.metrics is not None:
            self.metrics.ranked(time.perf_counter() - self.started, self.rerank)


def placement_probe(
    metrics: Metrics | None,
    spec: object = None,
    layers: Sequence[object] = (),
    platforms: Sequence[object] = (),
) -> Probe:
    """A probe for one decision of ``spec`` (layers, platforms: read for the span's attributes
    only when tracing is on); :data:`SILENT` when nothing listens."""
    if metrics is None and not tracing.enabled():
        return SILENT
    return PlacementProbe(metrics, spec, layers, platforms)
