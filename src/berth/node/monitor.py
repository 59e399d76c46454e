"""Live load monitors: how busy this machine really is, smoothed.

This module owns the *measured* input of a node's soft budget (docs/design.md §1.3): the CPU busy
fraction of the whole machine, and disk and network throughput, each read from cumulative
counters, turned into a rate from consecutive deltas and smoothed by a first-order low-pass
filter.  :class:`LoadMonitor` exposes the three smoothed readings through the
:class:`LoadReadings` protocol, which is all the node budget depends on, and can sample itself
in the background on an asyncio task.

It is deliberately *not* the admission decision (the budget compares these readings with its
ceilings) and it does not account reservations: declared specs say what a workload may use,
these readings say what the machine is using.  The soft check needs the latter, because
over-committing soft resources only slows things down and the real load is what tells.

Why the details matter:

* CPU is the busy share of *all* cores from ``/proc/stat``-style cumulative times
  (``busy = total - idle - iowait`` over the ``total`` delta, clamped to 0..1), never the load
  average, which counts runnable and blocked tasks and is not a fraction of capacity.
* Sampling is irregular in practice (a busy event loop delays ticks), so the filter's gain is
  derived from the measured interval — ``alpha = 1 - exp(-dt / tau)`` — which makes the
  filter's memory a matter of elapsed time, not of how many samples happened to be taken.
* A metric that has not been measured yet (or cannot be, e.g. a machine with no disk
  counters) reads as idle, ``0.0``, so a freshly started node is schedulable.
* A counter that goes backwards (wrap or reset) yields no sample rather than a huge negative
  or positive rate.

Hyper samples CPU every 23 ms with ``tau = 30 s``.  berth defaults to a 0.25 s period for all
three metrics — with a 30 s time constant, sampling ten times slower changes the smoothed
value negligibly and costs a tenth of the wake-ups — and keeps both configurable.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

import psutil

from berth.defaults import LOAD_SAMPLE_PERIOD_S, LOAD_TAU_S
from berth.errors import Invalid
from berth.node.budget import LoadReadings

__all__ = [
    "ByteCounterSource",
    "ByteRateMeter",
    "Clock",
    "CpuBusyMeter",
    "CpuTimes",
    "CpuTimesSource",
    "LoadMonitor",
    "LoadReadings",
    "LowPassFilter",
    "PsutilCpuTimes",
    "PsutilDiskBytes",
    "PsutilNetBytes",
    "cpu_times_from_fields",
]

logger = logging.getLogger(__name__)


class Clock(Protocol):
    """A monotonic clock in seconds, like :func:`time.monotonic` (which is the default)."""

    def __call__(self) -> float: ...


Sleep = Callable[[float], Awaitable[None]]
"""Suspends for a number of seconds, like :func:`asyncio.sleep` (which is the default)."""


def _positive_seconds(value: float, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(f"must be a number of seconds, got {value!r}", field=field)
    if not math.isfinite(value) or value <= 0:
        raise Invalid(f"must be a positive, finite number of seconds, got {value!r}", field=field)
    return float(value)


class LowPassFilter:
    """First-order low-pass filter whose gain is correct for irregular sampling.

    For a sample ``x`` taken ``dt`` seconds after the previous one::

        alpha = 1 - exp(-dt / tau)
        y     = y + alpha * (x - y)

    The first sample seeds the filter (``y = x``, whatever ``dt``).  Because
    ``(1 - alpha(dt1)) * (1 - alpha(dt2)) == 1 - alpha(dt1 + dt2)``, feeding a constant input
    in two steps equals feeding it once over the combined interval: the filter forgets at a
    rate set by elapsed time (``tau`` seconds to move 63 % of the way to a new level), not by
    the number of samples.  ``value`` is ``None`` until the first sample.
    """

    def __init__(self, tau_s: float) -> None:
        self.tau_s = _positive_seconds(tau_s, "tau_s")
        self._value: float | None = None

    @property
    def value(self) -> float | None:
        """The filtered value, or ``None`` before the first sample."""
        return self._value

    def update(self, sample: float, dt_s: float) -> float:
        """Feed ``sample`` taken ``dt_s`` seconds after the previous one; the new value."""
        if not math.isfinite(sample):
            raise Invalid(f"must be a finite number, got {sample!r}", field="sample")
        if not math.isfinite(dt_s) or dt_s < 0:
            raise Invalid(f"must be a finite, non-negative interval, got {dt_s!r}", field="dt_s")
        if self._value is None:
            self._value = float(sample)
        else:
            alpha = 1.0 - math.exp(-dt_s / self.tau_s)
            self._value += alpha * (sample - self._value)
        return self._value

    def reset(self) -> None:
        """Forget everything; the next sample seeds the filter again."""
        self._value = None

    def __repr__(self) -> str:
        return f"LowPassFilter(tau_s={self.tau_s!r}, value={self._value!r})"


# --- counter sources ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Cumulative CPU time over all cores, seconds: time spent busy, and time in total."""

    busy_s: float
    total_s: float


