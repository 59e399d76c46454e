"""What berth asks of its JetStream streams: as many replicas as the cluster allows, and,
under the buckets nodes write, no rollups.

**Replicas** (:func:`stream_replicas`).  Every bucket and stream berth creates has
``min(3, servers)`` replicas, where ``servers`` is how many servers the creating client knows
— the URLs it was given plus those the server announced (a clustered nats-server sends its
peers' client URLs on connect).  One server: R1, as before; a cluster of three (``berth up
--nats-servers 3``, a real deployment): R3, so a stream keeps accepting writes while two of
its three servers live.  Whoever creates a bucket first decides it; an existing bucket is
used as it is.  A cluster that has just formed (or lost a server) may not place a replicated
stream yet — "no suitable peers for placement" — so creations go through
:func:`created`, which asks again for up to :data:`PLACEMENT_PATIENCE_S`.

A KV bucket's stream is created with rollup headers allowed (nats-py's ``create_key_value``
does, for ``KeyValue.purge``).  With them, anyone who may publish *one* key of the bucket may
erase them all: a message on its own key with ``Nats-Rollup: all`` purges the whole stream —
the security review's finding 2, a node's credentials emptying every other node's routes.
berth never rolls up (a route is removed with a delete, a node's routes with the stream purge
API, which a node's user may not call), so :func:`forbid_rollups` turns them off on the
buckets nodes write; the server then refuses any message carrying a rollup header there.

The scheduler services apply it when they start (their user may update those streams; a
node's may not), so a bucket an agent created first is closed as soon as a scheduler runs.

Rollups go with *subject delete markers*: nats-server keeps rollups allowed on a stream with
markers — an update turning them off alone is accepted and ignored (nats-server 2.15.1) —,
so :func:`forbid_rollups` turns the markers off too.  The node-states bucket had them (how a
watcher learned that a node went silent); its readers now age their replicas themselves
(:mod:`berth.store.nats`), and no node's user can purge it any more (issue 36).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError

__all__ = ["MAX_REPLICAS", "PLACEMENT_PATIENCE_S", "created", "forbid_rollups", "stream_replicas"]

MAX_REPLICAS = 3
"""JetStream's usual replica count for a stream that must survive one server's loss."""


PLACEMENT_PATIENCE_S = 15.0
"""How long a bucket's or stream's creation is asked again while JetStream cannot place its
replicas yet (a cluster electing its leader, peers catching up)."""
NO_SUITABLE_PEERS = 10005
"""JetStream's error code for a stream whose replicas cannot be placed (yet)."""

T = TypeVar("T")


async def created(create: Callable[[], Awaitable[T]], what: str) -> T:
    """``await create()``, asked again every 0.25 s while JetStream cannot place its
    replicas (:data:`NO_SUITABLE_PEERS`, or a 503 from a JetStream not ready) or does not
    answer (a timeout, no responder: a cluster still electing its leaders, a connection
    failing over), for up to :data:`PLACEMENT_PATIENCE_S`; any other error at once.  Asking
    again is safe: creating a stream or bucket that exists with the same settings succeeds."""
    deadline = time.monotonic() + PLACEMENT_PATIENCE_S
    while True:
        try:
            return await create()
        except APIError as error:
            placing = error.err_code == NO_SUITABLE_PEERS or error.code == 503
            if not placing or time.monotonic() >= deadline:
                raise
            log.info("%s: JetStream cannot place it yet (%s); asking again", what, error)
        except (NatsTimeoutError, NoRespondersError) as error:
            if time.monotonic() >= deadline:
                raise
            log.info("%s: JetStream did not answer (%r); asking again", what, error)
        await asyncio.sleep(0.25)


def stream_replicas(client: Client) -> int:
    """How many replicas a bucket or stream ``client`` creates gets (see the module
    docstring): ``min(3, servers known)``, at least 1."""
    return max(1, min(MAX_REPLICAS, len(client.servers)))


log = logging.getLogger("berth.nats")


async def forbid_rollups(client: Client, bucket: str) -> bool:
    """Refuse rollup headers on ``bucket``'s stream from now on — its subject delete markers
    off too, which keep rollups on —; whether this call changed it.  A stream that cannot be
    read or updated (missing, no permission) is logged and left: it is not this caller's to
    close."""
    js = client.jetstream()
    stream = f"KV_{bucket}"
    try:
        info = await js.stream_info(stream)
        config = info.config
        if not config.allow_rollup_hdrs and not config.subject_delete_marker_ttl:
            return False
        config.allow_rollup_hdrs = False
        config.subject_delete_marker_ttl = None
        await js.update_stream(config)
    except (NatsError, TimeoutError) as error:
        log.warning("cannot forbid rollups on stream %s: %s", stream, error or type(error).__name__)
        return False
    log.info("stream %s refuses rollups", stream)
    return True
