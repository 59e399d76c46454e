"""The conformance suite of the node-client port (:mod:`berth.nodeclient.port`), for any driver.

Subclass :class:`NodeClientContract` beside a driver's tests and implement
:meth:`~NodeClientContract.open_nodes`: a client that reaches exactly the nodes the given
shapes describe (:class:`NodeShape`: a name, the platform the node runs, its memory, and the
clock its budget judges lease expiry by — the suite passes a
:class:`~berth.testing.clock.FakeClock` and moves it), and pytest collects the inherited
tests::

    class TestMyNodes(NodeClientContract):
        def open_nodes(self, shapes):
            @asynccontextmanager
            async def opened():
                yield MyNodes({shape.name: shape.budget() for shape in shapes})

            return opened()

A driver whose nodes run workloads sets ``runs_workloads = True`` and overrides
:meth:`~NodeClientContract.start_workload` and :meth:`~NodeClientContract.stop_workload`, so
binding to a workload id is checked too.

The guarantees checked are the ones a scheduler builds on, every one observed through the
port alone (room on a node is probed by admitting a spec that fills it):

* ``admit`` returns an :class:`~berth.ownership.Admission`: a reservation id unique on the
  node and an admission count ``seq`` that increases with every admission;
* the node is the authority: an exact fill fits, one byte more is ``mem_exhausted``; a spec
  for platforms the node does not run is ``platform_mismatch``; every ``Refused`` names the
  node, and a refusal reserves nothing;
* ``bind`` ties the reservation to an owner — it then lives exactly as long as the owner and
  never expires; ``release`` frees it and is idempotent (``False`` the second time);
* an unbound lease ends at its deadline on the node's clock: the room is free again,
  ``release`` says ``False`` and a late ``bind`` is refused ``lease_expired``;
* ``bind`` to a reservation the node does not hold is ``lease_expired``; to a workload id the
  node does not run, ``unknown_workload`` (and the reservation is kept);
* a node the client cannot reach is ``Unavailable`` for ``admit``, ``bind`` and ``release``;
* a malformed call (``lease_ttl_s`` zero, negative or NaN) is ``Invalid`` naming
  ``lease_ttl_s`` (from the :class:`~berth.boot.AdmitOrder` it would be sent in), and
  reserves nothing;
* (drivers whose nodes run workloads) a ``try_run`` with a ``workload_id`` boots under that
  id, and is idempotent by it: retried — one after the other, or two at once — it boots once
  and holds one reservation;
* (drivers whose nodes run workloads) ``running`` reports exactly the ids the node runs,
  sorted: a booted id appears, a stopped one leaves, another node's never shows; an unknown
  node is ``Unavailable`` (never an empty report);
* (drivers whose nodes run workloads) a stop whose ``grace_s`` is not a finite number from 0
  to an hour is ``Invalid`` naming ``grace_s`` and stops nothing; with a grace it stops;
* node maintenance (drivers implementing :class:`~berth.nodeclient.port.NodeMaintenance`;
  skipped for the others): a cordoned node refuses every new admission ``cordoned`` (naming
  the node) while a reservation taken before the cordon can still be bound and released;
  ``cordon``/``uncordon`` say whether they changed anything; a cordon is per node; an
  unknown node is ``Unavailable``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import pytest

from berth.boot import AdmitOrder, BootSpec, RunOrder
from berth.defaults import LEASE_TTL_S
from berth.errors import Invalid, Unavailable
from berth.model import Spec
from berth.node.budget import BudgetLimits, NodeBudget
from berth.nodeclient.port import AgentClient, NodeClient, NodeMaintenance
from berth.ownership import Admission, Clock, Refused
from berth.platform import Platform
from berth.testing.clock import FakeClock
from berth.testing.owner import ManualOwner
from berth.units import GiB, MiB

__all__ = ["NodeClientContract", "NodeShape"]


@dataclass(frozen=True)
class NodeShape:
    """One node the suite asks a driver for: name, platform, memory, and its budget's clock.

    Disk, CPU and bandwidth are generous, so only memory and platform decide admission.
    """

    name: str
    platform: Platform = field(default_factory=lambda: Platform.parse("linux/amd64"))
    mem: int = GiB
    clock: Clock = field(default_factory=FakeClock)

    def limits(self) -> BudgetLimits:
        return BudgetLimits(
            mem_max=self.mem,
            disk_max=100 * GiB,
            cpu_capacity=64,
            disk_bw_cap=100 * GiB,
            net_bw_cap=100 * GiB,
        )

    def budget(self) -> NodeBudget:
        """A budget of this shape: for drivers whose nodes are, or hold, a ``NodeBudget``."""
        return NodeBudget(self.limits(), clock=self.clock, platform=self.platform)


def _spec(mem: int) -> Spec:
    return Spec(vcpus=0.01, mem=mem, disk=MiB)


class NodeClientContract:
    """Base class of a node-client driver's conformance tests; override :meth:`open_nodes`."""

    lease_ttl_s: ClassVar[float] = LEASE_TTL_S
    timeout_s: ClassVar[float] = 10.0
    runs_workloads: ClassVar[bool] = False

    # -- hooks -------------------------------------------------------------------------------
    def open_nodes(self, shapes: Sequence[NodeShape]) -> AbstractAsyncContextManager[NodeClient]:
        """A client reaching exactly the nodes ``shapes`` describe (entered in a running loop)."""
        raise NotImplementedError

    async def start_workload(self, nodes: NodeClient, node: str) -> str:
        """Start a small workload on ``node``; its id (with ``runs_workloads = True``)."""
        raise NotImplementedError

    async def stop_workload(self, nodes: NodeClient, node: str, workload_id: str) -> None:
        """End a workload :meth:`start_workload` started."""
        raise NotImplementedError

    # -- helpers -----------------------------------------------------------------------------
    def _run(
        self, shapes: Sequence[NodeShape], check: Callable[[NodeClient], Awaitable[None]]
    ) -> None:
        async def main() -> None:
            async with self.open_nodes(shapes) as nodes:
                await asyncio.wait_for(check(nodes), self.timeout_s)

        asyncio.run(main())

    async def _admit(
        self, nodes: NodeClient, node: str, mem: int, platforms: Sequence[Platform] = ()
    ) -> Admission:
        return await nodes.admit(node, AdmitOrder(_spec(mem), self.lease_ttl_s, platforms))

    async def _refusal(self, call: Awaitable[object]) -> Refused:
        with pytest.raises(Refused) as caught:
            await call
        return caught.value

    async def _assert_free(self, nodes: NodeClient, shape: NodeShape) -> None:
        """``shape``'s node holds nothing: a spec of all its memory is admitted (then released)."""
        admission = await self._admit(nodes, shape.name, shape.mem)
        assert await nodes.release(shape.name, admission.reservation_id) is True

    async def _assert_full(self, nodes: NodeClient, node: str) -> None:
        refused = await self._refusal(self._admit(nodes, node, 1))
        assert refused.reason == "mem_exhausted", refused

    # -- admission ---------------------------------------------------------------------------
    def test_admit_returns_unique_ids_and_increasing_seq(self) -> None:
        shape = NodeShape("n1")

        async def check(nodes: NodeClient) -> None:
            admissions = [await self._admit(nodes, "n1", 64 * MiB) for _ in range(5)]
            for admission in admissions:
                assert isinstance(admission, Admission)
                assert admission.reservation_id and isinstance(admission.reservation_id, str)
                assert admission.seq >= 1
            assert len({a.reservation_id for a in admissions}) == len(admissions)
            seqs = [a.seq for a in admissions]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
            for admission in admissions:  # seq keeps growing after releases
                assert await nodes.release("n1", admission.reservation_id) is True
            assert (await self._admit(nodes, "n1", 64 * MiB)).seq > seqs[-1]

        self._run([shape], check)

    def test_exact_fill_fits_and_one_byte_more_is_mem_exhausted(self) -> None:
        shape = NodeShape("n1", mem=256 * MiB)

        async def check(nodes: NodeClient) -> None:
            await self._admit(nodes, "n1", 200 * MiB)
            refused = await self._refusal(self._admit(nodes, "n1", 56 * MiB + 1))
            assert (refused.reason, refused.node) == ("mem_exhausted", "n1")
            last = await self._admit(nodes, "n1", 56 * MiB)  # the refusal reserved nothing
            await self._assert_full(nodes, "n1")
            assert await nodes.release("n1", last.reservation_id) is True
            await self._admit(nodes, "n1", 56 * MiB)

        self._run([shape], check)

    def test_platforms_the_node_does_not_run_are_platform_mismatch(self) -> None:
        arm = Platform.parse("linux/arm64")
        amd, s390x = Platform.parse("linux/amd64"), Platform.parse("linux/s390x")
        shape = NodeShape("arm-1", platform=arm, mem=128 * MiB)

        async def check(nodes: NodeClient) -> None:
            for platforms in ([amd], [amd, s390x]):
                refused = await self._refusal(self._admit(nodes, "arm-1", MiB, platforms))
                assert (refused.reason, refused.node) == ("platform_mismatch", "arm-1")
            await self._assert_free(nodes, shape)  # refusals reserved nothing
            for platforms in ([], [arm], [amd, arm], [Platform.parse("linux/aarch64")]):
                admission = await self._admit(nodes, "arm-1", MiB, platforms)
                assert await nodes.release("arm-1", admission.reservation_id) is True

        self._run([shape], check)

    def test_nodes_are_independent(self) -> None:
        shapes = [NodeShape("n1", mem=128 * MiB), NodeShape("n2", mem=128 * MiB)]

        async def check(nodes: NodeClient) -> None:
            await self._admit(nodes, "n1", 128 * MiB)
            await self._assert_full(nodes, "n1")
            await self._assert_free(nodes, shapes[1])

        self._run(shapes, check)

    # -- binding and releasing ---------------------------------------------------------------
    def test_release_frees_and_is_idempotent(self) -> None:
        shape = NodeShape("n1", mem=128 * MiB)

        async def check(nodes: NodeClient) -> None:
            admission = await self._admit(nodes, "n1", 128 * MiB)
            await self._assert_full(nodes, "n1")
            assert await nodes.release("n1", admission.reservation_id) is True
            assert await nodes.release("n1", admission.reservation_id) is False
            assert await nodes.release("n1", "no-such-reservation") is False
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    def test_bound_reservation_lives_as_long_as_its_owner(self) -> None:
        clock = FakeClock()
        shape = NodeShape("n1", mem=128 * MiB, clock=clock)

        async def check(nodes: NodeClient) -> None:
            owner = ManualOwner()
            admission = await self._admit(nodes, "n1", 128 * MiB)
            await nodes.bind("n1", admission.reservation_id, owner)
            clock.advance(10 * self.lease_ttl_s)  # bound: the lease deadline no longer applies
            await self._assert_full(nodes, "n1")
            owner.end()
            await self._assert_free(nodes, shape)
            assert await nodes.release("n1", admission.reservation_id) is False

        self._run([shape], check)

    def test_release_of_a_bound_reservation(self) -> None:
        shape = NodeShape("n1", mem=128 * MiB)

        async def check(nodes: NodeClient) -> None:
            owner = ManualOwner()
            admission = await self._admit(nodes, "n1", 128 * MiB)
            await nodes.bind("n1", admission.reservation_id, owner)
            assert await nodes.release("n1", admission.reservation_id) is True
            assert await nodes.release("n1", admission.reservation_id) is False
            await self._assert_free(nodes, shape)
            owner.end()  # the owner's later end releases nothing else
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    def test_unbound_lease_expires_on_the_node_clock(self) -> None:
        clock = FakeClock()
        shape = NodeShape("n1", mem=128 * MiB, clock=clock)

        async def check(nodes: NodeClient) -> None:
            admission = await self._admit(nodes, "n1", 128 * MiB)
            clock.advance(self.lease_ttl_s / 2)
            await self._assert_full(nodes, "n1")
            clock.advance(self.lease_ttl_s / 2)  # the deadline
            # Nothing has looked at the node since: the late bind itself must see the expiry.
            refused = await self._refusal(nodes.bind("n1", admission.reservation_id, ManualOwner()))
            assert (refused.reason, refused.node) == ("lease_expired", "n1")
            assert await nodes.release("n1", admission.reservation_id) is False
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    def test_expired_lease_is_released_before_anything_else_reads_it(self) -> None:
        clock = FakeClock()
        shape = NodeShape("n1", mem=128 * MiB, clock=clock)

        async def check(nodes: NodeClient) -> None:
            admission = await self._admit(nodes, "n1", 128 * MiB)
            clock.advance(self.lease_ttl_s)
            assert await nodes.release("n1", admission.reservation_id) is False
            refused = await self._refusal(nodes.bind("n1", admission.reservation_id, "w-1"))
            assert refused.reason == "lease_expired"
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    def test_bind_to_a_reservation_the_node_does_not_hold_is_lease_expired(self) -> None:
        async def check(nodes: NodeClient) -> None:
            for owner in (ManualOwner(), "some-workload"):
                refused = await self._refusal(nodes.bind("n1", "no-such-reservation", owner))
                assert (refused.reason, refused.node) == ("lease_expired", "n1")
            admission = await self._admit(nodes, "n1", MiB)
            assert await nodes.release("n1", admission.reservation_id) is True
            refused = await self._refusal(nodes.bind("n1", admission.reservation_id, ManualOwner()))
            assert refused.reason == "lease_expired"

        self._run([NodeShape("n1")], check)

    def test_bind_to_a_workload_the_node_does_not_run_is_unknown_workload(self) -> None:
        shape = NodeShape("n1", mem=128 * MiB)

        async def check(nodes: NodeClient) -> None:
            admission = await self._admit(nodes, "n1", 128 * MiB)
            refused = await self._refusal(
                nodes.bind("n1", admission.reservation_id, "no-such-workload")
            )
            assert (refused.reason, refused.node) == ("unknown_workload", "n1")
            await self._assert_full(nodes, "n1")  # the reservation is kept, still leased
            owner = ManualOwner()
            await nodes.bind("n1", admission.reservation_id, owner)
            owner.end()
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    def test_bind_to_a_workload_id(self) -> None:
        if not self.runs_workloads:
            pytest.skip("the driver's nodes run no workloads")
        shape = NodeShape("n1", mem=256 * MiB)

        async def check(nodes: NodeClient) -> None:
            workload_id = await self.start_workload(nodes, "n1")
            admission = await self._admit(nodes, "n1", 128 * MiB)
            await nodes.bind("n1", admission.reservation_id, workload_id)
            await self.stop_workload(nodes, "n1", workload_id)
            assert await nodes.release("n1", admission.reservation_id) is False
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    def test_a_malformed_stop_grace_is_invalid_and_stops_nothing(self) -> None:
        if not self.runs_workloads:
            pytest.skip("the driver's nodes run no workloads")

        async def check(nodes: NodeClient) -> None:
            agents = cast(AgentClient, nodes)  # a driver whose nodes run workloads is one
            workload_id = await self.start_workload(nodes, "n1")
            for grace in (-1.0, math.nan, math.inf, 3601.0, True, "5", [1]):
                with pytest.raises(Invalid) as caught:
                    await agents.stop("n1", workload_id, grace_s=grace)  # type: ignore[arg-type]
                assert caught.value.field == "grace_s", grace
                assert (await agents.status("n1", workload_id)).state == "running"
            await agents.stop("n1", workload_id, grace_s=0.0)
            status = await agents.status("n1", workload_id)
            assert (status.state, status.stopped) == ("ended", True)
            await agents.stop("n1", workload_id, grace_s=1.5)  # ended already: harmless

        self._run([NodeShape("n1", mem=256 * MiB)], check)

    def test_logs_are_read_by_offset_and_a_malformed_read_is_invalid(self) -> None:
        if not self.runs_workloads:
            pytest.skip("the driver's nodes run no workloads")

        async def check(nodes: NodeClient) -> None:
            agents = cast(AgentClient, nodes)  # a driver whose nodes run workloads is one
            workload_id = await self.start_workload(nodes, "n1")
            piece = await agents.logs("n1", workload_id)
            assert piece.offset == 0 and piece.next_offset == len(piece.text.encode())
            if piece.kept and piece.size:  # from the end: nothing more, at the end
                tail = await agents.logs("n1", workload_id, offset=piece.size + 10)
                assert (tail.text, tail.offset, tail.next_offset) == ("", piece.size, piece.size)
            bad_reads: list[tuple[str, Any, Any]] = [
                ("offset", -1, 1),
                ("offset", "3", 1),
                ("limit", 0, 0),
                ("limit", 0, 2**21),
            ]
            for name, offset, limit in bad_reads:
                with pytest.raises(Invalid) as caught:
                    await agents.logs("n1", workload_id, offset, limit)
                assert caught.value.field == name, (name, offset, limit)
            await self.stop_workload(nodes, "n1", workload_id)

        self._run([NodeShape("n1", mem=256 * MiB)], check)

    async def _run_by_id(
        self, nodes: NodeClient, node: str, workload_id: str, mem: int, reservation: str | None
    ) -> str:
        agents = cast(AgentClient, nodes)  # a driver whose nodes run workloads is one
        boot = BootSpec(name=workload_id, command=("vm",))
        order = RunOrder(_spec(mem), [], boot, reservation=reservation, workload_id=workload_id)
        return await agents.try_run(node, order)

    def test_a_run_retried_with_its_workload_id_boots_once(self) -> None:
        """A caller whose run answer was lost asks again with the same id: the node answers
        that id, boots nothing more and holds one reservation — with a lease taken before
        (a scheduler's placement) or admitting by itself."""
        if not self.runs_workloads:
            pytest.skip("the driver's nodes run no workloads")
        shape = NodeShape("n1", mem=256 * MiB)

        async def check(nodes: NodeClient) -> None:
            agents = cast(AgentClient, nodes)
            admission = await self._admit(nodes, "n1", 64 * MiB)
            leased = "w-00000000000a"
            for _ in range(3):
                ran = await self._run_by_id(nodes, "n1", leased, 64 * MiB, admission.reservation_id)
                assert ran == leased
            alone = "w-00000000000b"
            for _ in range(3):
                assert await self._run_by_id(nodes, "n1", alone, 64 * MiB, None) == alone
            for workload_id in (leased, alone):
                assert (await agents.status("n1", workload_id)).state == "running"
            # two workloads of 64 MiB hold 128 MiB of 256: 128 MiB more fits, one byte more not
            room = await self._admit(nodes, "n1", 128 * MiB)
            await self._assert_full(nodes, "n1")
            assert await nodes.release("n1", room.reservation_id) is True
            for workload_id in (leased, alone):
                await agents.stop("n1", workload_id, grace_s=0.0)
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    def test_two_concurrent_runs_of_one_workload_id_boot_once(self) -> None:
        if not self.runs_workloads:
            pytest.skip("the driver's nodes run no workloads")
        shape = NodeShape("n1", mem=256 * MiB)

        async def check(nodes: NodeClient) -> None:
            agents = cast(AgentClient, nodes)
            workload_id = "w-00000000000c"
            admission = await self._admit(nodes, "n1", 128 * MiB)
            ran = await asyncio.gather(
                *(
                    self._run_by_id(nodes, "n1", workload_id, 128 * MiB, reservation)
                    for reservation in (admission.reservation_id, admission.reservation_id)
                )
            )
            assert ran == [workload_id, workload_id]
            room = await self._admit(nodes, "n1", 128 * MiB)  # one reservation held, not two
            await self._assert_full(nodes, "n1")
            assert await nodes.release("n1", room.reservation_id) is True
            await agents.stop("n1", workload_id, grace_s=0.0)
            assert (await agents.status("n1", workload_id)).state == "ended"
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    def test_running_reports_exactly_the_ids_the_node_runs(self) -> None:
        if not self.runs_workloads:
            pytest.skip("the driver's nodes run no workloads")
        shapes = [NodeShape("n1", mem=256 * MiB), NodeShape("n2", mem=256 * MiB)]

        async def check(nodes: NodeClient) -> None:
            agents = cast(AgentClient, nodes)
            assert await agents.running("n1") == ()
            ids = ["w-00000000002b", "w-00000000001a"]
            for workload_id in ids:
                assert (
                    await self._run_by_id(nodes, "n1", workload_id, 32 * MiB, None) == workload_id
                )
            other = await self._run_by_id(nodes, "n2", "w-00000000003c", 32 * MiB, None)
            assert await agents.running("n1") == tuple(sorted(ids))
            assert await agents.running("n2") == (other,)
            await agents.stop("n1", ids[0], grace_s=0.0)
            assert await agents.running("n1") == (ids[1],)
            with pytest.raises(Unavailable):
                await agents.running("ghost")
            for node, workload_id in (("n1", ids[1]), ("n2", other)):
                await agents.stop(node, workload_id, grace_s=0.0)
            assert await agents.running("n1") == ()

        self._run(shapes, check)

    # -- failures of the call ----------------------------------------------------------------
    def test_unknown_node_is_unavailable(self) -> None:
        async def check(nodes: NodeClient) -> None:
            calls: list[Awaitable[object]] = [
                self._admit(nodes, "ghost", MiB),
                nodes.bind("ghost", "r1", ManualOwner()),
                nodes.bind("ghost", "r1", "w-1"),
                nodes.release("ghost", "r1"),
            ]
            for call in calls:
                with pytest.raises(Unavailable):
                    await call

        self._run([NodeShape("n1")], check)

    def test_malformed_lease_ttl_is_invalid_and_reserves_nothing(self) -> None:
        shape = NodeShape("n1", mem=128 * MiB)

        async def check(nodes: NodeClient) -> None:
            for ttl in (0, 0.0, -1.0, math.nan):
                with pytest.raises(Invalid) as caught:
                    await nodes.admit("n1", AdmitOrder(_spec(MiB), ttl))
                assert caught.value.field == "lease_ttl_s", caught.value
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    # -- node maintenance (drivers that implement NodeMaintenance) ----------------------------
    def _maintenance(self, nodes: NodeClient) -> NodeMaintenance:
        if not isinstance(nodes, NodeMaintenance):
            pytest.skip("the driver does not implement NodeMaintenance (cordon/uncordon)")
        return nodes

    def test_cordon_refuses_new_admissions_and_keeps_what_is_held(self) -> None:
        shape = NodeShape("n1", mem=256 * MiB)

        async def check(nodes: NodeClient) -> None:
            maintenance = self._maintenance(nodes)
            held = await self._admit(nodes, "n1", 128 * MiB)
            assert await maintenance.cordon("n1") is True
            assert await maintenance.cordon("n1") is False  # already cordoned
            refused = await self._refusal(self._admit(nodes, "n1", MiB))
            assert (refused.reason, refused.node) == ("cordoned", "n1"), refused
            owner = ManualOwner()  # a reservation taken before the cordon is still bound
            await nodes.bind("n1", held.reservation_id, owner)
            assert await maintenance.uncordon("n1") is True
            assert await maintenance.uncordon("n1") is False
            second = await self._admit(nodes, "n1", 128 * MiB)  # exactly the rest: fits
            await self._assert_full(nodes, "n1")
            assert await nodes.release("n1", second.reservation_id) is True
            owner.end()
            await self._assert_free(nodes, shape)

        self._run([shape], check)

    def test_cordon_is_per_node(self) -> None:
        shapes = [NodeShape("n1"), NodeShape("n2")]

        async def check(nodes: NodeClient) -> None:
            maintenance = self._maintenance(nodes)
            await maintenance.cordon("n1")
            admission = await self._admit(nodes, "n2", MiB)
            assert await nodes.release("n2", admission.reservation_id) is True
            assert (await self._refusal(self._admit(nodes, "n1", MiB))).reason == "cordoned"

        self._run(shapes, check)

    def test_cordon_of_an_unknown_node_is_unavailable(self) -> None:
        async def check(nodes: NodeClient) -> None:
            maintenance = self._maintenance(nodes)
            for call in (maintenance.cordon("ghost"), maintenance.uncordon("ghost")):
                with pytest.raises(Unavailable):
                    await call

        self._run([NodeShape("n1")], check)
