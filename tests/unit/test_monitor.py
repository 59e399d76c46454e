"""Live load monitors: the filter's exact math, the meters' delta rules, the sampler's timing."""

from __future__ import annotations

import asyncio
import math

import pytest

from berth.errors import Invalid
from berth.node.monitor import (
    ByteRateMeter,
    CpuBusyMeter,
    CpuTimes,
    LoadMonitor,
    LoadReadings,
    LowPassFilter,
    PsutilCpuTimes,
    PsutilDiskBytes,
    PsutilNetBytes,
    cpu_times_from_fields,
)
from berth.testing.clock import FakeClock


class FakeCpu:
    """Cumulative CPU times the test sets directly; ``None`` means unmeasurable."""

    def __init__(self, times: CpuTimes | None = None) -> None:
        self.times = times
        self.reads = 0

    def read(self) -> CpuTimes | None:
        self.reads += 1
        return self.times


class FakeBytes:
    def __init__(self, value: int | None = None) -> None:
        self.value = value

    def read(self) -> int | None:
        return self.value


def alpha(dt: float, tau: float) -> float:
    return 1 - math.exp(-dt / tau)


# --- LowPassFilter ---------------------------------------------------------------------------


def test_filter_is_empty_until_the_first_sample_which_seeds_it() -> None:
    lpf = LowPassFilter(tau_s=30)
    assert lpf.value is None
    assert lpf.update(0.8, dt_s=123.0) == 0.8  # dt of the first sample is irrelevant
    assert lpf.value == 0.8


def test_filter_gain_follows_the_measured_interval() -> None:
    lpf = LowPassFilter(tau_s=10)
    lpf.update(0.0, 0.0)
    y = lpf.update(1.0, 2.0)
    assert y == pytest.approx(alpha(2.0, 10))
    y2 = lpf.update(1.0, 0.5)  # irregular: a short interval moves it less
    assert y2 == pytest.approx(y + alpha(0.5, 10) * (1.0 - y))
    y3 = lpf.update(0.0, 7.0)
    assert y3 == pytest.approx(y2 + alpha(7.0, 10) * (0.0 - y2))


def test_two_steps_equal_one_step_over_the_combined_interval() -> None:
    split, whole = LowPassFilter(30), LowPassFilter(30)
    split.update(0.0, 0)
    whole.update(0.0, 0)
    split.update(1.0, 1.3)
    split.update(1.0, 4.2)
    whole.update(1.0, 5.5)
    assert split.value == pytest.approx(whole.value)


def test_filter_zero_interval_changes_nothing_and_tau_reaches_63_percent() -> None:
    lpf = LowPassFilter(30)
    lpf.update(0.0, 0)
    assert lpf.update(1.0, 0.0) == 0.0
    assert lpf.update(1.0, 30.0) == pytest.approx(1 - math.exp(-1))


@pytest.mark.parametrize("tau", [0, -1, math.inf, math.nan])
def test_filter_rejects_a_non_positive_tau(tau: float) -> None:
    with pytest.raises(Invalid) as caught:
        LowPassFilter(tau)
    assert caught.value.field == "tau_s"


def test_filter_rejects_negative_interval_and_non_finite_samples() -> None:
    lpf = LowPassFilter(1)
    with pytest.raises(Invalid) as caught:
        lpf.update(math.nan, 1)
    assert caught.value.field == "sample"
    with pytest.raises(Invalid) as caught:
        lpf.update(1.0, -0.1)
    assert caught.value.field == "dt_s"
    assert lpf.value is None


# --- meters ----------------------------------------------------------------------------------


def test_cpu_times_exclude_guest_and_count_iowait_as_idle() -> None:
    fields = {
        "user": 50.0,
        "nice": 10.0,
        "system": 20.0,
        "idle": 100.0,
        "iowait": 15.0,
        "irq": 1.0,
        "softirq": 2.0,
        "steal": 2.0,
        "guest": 7.0,  # already inside user
        "guest_nice": 3.0,  # already inside nice
    }
    times = cpu_times_from_fields(fields)
    assert times.total_s == pytest.approx(200.0)
    assert times.busy_s == pytest.approx(85.0)


def test_cpu_busy_is_the_delta_ratio_over_all_cores() -> None:
    source = FakeCpu(CpuTimes(busy_s=10.0, total_s=100.0))
    meter = CpuBusyMeter(source)
    assert meter.observe() is None  # baseline
    source.times = CpuTimes(busy_s=13.0, total_s=108.0)  # e.g. 4 cores x 2 s
    assert meter.observe() == pytest.approx(3 / 8)