class CpuTimesSource(Protocol):
    """Reads cumulative CPU times; ``None`` when they cannot be measured on this machine."""

    def read(self) -> CpuTimes | None: ...


class ByteCounterSource(Protocol):
    """Reads a cumulative byte counter; ``None`` when it cannot be measured on this machine."""

    def read(self) -> int | None: ...


def cpu_times_from_fields(fields: Mapping[str, float]) -> CpuTimes:
    """Busy and total CPU time from ``/proc/stat``-style fields (``psutil.cpu_times()``).

    ``total`` is the sum of all fields except ``guest`` and ``guest_nice``, which Linux already
    counts inside ``user`` and ``nice``; ``busy = total - idle - iowait`` (a core waiting for
    I/O is available to run other work, so it is not busy).
    """
    total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
    idle = fields.get("idle", 0.0) + fields.get("iowait", 0.0)
    return CpuTimes(busy_s=total - idle, total_s=total)


class PsutilCpuTimes:
    """This machine's cumulative CPU times over all cores, via ``psutil.cpu_times()``."""

    def read(self) -> CpuTimes | None:
        try:
            times = psutil.cpu_times(percpu=False)
        except (OSError, RuntimeError):  # no readable /proc/stat (sandboxes, odd platforms)
            return None
        return cpu_times_from_fields(times._asdict())


class PsutilDiskBytes:
    """Bytes read plus written by all physical disks, via ``psutil.disk_io_counters()``.

    psutil sums whole disks only (not partitions, which would count each byte twice).
    """

    def read(self) -> int | None:
        try:
            counters = psutil.disk_io_counters(perdisk=False)
        except (OSError, RuntimeError):
            return None
        if counters is None:  # a machine without disk statistics
            return None
        return int(counters.read_bytes + counters.write_bytes)


class PsutilNetBytes:
    """Bytes sent plus received on every network interface but ``exclude_interfaces``.

    Loopback is excluded by default: its traffic never touches the NIC whose bandwidth the
    node's ``net_bw`` ceiling describes.  Add virtual interfaces that mirror real traffic
    (``ifb*``, bridges) to avoid counting a byte twice.
    """

    def __init__(self, exclude_interfaces: Collection[str] = ("lo", "lo0")) -> None:
        self.exclude_interfaces = frozenset(exclude_interfaces)

    def read(self) -> int | None:
        try:
            per_interface = psutil.net_io_counters(pernic=True)
        except (OSError, RuntimeError):
            return None
        if not per_interface:  # no interfaces (or no statistics) on this machine
            return None
        return sum(
            int(counters.bytes_sent + counters.bytes_recv)
            for name, counters in per_interface.items()
            if name not in self.exclude_interfaces
        )


# --- meters: counters -> instantaneous readings ---------------------------------------------


class CpuBusyMeter:
    """The busy fraction of the machine between two consecutive reads.

    ``busy = Δbusy_s / Δtotal_s``, clamped to ``0..1`` (counters are sampled non-atomically,
    and Linux may move ``iowait`` backwards, so the raw ratio can stray slightly).  The first
    read only sets the baseline.  No reading when the counters are unavailable, when no CPU
    time elapsed (reads closer together than the kernel's tick), or when ``total`` went
    backwards (a reset: the baseline restarts from the new value).
    """

    def __init__(self, source: CpuTimesSource) -> None:
        self.source = source
        self._last: CpuTimes | None = None

    def observe(self) -> float | None:
        now = self.source.read()
        last = self._last
        if now is None or last is None:
            self._last = now
            return None
        elapsed = now.total_s - last.total_s
        if elapsed == 0:
            return None  # keep the baseline: the next read covers a longer interval
        self._last = now
        if elapsed < 0:
            return None
        return min(1.0, max(0.0, (now.busy_s - last.busy_s) / elapsed))


class ByteRateMeter:
    """Throughput in bytes/s between two consecutive reads: ``Δbytes / Δt``.

    The first read only sets the baseline.  No reading when the counter is unavailable (the
    baseline is dropped), when no time elapsed, or when the counter went backwards (wrap or
    reset: the sample is skipped and the baseline restarts from the new value).
    """

    def __init__(self, source: ByteCounterSource) -> None:
        self.source = source
        self._last: tuple[int, float] | None = None

    def observe(self, now_s: float) -> float | None:
        value = self.source.read()
        last = self._last
        if value is None or last is None:
            self._last = None if value is None else (value, now_s)
            return None
        last_value, last_s = last
        elapsed = now_s - last_s
        if elapsed <= 0:
            return None
        self._last = (value, now_s)
        if value < last_value:
            return None
        return (value - last_value) / elapsed


