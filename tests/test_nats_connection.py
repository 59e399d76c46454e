"""A connection nats-py closes for good (security finding 1, its second half), on a real
nats-server: a protocol error the server answers with ``-ERR`` (here a control line over the
server's limit) closes the client for ever; :func:`berth.nats.connection.until_stopped` —
what ``berth agent`` and ``berth scheduler`` wait on — then raises ``ConnectionClosed``
naming the connection and the server's error, so the process exits and is restarted instead
of staying up dead on NATS.  A stop, and a close berth asked for after it, raise nothing."""

from __future__ import annotations

import asyncio

import pytest

from berth.errors import Unavailable
from berth.nats.connection import ConnectionClosed, connect, until_stopped
from berth.testing.nats import NatsServer


def test_a_connection_closed_for_good_ends_the_wait_with_a_clear_error(
    nats_server: NatsServer,
) -> None:
    async def scenario() -> None:
        client = await connect(nats_server.url, name="berth-test-closed")
        other = await connect(nats_server.url, name="berth-test-healthy")
        stop = asyncio.Event()
        waiting = asyncio.create_task(until_stopped(stop, [other, client]))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await client.publish("x" * 5000, b"")  # over the server's 4 KiB control line
        with pytest.raises(ConnectionClosed) as caught:
            await asyncio.wait_for(waiting, 5.0)
        message = str(caught.value)
        assert "berth-test-closed" in message and "closed for good" in message
        assert "control line" in message.lower(), message
        assert isinstance(caught.value, Unavailable)
        assert client.is_closed and other.is_connected  # only that one is gone
        await other.close()

    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_a_stop_ends_the_wait_and_the_close_after_it_raises_nothing(
    nats_server: NatsServer,
) -> None:
    async def scenario() -> None:
        client = await connect(nats_server.url, name="berth-test-stopped")
        stop = asyncio.Event()
        waiting = asyncio.create_task(until_stopped(stop, [client]))
        stop.set()
        await asyncio.wait_for(waiting, 5.0)
        await client.close()
        await until_stopped(stop, [client])  # stopped already: returns at once

    asyncio.run(asyncio.wait_for(scenario(), 20))
