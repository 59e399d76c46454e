"""berth.node.layer_files.LayerFiles: layers kept as erofs files, advertised by the registry."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from berth.errors import Invalid
from berth.model import Layer, Spec
from berth.node.budget import BudgetLimits, NodeBudget, StaticLoad
from berth.node.core import NodeCore
from berth.node.layer_files import LayerFiles
from berth.node.layers import LayerRegistry, MountOutcome
from berth.node.runtime import BootSpec, FakeRuntime
from berth.oci import ImageSpec, OciImage, OciLayer, directory, file, read_layout, write_layout
from berth.units import GiB

_CANNOT_CONVERT = (
    "mkfs.erofs not installed (apt-get install erofs-utils)"
    if shutil.which("mkfs.erofs") is None
    else "layer conversion needs root (mknod, chown)"
    if os.geteuid() != 0
    else ""
)
needs_conversion = pytest.mark.skipif(bool(_CANNOT_CONVERT), reason=_CANNOT_CONVERT)


def _image(tmp_path: Path, count: int = 3, name: str = "img") -> OciImage:
    layers = [[directory(f"l{i}"), file(f"l{i}/data", os.urandom(2000 + i))] for i in range(count)]
    return read_layout(write_layout(tmp_path / name, ImageSpec(layers=layers)))


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _leftovers(root: Path) -> list[str]:
    return sorted(
        name for name in os.listdir(root) if not name.endswith(".erofs") or name.startswith(".")
    )


# --- the registry's hooks (no files) ---------------------------------------------------------


def test_a_layer_not_present_is_not_cached() -> None:
    present: set[str] = set()
    registry = LayerRegistry(1000, present=present.__contains__)
    registry.mount("a", 10)
    registry.mount("b", 10)
    present.add("b")
    assert not registry.unmount("a").cached
    assert registry.unmount("b").cached
    assert registry.cached() == frozenset({"b"})


def test_cache_adopts_unused_layers_and_reports_evictions() -> None:
    evicted: list[tuple[str, ...]] = []
    registry = LayerRegistry(100)
    registry.add_eviction_listener(evicted.append)
    assert registry.cache("a", 60).cached
    assert registry.cache("b", 60).cached
    assert evicted == [("a",)]
    assert registry.cached() == frozenset({"b"})
    assert not registry.cache("huge", 101).cached
    registry.mount("b", 60)
    assert not registry.cache("b", 60).cached  # mounted: left as it is
    assert registry.refcount("b") == 1
    with pytest.raises(Invalid):
        registry.cache("c", -1)


def test_a_layer_dropped_instead_of_cached_is_reported_gone() -> None:
    gone: list[tuple[str, ...]] = []
    registry = LayerRegistry(50)
    registry.add_eviction_listener(gone.append)
    registry.mount("big", 60)
    registry.unmount("big")
    assert gone == [("big",)] and registry.cached() == frozenset()
    assert not registry.cache("bigger", 70).cached
    assert gone[-1] == ("bigger",)


@needs_conversion
def test_a_layer_too_big_for_the_cache_loses_its_file_at_release(tmp_path: Path) -> None:
    layer = _image(tmp_path, 1).layers[0]
    files = LayerFiles(tmp_path / "layers", layer.size - 1)
    path = asyncio.run(files.acquire(layer))
    assert not files.release(layer.digest).cached
    assert not path.exists() and files.files() == {} and os.listdir(files.root) == []


def test_unmount_reports_evictions_to_listeners() -> None:
    evicted: list[tuple[str, ...]] = []
    registry = LayerRegistry(100)
    registry.add_eviction_listener(evicted.append)
    for layer in ("a", "b"):
        registry.mount(layer, 60)
        registry.unmount(layer)
    assert evicted == [("a",)]


# --- the files ------------------------------------------------------------------------------


@pytest.mark.parametrize("root", ["", 5])
def test_bad_root_is_invalid(root: object) -> None:
    with pytest.raises(Invalid) as error:
        LayerFiles(root, 0)  # type: ignore[arg-type]
    assert error.value.field == "layer_dir"


def test_root_under_a_file_is_invalid(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(Invalid, match="cannot create") as error:
        LayerFiles(tmp_path / "f" / "layers")
    assert error.value.field == "layer_dir"


@needs_conversion
def test_acquire_converts_once_then_caches(tmp_path: Path) -> None:
    image = _image(tmp_path, 2)
    changes: list[int] = []
    files = LayerFiles(tmp_path / "layers", 10 * GiB, on_change=lambda: changes.append(1))
    digests = {layer.digest for layer in image.layers}

    async def scenario() -> None:
        paths = await files.acquire_all(image.layers)
        assert all(path.is_file() and path.parent == files.root for path in paths)
        assert files.registry.mounted() == digests
        assert files.conversions == 2 and files.conversion_seconds > 0
        for layer in image.layers:
            assert files.release(layer.digest).cached
        assert files.registry.cached() == digests and files.registry.mounted() == frozenset()
        assert all(path.is_file() for path in paths)
        again = await files.acquire(image.layers[0])  # from the cache: no conversion
        assert again == paths[0] and files.conversions == 2
        assert files.registry.mounted() == {image.layers[0].digest}

    asyncio.run(scenario())
    assert changes
    assert files.disk_bytes == sum(path.stat().st_size for path in files.files().values())
    assert files.registry.sizes() == {layer.digest: layer.size for layer in image.layers}


@needs_conversion
def test_concurrent_acquires_of_one_digest_convert_once(tmp_path: Path) -> None:
    layer = _image(tmp_path, 1).layers[0]
    files = LayerFiles(tmp_path / "layers", 10 * GiB)

    async def scenario() -> None:
        paths = await asyncio.gather(*(files.acquire(layer) for _ in range(6)))
        assert len(set(paths)) == 1
        assert files.conversions == 1
        assert files.registry.refcount(layer.digest) == 6
        for _ in range(6):
            files.release(layer.digest)

    asyncio.run(scenario())
    assert files.registry.cached() == {layer.digest}
    assert _leftovers(files.root) == []


@needs_conversion
def test_eviction_by_bytes_deletes_files(tmp_path: Path) -> None:
    image = _image(tmp_path, 3)
    sizes = [layer.size for layer in image.layers]
    files = LayerFiles(tmp_path / "layers", max(sizes) + 1)  # room for one at a time
    first, second, third = image.layers

    async def scenario() -> None:
        path_one = await files.acquire(first)
        path_two = await files.acquire(second)
        files.release(first.digest)
        assert files.registry.cached() == {first.digest}
        result = files.release(second.digest)  # over the budget: the older one goes
        assert result.evicted == (first.digest,)
        assert not path_one.exists() and path_two.exists()
        assert not files.has(first.digest) and files.has(second.digest)
        await files.acquire(third)
        files.release(third.digest)
        assert not path_two.exists()
        assert files.registry.cached() == {third.digest}
        assert set(files.files()) == {third.digest}
        again = await files.acquire(first)  # evicted: converted again
        assert again.exists() and files.conversions == 4

    asyncio.run(scenario())


@needs_conversion
def test_a_failed_conversion_leaves_nothing(tmp_path: Path) -> None:
    layer = _image(tmp_path, 1).layers[0]
    data = bytearray(layer.path.read_bytes())
    data[-20] ^= 0xFF
    layer.path.write_bytes(bytes(data))
    files = LayerFiles(tmp_path / "layers", 10 * GiB)
    published: list[tuple[frozenset[str], frozenset[str]]] = []
    files.registry.add_change_listener(
        lambda: published.append((files.registry.mounted(), files.registry.cached()))
    )
    with pytest.raises(Invalid):
        asyncio.run(files.acquire(layer))
    assert os.listdir(files.root) == []
    assert files.registry.mounted() == frozenset() and files.registry.cached() == frozenset()
    assert published[-1] == (frozenset(), frozenset())
    assert files.conversions == 0


@needs_conversion
def test_acquire_all_is_all_or_nothing(tmp_path: Path) -> None:
    good = _image(tmp_path, 2).layers
    bad = OciLayer(
        good[0].digest.replace("sha256:", "sha256:f")[:71],
        5,
        good[0].media_type,
        "gzip",
        good[0].path,
    )
    files = LayerFiles(tmp_path / "layers", 10 * GiB)
    with pytest.raises(Invalid):
        asyncio.run(files.acquire_all([*good, bad]))
    assert files.registry.mounted() == frozenset()
    assert files.registry.cached() == {layer.digest for layer in good}


@needs_conversion
def test_a_known_layer_with_another_size_changes_nothing(tmp_path: Path) -> None:
    layer = _image(tmp_path, 1).layers[0]
    files = LayerFiles(tmp_path / "layers", 10 * GiB)
    asyncio.run(files.acquire(layer))
    liar = OciLayer(layer.digest, layer.size + 1, layer.media_type, layer.compression, layer.path)
    with pytest.raises(Invalid, match="is known with size"):
        asyncio.run(files.acquire(liar))
    assert files.registry.refcount(layer.digest) == 1
    with pytest.raises(Invalid, match="not mounted"):
        files.release("sha256:" + "0" * 64)


@needs_conversion
def test_a_cancelled_acquire_keeps_the_converted_file_cached(tmp_path: Path) -> None:
    layer = _image(tmp_path, 1).layers[0]
    files = LayerFiles(tmp_path / "layers", 10 * GiB)

    async def scenario() -> None:
        task = asyncio.ensure_future(files.acquire(layer))
        await asyncio.sleep(0)  # the conversion has started in its thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while layer.digest not in files.files():  # the conversion runs on
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert files.registry.mounted() == frozenset()
    assert files.registry.cached() == {layer.digest}


@needs_conversion
def test_a_restart_adopts_files_least_recently_used_first(tmp_path: Path) -> None:
    image = _image(tmp_path, 3)
    root = tmp_path / "layers"
    first = LayerFiles(root, 10 * GiB)

    async def use_all() -> None:
        for layer in image.layers:
            await first.acquire(layer)
        for index, layer in enumerate(image.layers):
            first.release(layer.digest)
            os.utime(first.path(layer), (1_000_000 + index, 1_000_000 + index))

    asyncio.run(use_all())
    gone = _dead_pid()
    (root / f".berth-convert-{gone}-deadbeef-x").mkdir()  # a killed conversion's scratch
    (root / f".berth-convert-{gone}-deadbeef-x" / "f").write_text("x")
    (root / f".berth-convert-{gone}-deadbeef-y.erofs").write_text("half")
    (root / f".berth-convert-{os.getpid()}-cafe-z.erofs").write_text("in flight here: kept")
    (root / "unrelated.txt").write_text("left alone")
    keep_two = image.layers[1].size + image.layers[2].size
    second = LayerFiles(root, keep_two)
    assert second.registry.cached() == {image.layers[1].digest, image.layers[2].digest}
    assert not first.path(image.layers[0]).exists()  # the least recently used, over budget
    assert sorted(os.listdir(root)) == sorted(
        [second.path(layer).name for layer in image.layers[1:]]
        + ["unrelated.txt", f".berth-convert-{os.getpid()}-cafe-z.erofs"]
    )

    async def reuse() -> None:
        await second.acquire(image.layers[2])

    asyncio.run(reuse())
    assert second.conversions == 0


@needs_conversion
def test_the_node_advertises_the_files(tmp_path: Path) -> None:
    image = _image(tmp_path, 2)
    files = LayerFiles(tmp_path / "layers", 10 * GiB)
    limits = BudgetLimits(
        mem_max=2 * GiB, disk_max=10 * GiB, cpu_capacity=2, disk_bw_cap=GiB, net_bw_cap=GiB
    )
    core = NodeCore(
        "n1", "linux/amd64", NodeBudget(limits, StaticLoad()), FakeRuntime(), layers=files.registry
    )
    spec = Spec(vcpus=0.5, mem=GiB, disk=GiB)

    async def scenario() -> None:
        booted = await core.boot(spec, image.berth_layers(), BootSpec(name="w", command=("x",)))
        assert [mount.outcome for mount in booted.mounts] == [MountOutcome.PULLED] * 2
        await files.acquire_all(image.layers)  # what the microvm runtime does at start
        state = core.snapshot(1.0)
        assert state.layers == {layer.digest for layer in image.layers}
        for layer in image.layers:
            files.release(layer.digest)
        await core.stop(booted.workload.id)
        state = core.snapshot(2.0)
        assert state.layers == frozenset()
        assert state.cached_layers == {layer.digest for layer in image.layers}
        # A request's layer that never became a file is not advertised as cached.
        phantom = Layer(id="sha256:" + "e" * 64, size=10)
        other = await core.boot(spec, (phantom,), BootSpec(name="v", command=("x",)))
        await core.stop(other.workload.id)
        assert phantom.id not in core.snapshot(3.0).cached_layers
        assert core.problems() == []

    asyncio.run(scenario())


@needs_conversion
def test_files_match_what_the_node_advertises_under_any_sequence(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Random acquires and releases: the files on disk are exactly the mounted and cached
    layers, the cache stays within its budget, and reference counts match the calls."""
    layouts = tmp_path_factory.mktemp("layouts")
    image = _image(layouts, 4)
    sizes = sorted(layer.size for layer in image.layers)

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.root = tmp_path_factory.mktemp("store")
            self.files: LayerFiles | None = None
            self.held: dict[str, int] = {}

        @initialize(budget=st.sampled_from([0, sizes[0], sizes[1] + sizes[2], 10 * GiB]))
        def start(self, budget: int) -> None:
            self.files = LayerFiles(self.root, budget)

        @rule(index=st.integers(0, 3))
        def acquire(self, index: int) -> None:
            assert self.files is not None
            layer = image.layers[index]
            path = asyncio.run(self.files.acquire(layer))
            assert path.is_file()
            self.held[layer.digest] = self.held.get(layer.digest, 0) + 1

        @precondition(lambda self: bool(self.held))
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            assert self.files is not None
            digest = data.draw(st.sampled_from(sorted(self.held)))
            self.files.release(digest)
            self.held[digest] -= 1
            if not self.held[digest]:
                del self.held[digest]

        @rule()
        def restart(self) -> None:
            assert self.files is not None
            for digest, count in self.held.items():
                for _ in range(count):
                    self.files.release(digest)
            self.held.clear()
            self.files = LayerFiles(self.root, self.files.registry.cache_budget_bytes)

        @invariant()
        def files_are_the_advertised_layers(self) -> None:
            if self.files is None:
                return
            registry = self.files.registry
            assert registry.mounted() == set(self.held)
            assert all(registry.refcount(digest) == n for digest, n in self.held.items())
            advertised = registry.mounted() | registry.cached()
            assert set(self.files.files()) == advertised
            on_disk = sorted(os.listdir(self.root))
            assert on_disk == sorted(path.name for path in self.files.files().values())
            assert registry.cached_bytes <= registry.cache_budget_bytes

    run_state_machine_as_test(
        Machine, settings=settings(max_examples=12, stateful_step_count=15, deadline=None)
    )
