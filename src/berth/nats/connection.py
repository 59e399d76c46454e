"""Connecting to NATS the way every berth process does: reconnect for ever, log, name yourself.

It sits beside the NATS state store, at the bottom of berth's NATS layer, so the store, the
node-client drivers and the services all use it without importing upwards.

A berth agent or scheduler is a long-lived service: when the server restarts it must come
back by itself (docs/design.md §5: the client reconnects at once and buffered publishes are
delivered), so the connection retries without limit, quickly, and reports disconnections and
asynchronous errors (a permission violation arrives that way) to the ``berth.nats`` logger
instead of nats-py's default of printing them.  A server that cannot be reached at all on the
first attempt is :class:`~berth.errors.Unavailable`, one clear line, not a traceback.

Reconnecting is not enough: nats-py closes a connection **for good** on most protocol errors
the server sends (``-ERR 'Maximum Control Line Exceeded'``, one: security finding 1), and a
closed client never comes back — the process would stay up but dead on NATS.  Such a process
must exit so that whatever supervises it (``berth up``, systemd) starts it again:
:func:`until_stopped` waits for a process's stop *or* for one of its connections to close by
itself, and raises :class:`ConnectionClosed` in the second case (the agent and scheduler
commands exit non-zero with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import ssl
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nats.aio.client import Client

from berth.errors import Invalid, Unavailable

__all__ = [
    "ConnectionClosed",
    "ConnectionLost",
    "Credentials",
    "connect",
    "request",
    "server_urls",
    "settle",
    "until_stopped",
]

log = logging.getLogger("berth.nats")


class _QuietTlsEof(logging.Filter):
    """Drops asyncio's "returning true from eof_received() has no effect when using ssl":
    nats-py's protocol answers a closing TLS peer that way, and asyncio warns about it on
    every TLS connection that ends — a line on each CLI command's stderr that says nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("returning true from eof_received()")


logging.getLogger("asyncio").addFilter(_QuietTlsEof())

# Per connection made by connect(): an event set at its next disconnection (then replaced).
_disconnections: weakref.WeakKeyDictionary[Client, asyncio.Event] = weakref.WeakKeyDictionary()
# Per connection made by connect(): an event set once it is closed (by close() or for good).
_closings: weakref.WeakKeyDictionary[Client, asyncio.Event] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Credentials:
    """A NATS user: its name and either a password or an **nkey** seed (``berth up`` makes
    one per role; nodes get nkeys).  With an nkey the server holds only the user's public key
    and the client proves it has the seed by signing the server's nonce: the server's
    configuration holds no secret of that user, and the seed never leaves the client."""

    user: str
    password: str | None = None
    seed: str | None = None
    """An nkey user seed (``SU…``), instead of a password."""

    def __post_init__(self) -> None:
        if (self.password is None) == (self.seed is None):
            raise Invalid(f"user {self.user!r} needs a password or an nkey seed: one of them")

    @classmethod
    def nkey(cls, user: str) -> Credentials:
        """``user`` with a fresh nkey (an Ed25519 key pair, encoded as NATS does)."""
        import nkeys  # type: ignore[import-untyped]  # (pynacl; only for nkey users)

        seed: bytes = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
        return cls(user, seed=seed.decode())

    @property
    def public_key(self) -> str | None:
        """The nkey's public key (``U…``, what the server's configuration names), or ``None``
        for a password user."""
        if self.seed is None:
            return None
        import nkeys

        pair = nkeys.from_seed(bytearray(self.seed.encode()))
        try:
            return str(pair.public_key.decode())
        finally:
            pair.wipe()

    @property
    def inbox_prefix(self) -> str:
        """This user's own inbox prefix: ``berth up``'s permissions let only it read there."""
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in self.user)
        return f"_INBOX_{safe}"

    def document(self) -> dict[str, str]:
        """What a credentials file holds (:meth:`load` reads it back)."""
        if self.seed is not None:
            return {"user": self.user, "seed": self.seed}
        assert self.password is not None  # one of them: __post_init__
        return {"user": self.user, "password": self.password}

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Credentials:
        """Read a credentials file (JSON: ``{"user": …, "password": …}`` or
        ``{"user": …, "seed": …}``); ``Invalid`` naming ``--creds`` otherwise."""
        where = os.fspath(path)
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise Invalid(
                f"cannot read credentials from {where}: {error}", field="--creds"
            ) from None
        if not isinstance(document, dict):
            raise Invalid(f"{where} is not a JSON object", field="--creds")
        user, password, seed = (document.get(key) for key in ("user", "password", "seed"))
        secrets_given = [value for value in (password, seed) if value is not None]
        if (
            not isinstance(user, str)
            or not user
            or len(secrets_given) != 1
            or not isinstance(secrets_given[0], str)
        ):
            raise Invalid(f"{where} needs a user and a password or an nkey seed", field="--creds")
        credentials = cls(user, password=password, seed=seed)
        if seed is not None:
            try:
                credentials.public_key  # noqa: B018  # raises for a seed that is not one
            except Exception:  # nkeys raises its own errors and binascii's for bad base32
                raise Invalid(
                    f"{where}: its seed is not an nkey user seed", field="--creds"
                ) from None
        return credentials


