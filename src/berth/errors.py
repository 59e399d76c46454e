"""The error hierarchy every berth boundary raises.

berth distinguishes three kinds of failure, because callers react to them differently:

* ``Invalid`` — the request itself is wrong (a negative size, an unknown instance type, a
  malformed platform).  Retrying the same input never helps; the message names the field.
* ``NoCapacity`` — the request is valid but no node can hold it right now.  It carries every
  node's reason so an operator sees *why* ("20 insufficient memory, 25 refused at
  confirmation (cpu_saturated)"), not just that it failed.
* ``Unavailable`` — a transport or dependency failure; retrying later may succeed.

``NoMatchingPlatform`` *is an* ``Invalid``: an artifact built for platforms that no node runs
cannot become placeable by waiting.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BerthError", "Invalid", "NoCapacity", "NoMatchingPlatform", "Unavailable"]


class BerthError(Exception):
    """Base class of every error berth raises on purpose."""


class Invalid(BerthError, ValueError):
    """Malformed input.  ``field`` names the offending field or input when known."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class NoMatchingPlatform(Invalid):
    """No worker node runs any of the platforms the artifact provides.

    ``offered`` says what the nodes do run, e.g. ``"worker-1 (linux/amd64)"`` or
    ``"linux/amd64 on 40 nodes, linux/arm64/v8 on 10 nodes"``.
    """

    def __init__(self, requested: tuple[str, ...], offered: str) -> None:
        self.requested = requested
        self.offered = offered
        super().__init__(
            f"no worker node matches the artifact's platforms [{', '.join(requested)}]: "
            f"nodes offer {offered or 'nothing (no nodes)'}",
            field="platforms",
        )


class NoCapacity(BerthError):
    """A valid request that no node could hold.

    ``reasons`` maps each node that was considered to the reason it could not take the
    workload (a failed fit check on the snapshot, or the node's own refusal at confirmation).
    """

    def __init__(self, message: str, reasons: Mapping[str, str] | None = None) -> None:
        self.reasons: dict[str, str] = dict(reasons or {})
        super().__init__(message)


class Unavailable(BerthError):
    """A dependency (state store, node RPC) could not be reached; retrying may help."""
