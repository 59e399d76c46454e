"""What berth asks of the JetStream streams under the buckets nodes write: no rollups.

A KV bucket's stream is created with rollup headers allowed (nats-py's ``create_key_value``
does, for ``KeyValue.purge``).  With them, anyone who may publish *one* key of the bucket may
erase them all: a message on its own key with ``Nats-Rollup: all`` purges the whole stream —
the security review's finding 2, a node's credentials emptying every other node's routes.
berth never rolls up (a route is removed with a delete, a node's routes with the stream purge
API, which a node's user may not call), so :func:`forbid_rollups` turns them off on the
buckets nodes write; the server then refuses any message carrying a rollup header there.

The scheduler services apply it when they start (their user may update those streams; a
node's may not), so a bucket an agent created first is closed as soon as a scheduler runs.

What it cannot close: the node-states bucket.  Its snapshots expire with *subject delete
markers* (how a watcher learns that a node went silent), and nats-server keeps rollups
allowed on a stream with markers — an update turning them off is accepted and ignored
(checked on nats-server 2.15.1).  So a node's user can still purge that bucket; the harm is
bounded by the heartbeat — every live node publishes again within one, and the replicas
take it back — where a purge of the routes was permanent.  Confining it needs a server-side
guard (an account per node writing through a republish, or JWT-scoped subjects): issue 21.
"""

from __future__ import annotations

import logging

from nats.aio.client import Client
from nats.errors import Error as NatsError

__all__ = ["forbid_rollups"]

log = logging.getLogger("berth.nats")


async def forbid_rollups(client: Client, bucket: str) -> bool:
    """Refuse rollup headers on ``bucket``'s stream from now on; whether this call changed
    it.  A stream that cannot be read or updated (missing, no permission) is logged and left:
    it is not this caller's to close."""
    js = client.jetstream()
    stream = f"KV_{bucket}"
    try:
        info = await js.stream_info(stream)
        if not info.config.allow_rollup_hdrs:
            return False
        info.config.allow_rollup_hdrs = False
        await js.update_stream(info.config)
    except (NatsError, TimeoutError) as error:
        log.warning("cannot forbid rollups on stream %s: %s", stream, error or type(error).__name__)
        return False
    log.info("stream %s refuses rollups", stream)
    return True