_SCHEMES = ("nats", "tls")


def server_urls(url: str, field: str = "--nats") -> list[str]:
    """The servers of ``url``: one NATS URL, or several comma-separated (the servers of one
    cluster: the client fails over between them); ``Invalid`` naming ``field`` and the
    entry for one that is not ``nats://HOST[:PORT]`` or ``tls://HOST[:PORT]`` (a bare
    ``HOST:PORT`` is ``nats://``, as nats-py reads it)."""
    if not isinstance(url, str):
        raise Invalid(f"expected NATS URLs, got {type(url).__name__}", field=field)
    servers = []
    for entry in (part.strip() for part in url.split(",")):
        server = entry if "://" in entry else f"nats://{entry}"  # as nats-py reads HOST:PORT
        try:
            parsed = urlsplit(server)
            parsed.port  # noqa: B018  # raises ValueError for a port that is not one
        except ValueError:
            parsed = None
        if (
            parsed is None
            or parsed.scheme not in _SCHEMES
            or not parsed.hostname
            or parsed.path not in ("", "/")
        ):
            raise Invalid(
                f"{entry!r} is not a NATS server URL (nats://HOST[:PORT] or tls://HOST[:PORT]; "
                "several comma-separated)",
                field=field,
            )
        servers.append(server)
    return servers


async def connect(
    url: str,
    *,
    name: str = "berth",
    credentials: Credentials | None = None,
    tls: ssl.SSLContext | None = None,
    connect_timeout_s: float = 2.0,
    first_connect_timeout_s: float = 5.0,
    reconnect_wait_s: float = 0.25,
    once: bool = False,
) -> Client:
    """A connection to ``url`` — one server's URL or a cluster's, comma-separated
    (:func:`server_urls`) — that reconnects without limit (see the module docstring); over
    TLS with ``tls`` (a client context, :meth:`berth.pki.TlsFiles.client_context`: the
    server checked against its CA, this client's certificate shown to it).

    ``once``: a one-shot caller's (a CLI command) — each server is tried once, quietly, and
    a failure is ``Unavailable`` at once with the first server's reason (refused, an
    authorization violation), not a retry loop that logs each attempt."""
    servers = server_urls(url)
    failures: list[Exception] = []

    async def on_error(error: Exception) -> None:
        if once:
            failures.append(error)
            return
        log.warning("%s: nats error: %s", name, error)

    async def on_disconnected() -> None:
        log.info("%s: disconnected from nats", name)
        lost = _disconnections.get(client)
        _disconnections[client] = asyncio.Event()  # for requests sent from now on
        if lost is not None:
            lost.set()

    async def on_reconnected() -> None:
        log.info("%s: reconnected to nats", name)

    async def on_closed() -> None:
        closed = _closings.get(client)
        if closed is not None:
            closed.set()

    options: dict[str, object] = {}
    if credentials is not None:
        if credentials.seed is not None:
            options["nkeys_seed_str"] = credentials.seed
        else:
            options["user"] = credentials.user
            options["password"] = credentials.password
        options["inbox_prefix"] = credentials.inbox_prefix
    if tls is not None:
        options["tls"] = tls
    client = Client()
    _disconnections[client] = asyncio.Event()
    _closings[client] = asyncio.Event()
    try:
        # Reconnecting for ever also retries the *first* connection for ever: bound that one.
        await asyncio.wait_for(
            client.connect(
                servers,
                name=name,
                connect_timeout=connect_timeout_s,  # type: ignore[arg-type]  # int in the stubs
                reconnect_time_wait=reconnect_wait_s,  # type: ignore[arg-type]
                # once: a try per server (allow_reconnect=False waits out the timeout instead)
                max_reconnect_attempts=1 if once else -1,
                allow_reconnect=True,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                closed_cb=on_closed,
                **options,  # type: ignore[arg-type]
            ),
            # once: a connect timeout per server (a refusal the nats client retries
            # regardless — a certificate it does not trust — ends there, not after 5 s)
            min(first_connect_timeout_s, connect_timeout_s * len(servers) + 0.5)
            if once
            else first_connect_timeout_s,
        )
    except Exception as error:  # nats-py raises several unrelated types for "cannot connect"
        with contextlib.suppress(Exception):
            await client.close()
        cause = failures[0] if failures else error
        detail = str(cause) or type(cause).__name__
        raise Unavailable(f"cannot connect to nats at {url}: {detail}") from None
    return client


