"""A connection nats-py closes for good (security finding 1, its second half), on a real
nats-server: a protocol error the server answers with ``-ERR`` (here a control line over the
server's limit) closes the client for ever; :func:`berth.nats.connection.until_stopped` —
what ``berth agent`` and ``berth scheduler`` wait on — then raises ``ConnectionClosed``
naming the connection and the server's error, so the process exits and is restarted instead
of staying up dead on NATS.  A stop, and a close berth asked for after it, raise nothing."""

from __future__ import annotations

import asyncio
import gc

import pytest

from berth.errors import Invalid, Unavailable
from berth.nats.connection import (
    ConnectionClosed,
    connect,
    request,
    server_urls,
    until_stopped,
)
from berth.processes.up import free_port
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


def test_a_request_its_caller_gives_up_on_leaves_no_task_behind(nats_server: NatsServer) -> None:
    """A caller's own timeout (``wait_for``, as the API's node status has) cancels the
    request: nothing runs on to end in a timeout nobody reads — which the event loop logged,
    traceback and all, as "Task exception was never retrieved"."""

    async def scenario() -> list[dict[str, object]]:
        unread: list[dict[str, object]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: unread.append(context))
        client = await connect(nats_server.url, name="berth-test-given-up")
        silent = await client.subscribe("berth.test.silent")  # takes it, never answers
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(request(client, "berth.test.silent", b"", 1.5), 0.1)
        await asyncio.sleep(1.8)  # past the request's own timeout
        await silent.unsubscribe()
        await client.close()
        gc.collect()  # an unread exception is reported when its task is collected
        await asyncio.sleep(0)
        return unread

    unread = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert not [c for c in unread if "never retrieved" in str(c.get("message"))], unread


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


@pytest.mark.parametrize(
    ("url", "servers"),
    [
        ("nats://127.0.0.1:4222", ["nats://127.0.0.1:4222"]),
        ("nats://a:1, tls://b:2,c:3", ["nats://a:1", "tls://b:2", "nats://c:3"]),
        ("nats://[::1]:4222", ["nats://[::1]:4222"]),
        ("nats://host", ["nats://host"]),
    ],
)
def test_server_urls_are_one_or_several_comma_separated(url: str, servers: list[str]) -> None:
    assert server_urls(url) == servers


@pytest.mark.parametrize(
    "url", ["", "http://a:1", "nats://a:1,", "nats://a:port", "nats://:1", "nats://a:1/x"]
)
def test_a_bad_server_url_is_refused_naming_the_flag_and_the_entry(url: str) -> None:
    with pytest.raises(Invalid) as refused:
        server_urls(url)
    assert refused.value.field == "--nats" and "is not a NATS server URL" in str(refused.value)


def test_a_client_given_several_servers_fails_over_from_a_dead_one(
    nats_server: NatsServer,
) -> None:
    """The first URL names a port nothing listens on: the connection takes the next."""
    dead = f"nats://127.0.0.1:{free_port('127.0.0.1')}"

    async def scenario() -> None:
        connection = await connect(f"{dead},{nats_server.url}", name="berth-test-failover")
        try:
            assert connection.is_connected
            assert connection.connected_url is not None
            assert connection.connected_url.port == int(nats_server.url.rsplit(":", 1)[1])
        finally:
            await connection.close()
        with pytest.raises(Unavailable, match="cannot connect"):
            await connect(dead, first_connect_timeout_s=1.0)

    asyncio.run(asyncio.wait_for(scenario(), 20))
