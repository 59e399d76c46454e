"""The messages of admission over NATS request/reply: subjects, bodies, replies, errors.

Both ends of :mod:`berth.nodeclient.nats` (the scheduler's client) and
:mod:`berth.nodeclient.nats_server` (the node's responder) speak through this module, so the
protocol is written down once:

* **subjects** — one per node and operation, ``berth.node.<node>.<op>``, ``<node>`` the
  escaped node name (:func:`berth.store.nats.node_token`), ``<op>`` one of :data:`OPERATIONS`;
  per-node subjects are what lets NATS permissions say "this agent answers only for itself";
* **requests** — a JSON object with ``"v": 1`` and the operation's fields (``spec``,
  ``lease_ttl_s``, ``platforms``, ``reservation_id``, ``workload_id``, ``layers``, ``boot``;
  a ``stop`` may carry ``grace_s``, seconds from ``SIGTERM`` to ``SIGKILL``, a finite number
  from 0 to :data:`~berth.node.runtime.port.MAX_STOP_GRACE_S`, absent or null for the node's
  default);
  an ``admit`` carries an idempotency key in the ``Berth-Idempotency-Key`` header;
* **replies** — ``{"v": 1, "ok": value}`` or ``{"v": 1, "error": {"kind": …}}`` where the
  kind is ``refused`` (with the node's ``reason`` code, ``detail`` and ``node``), ``invalid``
  (``field``, ``message``) or ``failed`` (the node could not do it; retrying may help).

:func:`raise_error` turns an error reply back into the exception the node raised:
``Refused`` and ``Invalid`` cross the network as themselves; ``failed`` becomes
``Unavailable``.  A request the server cannot read is :class:`~berth.store.nats.MalformedMessage`
(an ``Invalid``: the server answers ``invalid`` and changes nothing); a reply the client cannot
read is :class:`BadReply` (an ``Unavailable``: the node misbehaved, and a walk moves on).
"""

from __future__ import annotations

import json
import re
from typing import Any

from berth.errors import Invalid, Unavailable
from berth.nats.names import NODE_PREFIX
from berth.ownership import Refused

__all__ = [
    "IDEMPOTENCY_HEADER",
    "KV_OPERATION",
    "MARKER_REASON",
    "OPERATIONS",
    "PREFIX",
    "SCHEMA_VERSION",
    "BadReply",
    "MalformedMessage",
    "decode_reply",
    "decode_request",
    "encode",
    "error_reply",
    "field_of",
    "node_token",
    "ok_reply",
    "raise_error",
    "subject",
]

PREFIX = NODE_PREFIX
SCHEMA_VERSION = 1
IDEMPOTENCY_HEADER = "Berth-Idempotency-Key"
OPERATIONS = ("admit", "bind", "release", "run", "stop", "status", "cordon", "uncordon")


KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"  # nats-server >= 2.11: a limit marker (expiry)
_SAFE = re.compile(r"[A-Za-z0-9_-]")


class MalformedMessage(Invalid):
    """Data from the network that berth cannot accept: ``source`` says where it came from."""

    def __init__(self, message: str, *, source: str, field: str | None = None) -> None:
        self.source = source
        super().__init__(f"malformed message on {source}: {message}", field=field)


def node_token(node: str) -> str:
    """``node`` as one NATS subject token / KV key (see the module docstring)."""
    if not node:
        raise Invalid("must not be empty", field="node")
    return "".join(
        ch if _SAFE.fullmatch(ch) else "".join(f"={byte:02X}" for byte in ch.encode())
        for ch in node
    )


class BadReply(Unavailable):
    """A node answered with something that is not a berth reply (named, logged, never trusted)."""


def subject(node: str, operation: str, prefix: str = PREFIX) -> str:
    """``<prefix>.<node token>.<operation>``."""
    return f"{prefix}.{node_token(node)}.{operation}"


def encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def ok_reply(value: Any) -> bytes:
    return encode({"v": SCHEMA_VERSION, "ok": value})


def error_reply(error: BaseException) -> bytes:
    """The reply that carries ``error`` (``Refused``, ``Invalid``, anything else: ``failed``)."""
    body: dict[str, Any]
    if isinstance(error, Refused):
        body = {"kind": "refused", "reason": error.reason, "detail": error.detail}
        body["node"] = error.node
    elif isinstance(error, Invalid):
        body = {"kind": "invalid", "field": error.field, "message": error.message}
    else:
        body = {"kind": "failed", "message": f"{type(error).__name__}: {error}"}
    return encode({"v": SCHEMA_VERSION, "error": body})


def decode_request(data: bytes, *, source: str) -> dict[str, Any]:
    """A request's fields; :class:`MalformedMessage` when it is not a berth request."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedMessage(f"not JSON ({error})", source=source) from None
    if not isinstance(document, dict):
        raise MalformedMessage("not a JSON object", source=source)
    if document.get("v") != SCHEMA_VERSION:
        raise MalformedMessage(
            f"schema version {document.get('v')!r}, this berth reads {SCHEMA_VERSION}",
            source=source,
            field="v",
        )
    return document


def field_of(
    document: dict[str, Any], name: str, kind: type | tuple[type, ...], *, source: str
) -> Any:
    """``document[name]``, which must be of ``kind`` (a bool is not an int here)."""
    value = document.get(name)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise MalformedMessage(
            f"missing or of the wrong type: {value!r}", source=source, field=name
        )
    return value


def decode_reply(data: bytes, *, source: str) -> Any:
    """The ``ok`` value of a reply; the node's error raised as itself (:func:`raise_error`)."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise BadReply(f"unreadable reply on {source}: {data[:80]!r}") from None
    if not isinstance(document, dict) or document.get("v") != SCHEMA_VERSION:
        raise BadReply(f"not a berth reply on {source}: {data[:80]!r}")
    if "error" in document:
        raise_error(document["error"], source=source)
    if "ok" not in document:
        raise BadReply(f"a reply with neither ok nor error on {source}")
    return document["ok"]


def raise_error(error: Any, *, source: str) -> None:
    """Raise what an error reply says (see the module docstring)."""
    if not isinstance(error, dict):
        raise BadReply(f"a malformed error reply on {source}: {error!r}")
    kind = error.get("kind")
    if kind == "refused":
        reason = error.get("reason")
        if not isinstance(reason, str) or not reason:
            raise BadReply(f"a refusal without a reason on {source}")
        node = error.get("node")
        raise Refused(
            reason,
            str(error.get("detail") or ""),
            node=node if isinstance(node, str) else None,
        )
    if kind == "invalid":
        field = error.get("field")
        raise Invalid(
            str(error.get("message") or "invalid"),
            field=field if isinstance(field, str) else None,
        )
    if kind == "failed":
        raise Unavailable(f"the node failed on {source}: {error.get('message')}")
    raise BadReply(f"an error reply of unknown kind {kind!r} on {source}")