async def settle(client: Client) -> None:
    """Return once the server has processed everything sent on ``client`` so far.

    nats-py's ``flush`` writes its PING straight to the socket, ahead of commands still in
    its own buffer, so it can return before a just-made subscription reached the server (a
    request from another connection then finds no responders — seen about once in a hundred
    tries on loopback).  The first round trip lets the buffer drain; the second PING follows
    everything.
    """
    await client.flush()
    await client.flush()


class ConnectionClosed(Unavailable):
    """A connection nats-py closed for good (it will never reconnect): exit and be restarted."""


async def until_stopped(stop: asyncio.Event, clients: Sequence[Client]) -> None:
    """Return once ``stop`` is set; raise :class:`ConnectionClosed` — naming the connection
    and the server's last error — if one of ``clients`` (made by :func:`connect`) is closed
    first, which only nats-py itself does (see the module docstring)."""
    watched = [(client, _closings[client]) for client in clients if client in _closings]
    waits = [asyncio.ensure_future(stop.wait())]
    waits += [asyncio.ensure_future(closed.wait()) for _, closed in watched]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    if stop.is_set():
        return
    client = next(client for client, closed in watched if closed.is_set())
    error = client.last_error
    detail = "" if error is None else f": {str(error) or type(error).__name__}"
    name = client.options.get("name") or "berth"
    log.error("%s: the nats connection was closed for good%s", name, detail)
    raise ConnectionClosed(
        f"the NATS connection of {name} was closed for good{detail}; exiting so that "
        "whatever supervises this process starts it again"
    )


class ConnectionLost(Unavailable):
    """The connection dropped while a request was out: its outcome is unknown."""


async def request(
    client: Client,
    subject: str,
    payload: bytes,
    timeout_s: float,
    *,
    headers: dict[str, str] | None = None,
) -> Any:
    """``client.request`` that fails at once with :class:`ConnectionLost` if the connection
    drops while waiting.

    nats-py keeps waiting for the reply to a request sent before a disconnection, though a
    restarted server will never deliver it; a caller would sit out the whole timeout.  Short
    requests (``timeout_s`` up to 1 s) skip the race: it costs a task per call.
    """
    lost = _disconnections.get(client)
    if timeout_s <= 1.0 or lost is None:
        return await client.request(subject, payload, timeout_s, headers=headers)
    asked = asyncio.ensure_future(client.request(subject, payload, timeout_s, headers=headers))
    dropped = asyncio.ensure_future(lost.wait())
    try:
        done, _ = await asyncio.wait({asked, dropped}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the caller gave up (a wait_for of its own): so does the request
        asked.cancel()  # else it ends in a timeout nobody reads ("never retrieved" in the log)
        raise
    finally:
        dropped.cancel()
    if asked in done:
        return asked.result()
    asked.cancel()
    raise ConnectionLost(f"the connection to nats dropped while {subject} was out")
