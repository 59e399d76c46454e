"""The node's layer registry: reference counts, the LRU cache, and its invariants."""

from __future__ import annotations

import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from berth.errors import Invalid
from berth.node.layers import LayerRegistry, MountOutcome
from berth.units import MiB


def test_mount_reports_pulled_then_already_mounted() -> None:
    registry = LayerRegistry()
    first = registry.mount("sha256:a", 10 * MiB)
    assert first.outcome is MountOutcome.PULLED
    assert first.pulled_bytes == 10 * MiB
    second = registry.mount("sha256:a", 10 * MiB)
    assert second.outcome is MountOutcome.ALREADY_MOUNTED
    assert second.pulled_bytes == 0
    assert second.refcount == 2
    assert registry.mounted() == frozenset({"sha256:a"})
    assert registry.is_mounted("sha256:a")


def test_layer_stays_mounted_while_any_workload_uses_it() -> None:
    registry = LayerRegistry(cache_budget_bytes=100)
    registry.mount("a", 10)
    registry.mount("a", 10)
    result = registry.unmount("a")
    assert result.refcount == 1
    assert not result.cached
    assert registry.is_mounted("a")
    assert registry.refcount("a") == 1
    result = registry.unmount("a")
    assert result.refcount == 0
    assert result.cached
    assert not registry.is_mounted("a")
    assert registry.cached() == frozenset({"a"})


def test_mounting_a_cached_layer_needs_no_pull() -> None:
    registry = LayerRegistry(cache_budget_bytes=100)
    registry.mount("a", 40)
    registry.unmount("a")
    result = registry.mount("a", 40)
    assert result.outcome is MountOutcome.FROM_CACHE
    assert result.pulled_bytes == 0
    assert registry.cached() == frozenset()
    assert registry.cached_bytes == 0
    assert registry.mounted() == frozenset({"a"})


def test_cache_evicts_least_recently_unmounted_first() -> None:
    registry = LayerRegistry(cache_budget_bytes=100)
    for layer in ("a", "b", "c"):
        registry.mount(layer, 40)
    registry.unmount("b")
    registry.unmount("a")
    result = registry.unmount("c")  # 120 > 100: "b", unmounted longest ago, goes
    assert result.cached
    assert result.evicted == ("b",)
    assert registry.cached() == frozenset({"a", "c"})
    assert registry.cached_bytes == 80
    # remounting "a" then unmounting it makes it the most recent again
    registry.mount("a", 40)
    registry.unmount("a")
    registry.mount("d", 40)
    assert registry.unmount("d").evicted == ("c",)
    assert registry.sizes() == {"a": 40, "d": 40}


def test_a_layer_larger_than_the_budget_is_not_cached_and_evicts_nothing() -> None:
    registry = LayerRegistry(cache_budget_bytes=100)
    registry.mount("small", 30)
    registry.unmount("small")
    registry.mount("huge", 101)
    result = registry.unmount("huge")
    assert not result.cached
    assert result.evicted == ()
    assert registry.cached() == frozenset({"small"})
    assert registry.mount("huge", 101).outcome is MountOutcome.PULLED


def test_zero_budget_caches_nothing_but_empty_layers() -> None:
    registry = LayerRegistry()
    registry.mount("a", 1)
    assert not registry.unmount("a").cached
    registry.mount("empty", 0)
    assert registry.unmount("empty").cached


def test_unmounting_what_is_not_mounted_is_invalid() -> None:
    registry = LayerRegistry(cache_budget_bytes=100)
    with pytest.raises(Invalid) as caught:
        registry.unmount("never")
    assert caught.value.field == "layer"
    registry.mount("a", 1)
    registry.unmount("a")
    with pytest.raises(Invalid) as caught:
        registry.unmount("a")  # cached, not mounted: a double release
    assert caught.value.field == "layer"


@pytest.mark.parametrize(
    ("layer", "size", "field"),
    [("a", -1, "size"), ("a", 1.5, "size"), ("a", True, "size"), ("", 1, "layer")],
)
def test_bad_mounts_are_invalid(layer: str, size: int, field: str) -> None:
    registry = LayerRegistry()
    with pytest.raises(Invalid) as caught:
        registry.mount(layer, size)
    assert caught.value.field == field
    assert registry.mounted() == frozenset()


