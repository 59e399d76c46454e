"""Connecting to NATS the way every berth process does: reconnect for ever, log, name yourself.

It sits beside the NATS state store, at the bottom of berth's NATS layer, so the store, the
node-client drivers and the services all use it without importing upwards.

A berth agent or scheduler is a long-lived service: when the server restarts it must come
back by itself (docs/design.md §5: the client reconnects at once and buffered publishes are
delivered), so the connection retries without limit, quickly, and reports disconnections and
asynchronous errors (a permission violation arrives that way) to the ``berth.nats`` logger
instead of nats-py's default of printing them.  A server that cannot be reached at all on the
first attempt is :class:`~berth.errors.Unavailable`, one clear line, not a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from berth.errors import Invalid, Unavailable

__all__ = ["ConnectionLost", "Credentials", "connect", "request", "settle"]

log = logging.getLogger("berth.nats")

# Per connection made by connect(): an event set at its next disconnection (then replaced).
_disconnections: weakref.WeakKeyDictionary[Client, asyncio.Event] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Credentials:
    """A NATS user and password (``berth up`` generates one per role)."""

    user: str
    password: str

    @property
    def inbox_prefix(self) -> str:
        """This user's own inbox prefix: ``berth up``'s permissions let only it read there."""
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in self.user)
        return f"_INBOX_{safe}"

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Credentials:
        """Read a credentials file (JSON: ``{"user": …, "password": …}``)."""
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise Invalid(
                f"cannot read credentials from {os.fspath(path)}: {error}", field="--creds"
            ) from None
        user, password = document.get("user"), document.get("password")
        if not isinstance(user, str) or not user or not isinstance(password, str):
            raise Invalid(f"{os.fspath(path)} needs a user and a password", field="--creds")
        return cls(user, password)


async def connect(
    url: str,
    *,
    name: str = "berth",
    credentials: Credentials | None = None,
    connect_timeout_s: float = 2.0,
    first_connect_timeout_s: float = 5.0,
    reconnect_wait_s: float = 0.25,
) -> Client:
    """A connection to ``url`` that reconnects without limit (see the module docstring)."""

    async def on_error(error: Exception) -> None:
        log.warning("%s: nats error: %s", name, error)

    async def on_disconnected() -> None:
        log.info("%s: disconnected from nats", name)
        lost = _disconnections.get(client)
        _disconnections[client] = asyncio.Event()  # for requests sent from now on
        if lost is not None:
            lost.set()

    async def on_reconnected() -> None:
        log.info("%s: reconnected to nats", name)

    options: dict[str, object] = {}
    if credentials is not None:
        options["user"] = credentials.user
        options["password"] = credentials.password
        options["inbox_prefix"] = credentials.inbox_prefix
    client = Client()
    _disconnections[client] = asyncio.Event()
    try:
        # Reconnecting for ever also retries the *first* connection for ever: bound that one.
        await asyncio.wait_for(
            client.connect(
                url,
                name=name,
                connect_timeout=connect_timeout_s,  # type: ignore[arg-type]  # int in the stubs
                reconnect_time_wait=reconnect_wait_s,  # type: ignore[arg-type]
                max_reconnect_attempts=-1,
                allow_reconnect=True,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                **options,  # type: ignore[arg-type]
            ),
            first_connect_timeout_s,
        )
    except Exception as error:  # nats-py raises several unrelated types for "cannot connect"
        with contextlib.suppress(Exception):
            await client.close()
        detail = str(error) or type(error).__name__
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
    finally:
        dropped.cancel()
    if asked in done:
        return asked.result()
    asked.cancel()
    raise ConnectionLost(f"the connection to nats dropped while {subject} was out")
