"""A placement decision's outcome and a refusal's reason, as the short words berth reports.

One rule for both of the decision's reports — the metrics' labels
(:mod:`berth.observability.metrics`) and the span's attributes
(:mod:`berth.observability.probe`) — kept apart from the metrics so that a scheduler that
measures nothing (and ``import berth``) never loads prometheus-client.
"""

from __future__ import annotations

import asyncio

from berth.errors import Invalid, NoCapacity, Unavailable

__all__ = ["outcome_of", "reason_of"]


def outcome_of(error: BaseException | None) -> str:
    """A decision's outcome label: ``placed`` (no error), ``no_capacity``, ``invalid`` (bad
    input, ``NoMatchingPlatform`` included), ``unavailable`` (a decision cancelled — its
    scheduler is shutting down — included) or ``error``."""
    if error is None:
        return "placed"
    if isinstance(error, NoCapacity):
        return "no_capacity"
    if isinstance(error, Invalid):
        return "invalid"
    if isinstance(error, Unavailable | asyncio.CancelledError):  # cancelled: shutting down
        return "unavailable"
    return "error"


def reason_of(error: BaseException) -> str:
    """A refusal's reason code (``Refused.reason``); ``unavailable`` for an unreachable node."""
    reason = getattr(error, "reason", None)
    if isinstance(reason, str) and reason:
        return reason
    if isinstance(error, Unavailable):
        return "unavailable"
    return type(error).__name__.lower()
