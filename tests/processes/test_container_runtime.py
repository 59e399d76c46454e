"""The container runtime on real mounts and a real runc: the contract suites, then what a
container sees, what limits it, and how its layers are shared."""

from __future__ import annotations

import asyncio
import platform
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth.node.config import AgentConfig
from berth.node.container.mounts import mounted, unmount
from berth.node.layer_files import LayerFiles
from berth.node.microvm.images import busybox_layer, write_image
from berth.node.runtime import BootFailed, BootSpec, Runtime, WorkloadHandle
from berth.node.runtime.container import ContainerRuntime
from berth.node.runtime.port import AdoptingRuntime
from berth.node.runtime.supervisor import file_stem, write_owner
from berth.oci import ImageSpec, file, write_layout
from berth.processes.runtimes import container_problems
from berth.testing.runtime_contract import AdoptingRuntimeContract, RuntimeContract, run
from berth.units import MiB

MISSING = container_problems()
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"no containers here: {'; '.join(MISSING)}")

PASSWD = "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:app:/home/app:/bin/sh\n"
GROUP = "root:x:0:\napp:x:1001:\nextra:x:1002:app\n"


@pytest.fixture(autouse=True)
def _unmounted(tmp_path: Path) -> Iterator[None]:
    """What a test's runtimes left mounted under its directory (a cached layer stays mounted
    for a warm start) is unmounted after it."""
    yield
    with open("/proc/mounts") as table:
        points = [line.split()[1] for line in table]
    for point in sorted((p for p in points if p.startswith(str(tmp_path))), reverse=True):
        unmount(Path(point))


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An OCI layout holding ``busybox``, ``app`` (busybox plus a layer naming user ``app``),
    ``foreign`` (busybox built for another architecture than this host's) and ``greeter``
    (an ``Entrypoint`` and a ``Cmd``)."""
    root = tmp_path_factory.mktemp("images")
    base = busybox_layer()
    write_image(root, "busybox", [base])
    users = [file("etc/passwd", PASSWD), file("etc/group", GROUP)]
    write_image(root, "app", [base, users], user="app")
    other = "linux/arm64" if platform.machine() in ("x86_64", "amd64") else "linux/amd64"
    write_layout(root, ImageSpec(layers=[base], platform=other), ref="foreign")
    greeter = ImageSpec(layers=[base], entrypoint=("echo", "said:"), cmd=("from-cmd",))
    write_layout(root, greeter, ref="greeter")
    return root


def make_runtime(layout: Path, where: Path, **options: object) -> ContainerRuntime:
    cache = options.pop("cache", 1 << 30)
    assert isinstance(cache, int)
    files = LayerFiles(where / "layers", cache)
    return ContainerRuntime(files, layout, where / "node", stop_grace_s=2.0, **options)  # type: ignore[arg-type]


def busybox(*command: str, **fields: object) -> BootSpec:
    name = fields.pop("name", "box")
    image = fields.pop("image", "busybox")
    return BootSpec(name=name, command=command, image=image, **fields)


TRAPPING = ("sh", "-c", 'trap "exit 0" TERM; sleep 60 & wait')
"""A container whose init ends on SIGTERM (an init without a handler ignores it)."""


async def wait_for(path: Path, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not path.exists():
        assert asyncio.get_running_loop().time() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)


class TestContainerRuntimeContract(RuntimeContract):
    timeout_s = 30.0

    @pytest.fixture(autouse=True)
    def _where(self, tmp_path: Path, layout: Path) -> None:
        self.where = tmp_path
        self.layout = layout

    def make_runtime(self) -> Runtime:
        return make_runtime(self.layout, self.where)

    def long_running_spec(self) -> BootSpec:
        return busybox(*TRAPPING, name="sleeper")

    def failing_spec(self, runtime: Runtime) -> tuple[BootSpec, str]:
        return busybox("nosuchcmd", name="broken"), "command not found: 'nosuchcmd'"

    async def exit_by_itself(self, runtime: Runtime, code: int) -> WorkloadHandle:
        return await runtime.start(busybox("sh", "-c", f"exit {code}", name="quitter"))

    async def start_ignoring_term(self, runtime: Runtime) -> WorkloadHandle:
        assert isinstance(runtime, ContainerRuntime)
        workload = await runtime.start(
            busybox("sh", "-c", 'trap "" TERM; echo > /tmp/ready; sleep 60', name="stubborn")
        )
        upper = runtime.work_dir / file_stem(workload.id) / "upper"
        await wait_for(upper / "tmp" / "ready")  # the trap is set
        return workload


class TestContainerRuntimeAdoptionContract(AdoptingRuntimeContract):
    timeout_s = 30.0

    @pytest.fixture(autouse=True)
    def _layout(self, layout: Path) -> None:
        self.layout = layout

    def make_runtime(self, state_dir: Path) -> AdoptingRuntime:
        write_owner(state_dir / "agent.pid")  # this process owns the directory
        files = LayerFiles(state_dir / "layers", 1 << 30)
        return ContainerRuntime(
            files, self.layout, state_dir / "node", state_dir=state_dir, stop_grace_s=0.5
        )

    def long_running_spec(self) -> BootSpec:
        return busybox(*TRAPPING, name="sleeper")

    def exiting_spec(self, code: int) -> BootSpec:
        return busybox("sh", "-c", f"exit {code}", name="quitter")


def output(runtime: ContainerRuntime, workload: WorkloadHandle) -> str:
    log = runtime.log_of(workload.id)
    assert log is not None
    return log.read_text()


def test_a_container_sees_its_image_not_the_host(layout: Path, tmp_path: Path) -> None:
    marker = Path("/tmp") / f"berth-host-{uuid.uuid4().hex}"
    marker.write_text("host\n")

    async def scenario() -> str:
        runtime = make_runtime(layout, tmp_path, log_dir=tmp_path / "logs")
        script = f"uname -m; ls /; id -u; id -g; test -e {marker} && echo LEAK; echo end"
        workload = await runtime.start(busybox("sh", "-c", script))
        ended = await workload.wait()
        assert ended.code == 0, ended
        return output(runtime, workload)

    try:
        said = run(scenario, 30).split()
    finally:
        marker.unlink()
    assert said[0] == platform.machine()
    assert said[1:-3] == ["bin", "dev", "etc", "proc", "sys", "tmp"]  # the image's root
    assert said[-3:] == ["65534", "65534", "end"]  # nobody when the image names no user


def test_the_images_cmd_runs_unless_a_command_replaces_it(layout: Path, tmp_path: Path) -> None:
    """As ``docker run``: the image's ``Entrypoint`` always, then the workload's command in
    place of the image's ``Cmd`` — or the ``Cmd`` when it gives none."""

    async def scenario() -> list[str]:
        runtime = make_runtime(layout, tmp_path, log_dir=tmp_path / "logs")
        said = []
        for command in ((), ("given",)):
            spec = BootSpec(name="greet", image="greeter", command=command)
            workload = await runtime.start(spec)
            assert (await workload.wait()).code == 0
            said.append(output(runtime, workload).strip())
        return said

    assert run(scenario, 30) == ["said: from-cmd", "said: given"]


def test_the_images_user_and_the_network_none(layout: Path, tmp_path: Path) -> None:
    async def scenario() -> str:
        runtime = make_runtime(layout, tmp_path, log_dir=tmp_path / "logs", network="none")
        script = "id -u; id -g; id -G; ls /sys/class/net"
        workload = await runtime.start(busybox("sh", "-c", script, image="app"))
        assert (await workload.wait()).code == 0
        return output(runtime, workload)

    uid, gid, groups, *interfaces = run(scenario, 30).split("\n")[:-1]
    assert (uid, gid) == ("1000", "1001")
    assert "1002" in groups.split()
    assert interfaces == ["lo"]


def test_the_memory_limit_kills_and_the_reason_says_so(layout: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        runtime = make_runtime(layout, tmp_path)
        hog = busybox("sh", "-c", "x=aaaaaaaa; while :; do x=$x$x; done", mem_limit=32 * MiB)
        workload = await runtime.start(hog)
        ended = await workload.wait()
        assert ended.signal == 9 and not ended.stopped
        assert workload.reason == "killed by SIGKILL: out of memory: its limit is 32 MiB"

    run(scenario, 60)


def test_two_containers_share_one_mount_of_each_layer(layout: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        runtime = make_runtime(layout, tmp_path, cache=0)  # nothing kept once unused
        first = await runtime.start(busybox(*TRAPPING, name="one"))
        (digest,) = runtime.layer_files.files()
        assert runtime.mounts.mounts == 1 and mounted(runtime.mounts.path(digest))
        second = await runtime.start(busybox(*TRAPPING, name="two"))
        assert runtime.mounts.mounts == 1  # the second mounted nothing new
        await runtime.stop(first.id)
        assert mounted(runtime.mounts.path(digest))  # still used by the second
        await runtime.stop(second.id)
        assert not mounted(runtime.mounts.path(digest))  # the last one's end let it go
        assert list(runtime.work_dir.iterdir()) == []  # no scratch left behind

    run(scenario, 60)


def test_a_cached_layer_stays_mounted_for_a_warm_start(layout: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        runtime = make_runtime(layout, tmp_path)
        assert (await (await runtime.start(busybox("true"))).wait()).code == 0
        (digest,) = runtime.layer_files.files()
        assert mounted(runtime.mounts.path(digest))
        assert (await (await runtime.start(busybox("true"))).wait()).code == 0
        assert runtime.mounts.mounts == 1
        await runtime.aclose()  # an agent that stops lets its mounts go
        assert not mounted(runtime.mounts.path(digest))

    run(scenario, 30)


def test_a_foreign_image_is_refused_with_its_reason(layout: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        runtime = make_runtime(layout, tmp_path)
        with pytest.raises(BootFailed, match="platform_mismatch"):
            await runtime.start(busybox("uname", "-m", image="foreign"))
        assert runtime.mounts.mounts == 0 and runtime.list() == ()

    run(scenario, 30)


def test_an_agent_configured_for_containers_builds_the_runtime(
    layout: Path, tmp_path: Path
) -> None:
    from berth.node.agent import Agent
    from berth.store.memory import MemoryStore

    config = AgentConfig.from_dict(
        {
            "node": {"name": "n1"},
            "budget": {
                "mem_max": "1GiB",
                "disk_max": "1GiB",
                "cpu_max_load": 0.9,
                "disk_bw_cap": "1GiBps",
                "disk_bw_max_load": 0.8,
                "net_bw_cap": "1Gbps",
                "net_bw_max_load": 0.8,
            },
            "agent": {"runtime": "container"},
            "container": {"images": str(layout), "node_dir": str(tmp_path / "node")},
        }
    )
    agent = Agent.from_config(config, MemoryStore())
    runtime = agent.core.runtime
    assert isinstance(runtime, ContainerRuntime)
    assert runtime.images == layout and runtime.node_dir == tmp_path / "node"
    assert agent.labels["container.network"] == "host"


def test_a_stopping_agent_lets_its_layer_mounts_go(layout: Path, tmp_path: Path) -> None:
    from berth.node.agent import Agent
    from berth.store.memory import MemoryStore

    config = AgentConfig.from_dict(
        {
            "node": {"name": "n1"},
            "budget": {
                "mem_max": "1GiB",
                "disk_max": "1GiB",
                "cpu_max_load": 0.9,
                "disk_bw_cap": "1GiBps",
                "disk_bw_max_load": 0.8,
                "net_bw_cap": "1Gbps",
                "net_bw_max_load": 0.8,
            },
            "agent": {"runtime": "container"},
            "container": {"images": str(layout), "node_dir": str(tmp_path / "node")},
        }
    )

    async def scenario() -> None:
        agent = Agent.from_config(config, MemoryStore())
        runtime = agent.core.runtime
        assert isinstance(runtime, ContainerRuntime)
        assert (await (await runtime.start(busybox("true"))).wait()).code == 0
        (digest,) = runtime.layer_files.files()
        assert mounted(runtime.mounts.path(digest))  # cached: kept mounted for a warm start
        await agent.stop()
        assert not mounted(runtime.mounts.path(digest))

    run(scenario, 30)


def test_berth_up_runs_busybox_in_containers_with_no_extra_step() -> None:
    """``berth up``'s container cluster: ``busybox`` is registered when it is up, a workload
    of it runs in a container (its output in the cluster's workload logs), and stopping
    the cluster leaves no mount behind."""
    from berth.api.client import ApiClient, ApiLocation
    from berth.processes.up import LocalCluster

    assert container_problems() == []  # this module runs only where containers can
    cluster = LocalCluster(1, heartbeat_s=0.5, runtime="container", http=("127.0.0.1", 0))
    with cluster as up:
        assert "containers (runc)" in up.describe()
        assert up.api_url is not None and up.api_token is not None
        with ApiClient(ApiLocation(up.api_url, up.api_token, "test")) as api:
            assert [image.name for image in api.images().items] == ["busybox"]
            created = api.create_workload(
                {
                    "name": "hello",
                    "image": "busybox",
                    "type": "micro",
                    "command": ["sh", "-c", "ls /; uname -m"],
                }
            )
            log = up.directory / "logs" / "workloads" / created.node / f"{created.id}.log"
            deadline = time.monotonic() + 20
            while "\n" + platform.machine() not in (log.read_text() if log.exists() else ""):
                assert time.monotonic() < deadline, "the container printed nothing"
                time.sleep(0.1)
            listing = log.read_text().split()
            assert "bin" in listing and "root" not in listing and "home" not in listing
            assert api.logs(created.id).text == log.read_text()  # read from the node
    with open("/proc/mounts") as table:
        assert str(up.directory) not in table.read()
    assert not up.directory.exists()