def test_a_known_layer_must_keep_its_size() -> None:
    registry = LayerRegistry(cache_budget_bytes=100)
    registry.mount("a", 10)
    with pytest.raises(Invalid) as caught:
        registry.mount("a", 11)
    assert caught.value.field == "size"
    assert registry.refcount("a") == 1
    registry.unmount("a")
    with pytest.raises(Invalid):
        registry.mount("a", 12)  # cached with size 10
    assert registry.cached() == frozenset({"a"})


def test_negative_cache_budget_is_invalid() -> None:
    with pytest.raises(Invalid) as caught:
        LayerRegistry(cache_budget_bytes=-1)
    assert caught.value.field == "cache_budget_bytes"


def test_on_change_fires_only_when_the_mounted_or_cached_sets_change() -> None:
    seen: list[tuple[frozenset[str], frozenset[str]]] = []
    registry: LayerRegistry

    def record() -> None:
        seen.append((registry.mounted(), registry.cached()))  # may read: lock is released

    registry = LayerRegistry(cache_budget_bytes=100, on_change=record)
    registry.mount("a", 10)
    registry.mount("a", 10)  # refcount only
    registry.unmount("a")  # refcount only
    registry.unmount("a")
    registry.mount("a", 10)
    assert seen == [
        (frozenset({"a"}), frozenset()),
        (frozenset(), frozenset({"a"})),
        (frozenset({"a"}), frozenset()),
    ]


def test_concurrent_mounts_and_unmounts_balance_out() -> None:
    registry = LayerRegistry(cache_budget_bytes=1_000)
    layers = [f"l{i}" for i in range(5)]
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        for _ in range(300):
            for layer in layers:
                registry.mount(layer, 100)
            for layer in layers:
                registry.unmount(layer)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert registry.mounted() == frozenset()
    assert registry.cached() == frozenset(layers)
    assert registry.cached_bytes == 500


# --- properties ------------------------------------------------------------------------------

LAYERS = {f"layer-{i}": size for i, size in enumerate([0, 1, 7, 30, 50, 64, 99, 150])}


class LayerRegistryMachine(RuleBasedStateMachine):
    """Any sequence of mounts and (legal or illegal) unmounts keeps the registry consistent."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = 100
        self.registry = LayerRegistry(cache_budget_bytes=self.budget)
        self.users: dict[str, int] = {}  # what the callers hold: the expected refcounts

    @rule(layer=st.sampled_from(sorted(LAYERS)))
    def mount(self, layer: str) -> None:
        was_cached = self.registry.is_cached(layer)
        result = self.registry.mount(layer, LAYERS[layer])
        self.users[layer] = self.users.get(layer, 0) + 1
        expected = (
            MountOutcome.ALREADY_MOUNTED
            if self.users[layer] > 1
            else MountOutcome.FROM_CACHE
            if was_cached
            else MountOutcome.PULLED
        )
        assert result.outcome is expected

    @precondition(lambda self: bool(self.users))
    @rule(data=st.data())
    def unmount(self, data: st.DataObject) -> None:
        layer = data.draw(st.sampled_from(sorted(self.users)))
        result = self.registry.unmount(layer)
        self.users[layer] -= 1
        if not self.users[layer]:
            del self.users[layer]
        assert result.refcount == self.users.get(layer, 0)

    @rule(layer=st.sampled_from(sorted(LAYERS)))
    def unmount_unheld(self, layer: str) -> None:
        if layer in self.users:
            return
        with pytest.raises(Invalid):
            self.registry.unmount(layer)

    @invariant()
    def refcounts_match_the_holders_and_are_never_negative(self) -> None:
        for layer in LAYERS:
            refcount = self.registry.refcount(layer)
            assert refcount >= 0
            assert refcount == self.users.get(layer, 0)

    @invariant()
    def mounted_is_exactly_the_layers_in_use(self) -> None:
        assert self.registry.mounted() == frozenset(self.users)

    @invariant()
    def cache_stays_within_its_budget(self) -> None:
        cached = self.registry.cached()
        assert self.registry.cached_bytes == sum(LAYERS[layer] for layer in cached)
        assert self.registry.cached_bytes <= self.budget

    @invariant()
    def no_layer_is_both_mounted_and_cached(self) -> None:
        assert not (self.registry.mounted() & self.registry.cached())


LayerRegistryMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40)
TestLayerRegistryProperties = LayerRegistryMachine.TestCase