def test_cpu_busy_is_clamped_and_a_reset_is_skipped() -> None:
    source = FakeCpu(CpuTimes(busy_s=10.0, total_s=100.0))
    meter = CpuBusyMeter(source)
    meter.observe()
    source.times = CpuTimes(busy_s=20.0, total_s=104.0)  # non-atomic read: "250 % busy"
    assert meter.observe() == 1.0
    source.times = CpuTimes(busy_s=19.0, total_s=108.0)  # iowait moved backwards
    assert meter.observe() == 0.0
    source.times = CpuTimes(busy_s=1.0, total_s=5.0)  # counters reset
    assert meter.observe() is None
    source.times = CpuTimes(busy_s=2.0, total_s=9.0)  # measured from the new baseline
    assert meter.observe() == pytest.approx(1 / 4)


def test_cpu_busy_without_elapsed_time_keeps_the_baseline() -> None:
    source = FakeCpu(CpuTimes(busy_s=0.0, total_s=10.0))
    meter = CpuBusyMeter(source)
    meter.observe()
    assert meter.observe() is None  # read again within one kernel tick
    source.times = CpuTimes(busy_s=1.0, total_s=12.0)
    assert meter.observe() == pytest.approx(0.5)


def test_byte_rate_is_delta_over_time_and_a_counter_going_backwards_is_skipped() -> None:
    source = FakeBytes(1_000)
    meter = ByteRateMeter(source)
    assert meter.observe(10.0) is None
    source.value = 3_000
    assert meter.observe(10.5) == pytest.approx(4_000.0)
    source.value = 500  # wrapped or reset
    assert meter.observe(11.0) is None
    source.value = 1_500
    assert meter.observe(12.0) == pytest.approx(1_000.0)
    assert meter.observe(12.0) is None  # no time elapsed


def test_byte_rate_unmeasured_counter_drops_the_baseline() -> None:
    source = FakeBytes(0)
    meter = ByteRateMeter(source)
    meter.observe(0.0)
    source.value = None
    assert meter.observe(1.0) is None
    source.value = 10_000
    assert meter.observe(2.0) is None  # a fresh baseline, not 10 000 B over 2 s
    source.value = 10_100
    assert meter.observe(3.0) == pytest.approx(100.0)


# --- LoadMonitor -----------------------------------------------------------------------------


def make_monitor(
    clock: FakeClock, tau: float = 10.0
) -> tuple[LoadMonitor, FakeCpu, FakeBytes, FakeBytes]:
    cpu, disk, net = FakeCpu(), FakeBytes(), FakeBytes()
    return LoadMonitor(cpu=cpu, disk=disk, net=net, tau_s=tau, clock=clock), cpu, disk, net


def test_unmeasured_metrics_read_idle() -> None:
    clock = FakeClock(100.0)
    monitor, _, _, _ = make_monitor(clock)
    assert isinstance(monitor, LoadReadings)
    monitor.sample()
    clock.now += 1
    monitor.sample()
    assert (monitor.cpu_load, monitor.disk_bw_load, monitor.net_bw_load) == (0.0, 0.0, 0.0)


def test_monitor_smooths_each_metric_with_the_measured_interval() -> None:
    clock = FakeClock(100.0)
    monitor, cpu, disk, net = make_monitor(clock, tau=10.0)
    cpu.times, disk.value, net.value = CpuTimes(0, 0), 0, 0
    monitor.sample()  # baselines only
    assert monitor.cpu_load == 0.0

    clock.now += 1.0
    cpu.times, disk.value, net.value = CpuTimes(1.0, 2.0), 4_000, 1_000
    monitor.sample()  # first readings seed the filters
    assert monitor.cpu_load == pytest.approx(0.5)
    assert monitor.disk_bw_load == pytest.approx(4_000.0)
    assert monitor.net_bw_load == pytest.approx(1_000.0)

    clock.now += 3.0  # irregular interval
    cpu.times, disk.value, net.value = CpuTimes(1.0, 8.0), 4_000, 13_000
    monitor.sample()  # instantaneous: cpu 0.0, disk 0 B/s, net 4 000 B/s
    a = alpha(3.0, 10.0)
    assert monitor.cpu_load == pytest.approx(0.5 + a * (0.0 - 0.5))
    assert monitor.disk_bw_load == pytest.approx(4_000.0 + a * (0.0 - 4_000.0))
    assert monitor.net_bw_load == pytest.approx(1_000.0 + a * (4_000.0 - 1_000.0))


def test_a_skipped_sample_widens_the_next_interval_of_that_metric_only() -> None:
    clock = FakeClock(100.0)
    monitor, cpu, disk, _ = make_monitor(clock, tau=10.0)
    cpu.times, disk.value = CpuTimes(0, 0), 0
    monitor.sample()
    clock.now += 1
    cpu.times, disk.value = CpuTimes(1, 1), 1_000
    monitor.sample()  # seeds: cpu 1.0, disk 1000
    clock.now += 1
    cpu.times, disk.value = CpuTimes(1, 2), 0  # disk counter reset: no disk sample
    monitor.sample()
    assert monitor.disk_bw_load == pytest.approx(1_000.0)
    clock.now += 1
    cpu.times, disk.value = CpuTimes(1, 3), 500
    monitor.sample()
    # disk: 500 B/s over the last second, filtered with dt = 2 s since its previous sample
    assert monitor.disk_bw_load == pytest.approx(1_000 + alpha(2, 10) * (500 - 1_000))
    y = 1.0 + alpha(1, 10) * (0.0 - 1.0)
    assert monitor.cpu_load == pytest.approx(y + alpha(1, 10) * (0.0 - y))