class _Smoothed:
    """A filter plus the time of its last update, so ``dt`` is measured per metric."""

    def __init__(self, tau_s: float) -> None:
        self.filter = LowPassFilter(tau_s)
        self._last_s: float | None = None

    def feed(self, sample: float, now_s: float) -> None:
        dt = 0.0 if self._last_s is None else max(0.0, now_s - self._last_s)
        self.filter.update(sample, dt)
        self._last_s = now_s

    @property
    def reading(self) -> float:
        value = self.filter.value
        return 0.0 if value is None else value


# --- the monitor ----------------------------------------------------------------------------


class LoadMonitor:
    """Smoothed CPU, disk and network load of this machine; a :class:`LoadReadings`.

    ``sample()`` reads all three counters once and feeds each filter with the interval since
    that metric's previous sample.  Sources default to this machine's counters via psutil;
    pass fakes (and a fake ``clock``) to test or simulate.

    In the background: ``start()`` / ``await stop()``, or ``async with monitor:``.  The
    sampler samples at once, then every ``period_s`` on a fixed grid.  A sample that overruns
    one or more ticks never causes a burst of catch-up samples: the missed ticks are skipped
    and the next sample waits for the next grid point after *now*.  One task takes every
    sample, so two samples never run concurrently.  Samples run on the event loop; psutil
    reads are sub-millisecond ``/proc`` reads.
    """

    def __init__(
        self,
        *,
        cpu: CpuTimesSource | None = None,
        disk: ByteCounterSource | None = None,
        net: ByteCounterSource | None = None,
        tau_s: float = LOAD_TAU_S,
        period_s: float = LOAD_SAMPLE_PERIOD_S,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.tau_s = _positive_seconds(tau_s, "tau_s")
        self.period_s = _positive_seconds(period_s, "period_s")
        self._cpu_meter = CpuBusyMeter(cpu if cpu is not None else PsutilCpuTimes())
        self._disk_meter = ByteRateMeter(disk if disk is not None else PsutilDiskBytes())
        self._net_meter = ByteRateMeter(net if net is not None else PsutilNetBytes())
        self._cpu = _Smoothed(self.tau_s)
        self._disk = _Smoothed(self.tau_s)
        self._net = _Smoothed(self.tau_s)
        self._clock = clock
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None

    @property
    def cpu_load(self) -> float:
        """Smoothed busy fraction of all cores, 0..1; ``0.0`` until measured."""
        return self._cpu.reading

    @property
    def disk_bw_load(self) -> float:
        """Smoothed disk throughput (read + write), bytes/s; ``0.0`` until measured."""
        return self._disk.reading

    @property
    def net_bw_load(self) -> float:
        """Smoothed network throughput (sent + received), bytes/s; ``0.0`` until measured."""
        return self._net.reading

    def sample(self) -> None:
        """Read every counter once and update the smoothed readings."""
        now = self._clock()
        busy = self._cpu_meter.observe()
        if busy is not None:
            self._cpu.feed(busy, now)
        disk = self._disk_meter.observe(now)
        if disk is not None:
            self._disk.feed(disk, now)
        net = self._net_meter.observe(now)
        if net is not None:
            self._net.feed(net, now)

    # --- background sampling --------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the background sampler is running."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start sampling in the background on the running loop; a no-op when running."""
        if self.running:
            return
        self._task = asyncio.get_running_loop().create_task(
            self._sample_periodically(), name="berth-load-monitor"
        )

    async def stop(self) -> None:
        """Stop the background sampler (idempotent); the readings keep their last values."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait([task])

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _sample_periodically(self) -> None:
        period = self.period_s
        next_tick = self._clock()
        while True:
            try:
                self.sample()
            except Exception:
                # A broken counter must not freeze the other readings for good.
                logger.exception("load sample failed; keeping the previous readings")
            now = self._clock()
            next_tick += period
            if next_tick <= now:
                next_tick += (math.floor((now - next_tick) / period) + 1) * period
            await self._sleep(max(0.0, next_tick - now))

    def __repr__(self) -> str:
        return (
            f"LoadMonitor(cpu_load={self.cpu_load:.3f}, disk_bw_load={self.disk_bw_load:.0f}, "
            f"net_bw_load={self.net_bw_load:.0f}, tau_s={self.tau_s}, period_s={self.period_s})"
        )
