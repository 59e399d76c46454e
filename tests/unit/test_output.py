"""A workload's kept output, read a piece at a time: offsets, limits, UTF-8 never split,
and an agent that reads it from its runtime's log directory."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from berth.errors import Invalid
from berth.node.agent import Agent
from berth.node.budget import IDLE, BudgetLimits, NodeBudget
from berth.node.output import Kept, keep_output, read_output, trim_output
from berth.node.runtime import BootSpec, ProcessRuntime
from berth.store.memory import MemoryStore
from berth.units import GiB


def test_pieces_follow_offsets_and_never_split_a_character(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    path.write_bytes("héllo\n".encode())
    first = read_output(path, 0, 2)  # 'h' and half of 'é'
    assert (first.text, first.next_offset, first.size, first.kept) == ("h", 1, 7, True)
    rest = read_output(path, first.next_offset, 100)
    assert (rest.text, rest.next_offset) == ("éllo\n", 7)
    assert read_output(path, 99, 10).offset == 7  # past the end: from the end, nothing
    assert read_output(tmp_path / "none.log", 0, 10).text == ""  # not written yet
    assert not read_output(None, 0, 10).kept


@given(st.text(max_size=200), st.integers(min_value=1, max_value=16))
def test_reading_piece_by_piece_gives_back_the_whole_text(text: str, limit: int) -> None:
    path = Path("/tmp") / f"berth-output-{limit}-{abs(hash(text))}.log"
    path.write_bytes(text.encode())
    try:
        pieces, offset = [], 0
        while offset < len(text.encode()):
            piece = read_output(path, offset, limit)
            assert piece.next_offset > offset  # always moves on
            pieces.append(piece.text)
            offset = piece.next_offset
        assert "".join(pieces) == text
    finally:
        path.unlink()


def test_an_agent_reads_its_workloads_output_and_refuses_bad_reads(tmp_path: Path) -> None:
    limits = BudgetLimits(
        mem_max=GiB,
        disk_max=GiB,
        cpu_capacity=2.0,
        cpu_max_load=1.0,
        disk_bw_cap=GiB,
        disk_bw_max_load=1.0,
        net_bw_cap=GiB,
        net_bw_max_load=1.0,
    )
    runtime = ProcessRuntime(log_dir=tmp_path / "logs")
    agent = Agent("n1", "linux/amd64", NodeBudget(limits, IDLE), MemoryStore(), runtime)

    async def scenario() -> None:
        workload = await runtime.start(
            BootSpec(name="w", command=("sh", "-c", "echo out; echo err >&2"))
        )
        await workload.wait()
        piece = agent.logs(workload.id)
        assert piece.kept and piece.text.split() == ["out", "err"]
        for name, offset, limit in (("offset", -1, 1), ("limit", 0, 0), ("limit", 0, True)):
            with pytest.raises(Invalid) as caught:
                agent.logs(workload.id, offset, limit)
            assert caught.value.field == name
        with pytest.raises(Invalid) as caught:
            agent.logs("")
        assert caught.value.field == "workload_id"
        # a started agent bounds what its runtime keeps: an ended workload's output goes
        # once the directory holds more than it may
        await agent.start()
        try:
            keeper = agent._output
            assert keeper is not None and keeper.directory == tmp_path / "logs"
            assert keeper._task is not None  # on its period
            keeper.total = 0
            kept = await keeper.once()
            ended = runtime.log_of(workload.id)
            assert ended is not None and ended in kept.removed and not ended.exists()
        finally:
            await agent.stop()
        assert keeper._task is None  # stopped with the agent

    asyncio.run(scenario())


def test_the_largest_read_fits_one_nats_message_whatever_the_bytes(tmp_path: Path) -> None:
    """A node answers ``logs`` in one NATS reply (nats-server's default payload limit is
    1 MiB); JSON may write one byte of output as six (``\\u0001``), so the largest read a
    client may ask for must still fit after that growth."""
    from berth.defaults import MAX_LOG_CHUNK_BYTES
    from berth.nats.wire import ok_reply

    path = tmp_path / "w.log"
    path.write_bytes(b"\x01" * (MAX_LOG_CHUNK_BYTES + 10))
    piece = read_output(path, 0, MAX_LOG_CHUNK_BYTES)
    assert len(ok_reply(piece.model_dump())) < 1024 * 1024


def test_trimming_frees_the_head_keeps_offsets_and_loses_no_later_byte(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    line = "ünïcode line, a little over forty bytes\n".encode()
    with open(path, "ab") as writer:  # a workload's append-only output, still open
        writer.write(line * 2000)  # ~86 KB
        writer.flush()
        freed = trim_output(path, 16 * 1024)
        assert freed >= 64 * 1024 and path.stat().st_size == len(line) * 2000  # same length
        writer.write(b"after the trim\n")  # the writer goes on at its end, unaware
    size = path.stat().st_size
    assert path.stat().st_blocks * 512 <= 24 * 1024  # the head no longer takes disk space
    piece = read_output(path, 0, 128 * 1024)
    assert piece.offset >= size - 20 * 1024 - 15 and piece.offset % 4096 < 3  # where it goes on
    assert piece.text.endswith("after the trim\n") and "\x00" not in piece.text
    assert piece.text[0] != "\ufffd"  # started on a whole character past the cut
    assert piece.next_offset == size  # a follower's offsets are as they were
    assert read_output(path, size - 15, 100).text == "after the trim\n"
    assert trim_output(path, 16 * 1024) == 0  # nothing more to drop


def test_keeping_output_removes_ended_workloads_longest_ended_first(tmp_path: Path) -> None:
    files = {}
    for age, name in enumerate(("old", "running", "newer", "newest")):
        files[name] = tmp_path / f"{name}.log"
        files[name].write_bytes(b"x" * 40_000)
        os.utime(files[name], (1000 + age, 1000 + age))  # written in this order
    (tmp_path / "other.txt").write_bytes(b"y" * 100_000)  # not output: left alone
    kept = keep_output(tmp_path, {files["running"]}, keep=16 * 1024, total=40 * 1024)
    assert kept.trimmed > 0
    assert kept.removed == (files["old"], files["newer"])  # the running one only trimmed
    assert {path.name for path in tmp_path.iterdir()} == {"running.log", "newest.log", "other.txt"}
    assert kept.on_disk <= 40 * 1024
    piece = read_output(files["running"], 0, 100)  # offsets kept: on from the first kept block
    assert (piece.offset, piece.next_offset, piece.size) == (20480, 20580, 40_000)
    assert keep_output(tmp_path / "absent", (), 1, 1) == Kept()