def test_cpu_reading_stays_within_zero_and_one() -> None:
    clock = FakeClock(100.0)
    monitor, cpu, _, _ = make_monitor(clock)
    cpu.times = CpuTimes(0, 0)
    monitor.sample()
    clock.now += 1
    cpu.times = CpuTimes(50, 4)  # nonsense counters: clamped before filtering
    monitor.sample()
    assert monitor.cpu_load == 1.0


def test_monitor_rejects_bad_timings() -> None:
    with pytest.raises(Invalid) as caught:
        LoadMonitor(cpu=FakeCpu(), disk=FakeBytes(), net=FakeBytes(), tau_s=0.0)
    assert caught.value.field == "tau_s"
    with pytest.raises(Invalid) as caught:
        LoadMonitor(cpu=FakeCpu(), disk=FakeBytes(), net=FakeBytes(), period_s=-1.0)
    assert caught.value.field == "period_s"


# --- background sampling ---------------------------------------------------------------------


class SlowCpu(FakeCpu):
    """A CPU source whose read takes ``cost_s`` seconds of fake time; records read times."""

    def __init__(self, clock: FakeClock, cost_s: float) -> None:
        super().__init__(CpuTimes(0, 0))
        self.clock = clock
        self.cost_s = cost_s
        self.read_at: list[float] = []

    def read(self) -> CpuTimes | None:
        self.read_at.append(self.clock.now)
        self.clock.now += self.cost_s
        return super().read()


def run_sampler(cost_s: float, period_s: float, samples: int) -> tuple[list[float], list[float]]:
    clock = FakeClock(0.0)
    cpu = SlowCpu(clock, cost_s)
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.now += seconds
        await asyncio.sleep(0)

    monitor = LoadMonitor(
        cpu=cpu, disk=FakeBytes(), net=FakeBytes(), period_s=period_s, clock=clock, sleep=fake_sleep
    )

    async def scenario() -> None:
        async with monitor:
            assert monitor.running
            while cpu.reads < samples:
                await asyncio.sleep(0)
        assert not monitor.running

    asyncio.run(asyncio.wait_for(scenario(), 5))
    return cpu.read_at, sleeps


def test_sampler_samples_at_once_then_every_period() -> None:
    read_at, sleeps = run_sampler(cost_s=0.0, period_s=0.25, samples=5)
    assert read_at[:5] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert sleeps[:4] == pytest.approx([0.25] * 4)


def test_a_slow_sample_skips_missed_ticks_instead_of_piling_them_up() -> None:
    # Each sample takes 0.6 s of a 0.25 s period: the ticks at 0.25 and 0.5 are missed and
    # dropped; the next sample starts on the grid at 0.75, never back to back.
    read_at, sleeps = run_sampler(cost_s=0.6, period_s=0.25, samples=6)
    assert read_at[:6] == pytest.approx([0.0, 0.75, 1.5, 2.25, 3.0, 3.75])
    assert all(0.0 < seconds <= 0.25 for seconds in sleeps)


def test_stop_is_idempotent_and_readings_survive_it() -> None:
    async def scenario() -> None:
        clock = FakeClock(100.0)
        cpu = FakeCpu(CpuTimes(0, 0))
        monitor = LoadMonitor(cpu=cpu, disk=FakeBytes(), net=FakeBytes(), clock=clock)
        await monitor.stop()  # never started
        monitor.start()
        monitor.start()  # already running: no second sampler
        await asyncio.sleep(0)
        cpu.times = CpuTimes(1, 1)
        clock.now += 1
        monitor.sample()
        await monitor.stop()
        await monitor.stop()
        assert monitor.cpu_load == 1.0
        assert cpu.reads == 2

    asyncio.run(asyncio.wait_for(scenario(), 5))


# --- this machine ----------------------------------------------------------------------------


def test_real_counters_give_readings_in_range() -> None:
    assert PsutilCpuTimes().read() is not None
    for source in (PsutilDiskBytes(), PsutilNetBytes()):
        value = source.read()
        assert value is None or value >= 0

    async def scenario() -> LoadMonitor:
        sum(i * i for i in range(200_000))  # some CPU work to measure
        async with LoadMonitor(tau_s=1.0, period_s=0.02) as monitor:
            await asyncio.sleep(0.2)
        return monitor

    monitor = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert 0.0 <= monitor.cpu_load <= 1.0
    assert monitor.disk_bw_load >= 0.0
    assert monitor.net_bw_load >= 0.0
