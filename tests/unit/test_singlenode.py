"""The single-node driver: the seed's semantics, and the shipped conformance suite."""

from __future__ import annotations

import asyncio

import pytest

from berth import Invalid, NoMatchingPlatform, Platform, Request, Scheduler, SingleNode
from berth.testing.placement_contract import SchedulerContract


class TestSingleNodeContract(SchedulerContract):
    def make_scheduler(self) -> Scheduler:
        return SingleNode("worker-1", "linux/amd64")

    def node_platforms(self) -> set[Platform]:
        return {Platform.parse("linux/amd64")}


class TestSingleNodeArmContract(SchedulerContract):
    def make_scheduler(self) -> Scheduler:
        return SingleNode("pi", "linux/aarch64")

    def node_platforms(self) -> set[Platform]:
        return {Platform.parse("linux/arm64/v8")}


@pytest.mark.parametrize("local", ["", "   "])
def test_empty_local_name_is_invalid(local: str) -> None:
    with pytest.raises(Invalid) as caught:
        SingleNode(local, "linux/amd64")
    assert caught.value.field == "local"


@pytest.mark.parametrize("platform", ["", "linux", "amd64", "linux/", "linux/amd64/v1/x"])
def test_platform_not_os_arch_is_invalid(platform: str) -> None:
    with pytest.raises(Invalid) as caught:
        SingleNode("w", platform)
    assert caught.value.field == "platform"


def test_no_matching_platform_names_artifact_node_and_platform() -> None:
    driver = SingleNode("worker-1", "linux/amd64")
    request = Request(namespace="ns", name="fn", platforms=("linux/arm64", "linux/s390x"))
    with pytest.raises(NoMatchingPlatform) as caught:
        asyncio.run(driver.schedule(request))
    message = str(caught.value)
    for part in ("linux/arm64/v8", "linux/s390x", "worker-1", "linux/amd64"):
        assert part in message
    assert isinstance(caught.value, Invalid)


def test_places_on_local_regardless_of_resources() -> None:
    driver = SingleNode("worker-1", "linux/amd64")
    request = Request(namespace="ns", name="fn", spec="tera", layers=(("l", 10),))
    assert asyncio.run(driver.schedule(request)).worker_node == "worker-1"
    assert isinstance(driver, Scheduler)
