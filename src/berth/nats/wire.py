"""berth's wire format on NATS: the envelope, its version, the error codec, malformed messages.

Every berth message on NATS — a node's snapshot in the nodes bucket
(:mod:`berth.store.nats`), a request to a node (:mod:`berth.nodeclient.nats`,
:mod:`berth.nodeclient.nats_server`) or to the schedulers' queue group
(:mod:`berth.scheduler.nats`, :mod:`berth.scheduler.nats_server`) and their replies — is read
and written here, so the format is written down once and each protocol only names its
operations and fields:

* **the envelope** — a JSON object with ``"v": 1`` (:data:`SCHEMA_VERSION`) and the
  message's fields: :func:`encode_request` writes it, :func:`decode_document` reads it back
  (the version checked), :func:`field_of` and :func:`model_of` read its fields;
* **documents** — what berth stores or streams rather than asks: a node's snapshot in the
  nodes bucket (``state``, :mod:`berth.store.nats`), a workload event on the events stream
  (``event``, :mod:`berth.events.nats`), an API record in the API's bucket (``document``,
  :mod:`berth.registry.nats`) — is the same envelope around one model under one name,
  ``{"v": 1, "<name>": {…}}``: :func:`encode_body` and :func:`encode_model` write it,
  :func:`body_of` reads it back.  A route (:mod:`berth.registry.nats_routes`) is an envelope
  of fields, like a request.  Events and API records were written bare (the model's JSON, no
  version) by the previous release: :func:`body_of` reads that form too when asked
  (``bare=True``) — for this release only, so the records already stored and the events of
  agents not yet upgraded are still read; the next release drops it;
* **replies** — ``{"v": 1, "ok": value}`` or ``{"v": 1, "error": {"kind": …}}``.  A
  protocol's :class:`Replies` lists the error kinds it carries, each an :class:`ErrorKind`
  (the exception, its body, the exception a body gives back): a node carries ``refused``
  (the node's ``reason`` code, ``detail`` and ``node``) and ``invalid`` (``field``,
  ``message``) — :data:`NODE_REPLIES`; the schedulers carry ``no_matching_platform``
  (``requested``, ``offered``), ``no_capacity`` (``message``, every node's ``reasons``) and
  ``unavailable`` (``message``) besides — :data:`PLACEMENT_REPLIES`.  Any other exception is
  ``failed`` (the server could not do it; retrying may help), which the caller reads as
  ``Unavailable``; the rest cross the network as themselves;
* **malformed messages** — data from the network that berth cannot accept (unreadable,
  another version, a field of the wrong type, an invalid value) is
  :class:`MalformedMessage`, an ``Invalid`` naming the field and where the message came from:
  a server answers it ``invalid`` and changes nothing (:class:`Responder` counts and logs
  it), a watch logs and skips it.  A *reply* a caller cannot read is :class:`BadReply` (an
  ``Unavailable``: the peer misbehaved, and a walk moves on);
* **operations** — a server answers each operation from a table, operation name →
  :class:`Operation` (its request's decoder, its handler), so adding one is a new row, never
  a new branch (:func:`perform`).

Also here, because every NATS module needs them: node names as one subject token or KV key
(:func:`node_token` escapes every character outside ``[A-Za-z0-9_-]`` as ``=XX``, the hex of
its UTF-8 bytes: ``node.1`` → ``node=2E1``; a token that would be longer than
:data:`MAX_TOKEN` — a name of 253 emoji escapes to 3,036 characters, and a KV key or subject
over the server's 4 KiB control line closes the connection for good — is ``=H`` and the
SHA-256 of the name instead, which no escaped name can be), the KV headers that mark
deletes and expiry markers, and the node protocol's addressing — one subject per node and operation,
``berth.node.<node token>.<op>`` (:func:`subject`; per-node subjects are what lets NATS
permissions say "this agent answers only for itself"), an ``admit`` carrying an idempotency
key in the :data:`IDEMPOTENCY_HEADER` header.  The node protocol's operations and fields are
:class:`~berth.nodeclient.nats_server.NodeServer`'s table; the schedulers' are
:class:`~berth.scheduler.nats_server.SchedulerService`'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

from nats.aio.msg import Msg
from pydantic import BaseModel

from berth.errors import Invalid, NoCapacity, NoMatchingPlatform, Unavailable
from berth.nats.names import NODE_PREFIX
from berth.ownership import Refused
from berth.validation import BerthModel

__all__ = [
    "IDEMPOTENCY_HEADER",
    "INVALID",
    "KV_OPERATION",
    "MARKER_REASON",
    "NODE_REPLIES",
    "NO_CAPACITY",
    "NO_MATCHING_PLATFORM",
    "PLACEMENT_REPLIES",
    "PREFIX",
    "REFUSED",
    "SCHEMA_VERSION",
    "UNAVAILABLE",
    "BadReply",
    "ErrorKind",
    "MalformedMessage",
    "Operation",
    "Replies",
    "Responder",
    "body_of",
    "decode_document",
    "encode",
    "encode_body",
    "encode_model",
    "encode_request",
    "field_of",
    "model_of",
    "no_fields",
    "node_token",
    "ok_reply",
    "perform",
    "subject",
]

T = TypeVar("T")
M = TypeVar("M", bound=BerthModel)

SCHEMA_VERSION = 1
PREFIX = NODE_PREFIX
IDEMPOTENCY_HEADER = "Berth-Idempotency-Key"
KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"  # nats-server >= 2.11: a limit marker (expiry)
_SAFE = re.compile(r"[A-Za-z0-9_-]")
MAX_TOKEN = 200
"""The longest token :func:`node_token` writes out; a longer one becomes a digest (a key of
two tokens, a subject or a credentials file name then stays well within every limit)."""


class MalformedMessage(Invalid):
    """Data from the network that berth cannot accept: ``source`` says where it came from."""

    def __init__(self, message: str, *, source: str, field: str | None = None) -> None:
        self.source = source
        super().__init__(f"malformed message on {source}: {message}", field=field)


class BadReply(Unavailable):
    """A peer answered with something that is not a berth reply (named, logged, never trusted)."""


# -- names ---------------------------------------------------------------------------------
def node_token(node: str) -> str:
    """``node`` as one NATS subject token / KV key (see the module docstring)."""
    if not node:
        raise Invalid("must not be empty", field="node")
    token = "".join(
        ch if _SAFE.fullmatch(ch) else "".join(f"={byte:02X}" for byte in ch.encode())
        for ch in node
    )
    if len(token) <= MAX_TOKEN:
        return token
    return "=H" + hashlib.sha256(node.encode("utf-8", "surrogatepass")).hexdigest()


def subject(node: str, operation: str, prefix: str = PREFIX) -> str:
    """``<prefix>.<node token>.<operation>``: where ``node`` answers ``operation``."""
    return f"{prefix}.{node_token(node)}.{operation}"


# -- the envelope ----------------------------------------------------------------------------
def encode(document: Mapping[str, Any]) -> bytes:
    """``document`` as compact JSON (no NaN or infinity: they are not JSON)."""
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def encode_request(fields: Mapping[str, Any]) -> bytes:
    """A request: the envelope around ``fields``."""
    return encode({"v": SCHEMA_VERSION, **fields})


def ok_reply(value: Any) -> bytes:
    """The reply that carries ``value``."""
    return encode({"v": SCHEMA_VERSION, "ok": value})


def _json_object(data: bytes, *, source: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedMessage(f"not JSON ({error})", source=source) from None
    except RecursionError:
        raise MalformedMessage("nested too deeply", source=source) from None
    if not isinstance(document, dict):
        raise MalformedMessage("not a JSON object", source=source)
    return document


def decode_document(data: bytes, *, source: str) -> dict[str, Any]:
    """A message's fields; :class:`MalformedMessage` when it is not a berth message of this
    version."""
    document = _json_object(data, source=source)
    if document.get("v") != SCHEMA_VERSION:
        raise MalformedMessage(
            f"schema version {document.get('v')!r}, this berth reads {SCHEMA_VERSION}",
            source=source,
            field="v",
        )
    return document


def encode_body(name: str, body: bytes) -> bytes:
    """The envelope around one document already written as JSON: ``{"v": 1, "<name>":
    <body>}`` (a node's snapshot is written this way on every heartbeat: no second pass)."""
    return b'{"v":%d,"%s":%s}' % (SCHEMA_VERSION, name.encode(), body)


def encode_model(name: str, model: BaseModel) -> bytes:
    """The envelope around ``model`` under ``name`` (see the module docstring)."""
    return encode_body(name, model.model_dump_json().encode())


def body_of(data: bytes, name: str, *, source: str, bare: bool = False) -> Any:
    """The document under ``name`` in an envelope (not yet validated: the caller's model
    does that); :class:`MalformedMessage` when there is none.  ``bare``: a JSON object with
    no ``"v"`` at all is the form written before the envelope, returned whole."""
    document = _json_object(data, source=source)
    if bare and "v" not in document:
        return document
    if document.get("v") != SCHEMA_VERSION:
        raise MalformedMessage(
            f"schema version {document.get('v')!r}, this berth reads {SCHEMA_VERSION}",
            source=source,
            field="v",
        )
    if name not in document:
        raise MalformedMessage(f"no {name!r} in the envelope", source=source, field=name)
    return document[name]


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


def model_of(kind: type[M], document: dict[str, Any], name: str, *, source: str) -> M:
    """``document[name]`` validated as a ``kind``; its invalid field named under ``name``
    (``spec.mem``)."""
    try:
        return kind.from_dict(document.get(name))
    except Invalid as error:
        field = f"{name}.{error.field}" if error.field else name
        raise MalformedMessage(error.message, source=source, field=field) from None


# -- the error codec -------------------------------------------------------------------------
@dataclass(frozen=True)
class ErrorKind:
    """One kind of error reply: ``kind`` carries the exceptions of type ``carries``;
    ``body`` gives an exception's fields (after ``kind``), ``raised`` the exception a body
    read on ``source`` stands for (or raises :class:`BadReply` when it cannot say)."""

    kind: str
    carries: type[Exception]
    body: Callable[[Any], dict[str, Any]]
    raised: Callable[[dict[str, Any], str], Exception]


def _refused(body: dict[str, Any], source: str) -> Refused:
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason:
        raise BadReply(f"a refusal without a reason on {source}")
    node = body.get("node")
    return Refused(
        reason, str(body.get("detail") or ""), node=node if isinstance(node, str) else None
    )


def _invalid(body: dict[str, Any], source: str) -> Invalid:
    field = body.get("field")
    return Invalid(
        str(body.get("message") or "invalid"), field=field if isinstance(field, str) else None
    )


def _no_matching_platform(body: dict[str, Any], source: str) -> NoMatchingPlatform:
    requested = body.get("requested")
    if not isinstance(requested, list):
        raise BadReply(f"a malformed error reply on {source}")
    return NoMatchingPlatform(tuple(map(str, requested)), str(body.get("offered") or ""))


def _no_capacity(body: dict[str, Any], source: str) -> NoCapacity:
    reasons = body.get("reasons")
    return NoCapacity(
        str(body.get("message") or "no capacity"),
        {str(k): str(v) for k, v in reasons.items()} if isinstance(reasons, dict) else {},
    )


REFUSED = ErrorKind(
    "refused",
    Refused,
    lambda error: {"reason": error.reason, "detail": error.detail, "node": error.node},
    _refused,
)
INVALID = ErrorKind(
    "invalid", Invalid, lambda error: {"field": error.field, "message": error.message}, _invalid
)
NO_MATCHING_PLATFORM = ErrorKind(
    "no_matching_platform",
    NoMatchingPlatform,
    lambda error: {"requested": list(error.requested), "offered": error.offered},
    _no_matching_platform,
)
NO_CAPACITY = ErrorKind(
    "no_capacity",
    NoCapacity,
    lambda error: {"message": str(error), "reasons": error.reasons},
    _no_capacity,
)
UNAVAILABLE = ErrorKind(
    "unavailable",
    Unavailable,
    lambda error: {"message": str(error)},
    lambda body, source: Unavailable(str(body.get("message") or "unavailable")),
)


class Replies:
    """The replies of one protocol: ``ok``, or an error of one of ``kinds`` (the first that
    carries it: a subclass before its base), else ``failed``."""

    def __init__(self, *kinds: ErrorKind) -> None:
        self.kinds = kinds
        self.carried = tuple(kind.carries for kind in kinds)
        """The exceptions a server answers as themselves (any other one is a failure)."""
        self._by_kind = {kind.kind: kind for kind in kinds}

    def error(self, error: BaseException) -> bytes:
        """The reply that carries ``error``."""
        for kind in self.kinds:
            if isinstance(error, kind.carries):
                body = {"kind": kind.kind, **kind.body(error)}
                break
        else:
            body = {"kind": "failed", "message": f"{type(error).__name__}: {error}"}
        return encode({"v": SCHEMA_VERSION, "error": body})

    def read(self, data: bytes, *, source: str) -> Any:
        """The ``ok`` value of a reply; the server's error raised as itself
        (:meth:`raise_error`)."""
        try:
            document = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise BadReply(f"unreadable reply on {source}: {data[:80]!r}") from None
        if not isinstance(document, dict) or document.get("v") != SCHEMA_VERSION:
            raise BadReply(f"not a berth reply on {source}: {data[:80]!r}")
        if "error" in document:
            self.raise_error(document["error"], source=source)
        if "ok" not in document:
            raise BadReply(f"a reply with neither ok nor error on {source}")
        return document["ok"]

    def raise_error(self, body: Any, *, source: str) -> NoReturn:
        """Raise what an error reply's ``body`` says (see the module docstring)."""
        if not isinstance(body, dict):
            raise BadReply(f"a malformed error reply on {source}: {body!r}")
        kind = body.get("kind")
        known = self._by_kind.get(kind) if isinstance(kind, str) else None
        if known is not None:
            raise known.raised(body, source)
        if kind == "failed":
            raise Unavailable(f"the node failed on {source}: {body.get('message')}")
        raise BadReply(f"an error reply of unknown kind {kind!r} on {source}")


NODE_REPLIES = Replies(REFUSED, INVALID)
"""A node's replies: its refusals and invalid requests as themselves."""

PLACEMENT_REPLIES = Replies(NO_MATCHING_PLATFORM, NO_CAPACITY, UNAVAILABLE, REFUSED, INVALID)
"""The schedulers' replies: also why nothing was placed (no platform, no capacity, no node)."""


# -- the server side -------------------------------------------------------------------------
@dataclass(frozen=True)
class Operation(Generic[T]):
    """One operation a server answers: ``read`` decodes its request (the envelope's document
    and the message, for its subject and headers) or raises :class:`MalformedMessage`;
    ``run`` answers the decoded request with the reply's ``ok`` value."""

    read: Callable[[dict[str, Any], Msg], T]
    run: Callable[[T], Awaitable[Any]]


def no_fields(document: dict[str, Any], msg: Msg) -> None:
    """The decoder of an operation whose request carries nothing but the envelope."""
    return None


async def perform(
    operations: Mapping[str, Operation[Any]], name: str, document: dict[str, Any], msg: Msg
) -> Any:
    """Answer ``document`` with operation ``name`` of ``operations``."""
    operation = operations.get(name)
    if operation is None:
        raise MalformedMessage(f"unknown operation {name!r}", source=msg.subject)
    return await operation.run(operation.read(document, msg))


class Responder:
    """What every berth server does with a request, whatever its protocol: drop a message
    without a reply subject (nobody could learn its outcome), read the envelope, answer the
    errors ``replies`` carries as themselves, count and log a malformed request on ``log``
    (``rejected: …``), log any other failure (``<failed> <subject>``, with its traceback) and
    answer it ``failed``."""

    def __init__(self, replies: Replies, log: logging.Logger, *, failed: str) -> None:
        self.replies = replies
        self.log = log
        self.failed = failed
        self.rejected = 0
        """Requests refused as malformed, and messages dropped (each one logged)."""

    def unanswerable(self, msg: Msg) -> bool:
        """Whether ``msg`` has no reply subject (then it is counted, logged and dropped)."""
        if msg.reply:
            return False
        self.rejected += 1
        self.log.warning("ignored a message without a reply subject on %s", msg.subject)
        return True

    async def reply(
        self,
        msg: Msg,
        answer: Callable[[dict[str, Any]], Awaitable[Any]],
        *,
        malformed: Callable[[], None] | None = None,
    ) -> bytes:
        """The reply to ``msg``: what ``answer`` makes of its document, or the error it raised
        (``malformed`` is told of a malformed request, after it is counted)."""
        try:
            return ok_reply(await answer(decode_document(msg.data, source=msg.subject)))
        except MalformedMessage as error:
            self.rejected += 1
            self.log.warning("rejected: %s", error)
            if malformed is not None:
                malformed()
            return self.replies.error(error)
        except self.replies.carried as error:
            return self.replies.error(error)
        except Exception as error:
            self.log.exception("%s %s", self.failed, msg.subject)
            return self.replies.error(error)
