"""The sampler: asks the `Reader` about once a second and keeps what a scrape needs.

NVML's per-process utilization is a ring buffer of short samples, so it has to be read
often and remembered: each tick asks every GPU for its status, its processes and the
samples newer than the newest one already seen (the last-seen timestamp per GPU), and
records per (GPU, PID) the tick's mean SM ratio (0 when the process ran no kernel, but
nothing for a CUDA MPS client without samples: NVML may charge its kernels to the MPS
server, and on driver 580 does, so its compute is unknown rather than idle). A
scrape (`readings`) averages those tick values over the time since the previous scrape,
clamped to [min_window, max_window], so a 15 s and a 60 s Prometheus interval both get
an honest mean. Memory is the last value seen. A process that vanished is dropped.

It also owns recovery, because NVML fails in ways that fix themselves: if NVML will not
open or goes away, readings say `nvml_up=False` and opening is retried with bounded
backoff (1 s doubling to 60 s); a GPU that stops answering is reported unhealthy with no
status while the others keep reporting, and NVML is reopened every `reopen_interval`
until it answers. A critical XID (anything but the application faults the NVIDIA device
plugin ignores) marks its GPU unhealthy until NVML is reopened and the GPU answers. All
of it goes through `Health`, which logs once per change of state.
"""

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from exporter.health import NVML, Health
from exporter.readings import (
    Device,
    DeviceLost,
    DeviceStatus,
    GpuReading,
    NvmlUnavailable,
    ProcessKind,
    ProcessMemory,
    ProcessUsage,
    Reader,
    Readings,
    Xid,
)

# XIDs caused by an application, not the GPU (as the NVIDIA device plugin skips them):
# 13 graphics engine exception, 31 MMU fault, 43 channel stopped, 45 preemptive cleanup,
# 68 video processor exception, 109 context switch timeout.
APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
FIRST_BACKOFF: Final = 1.0
MAX_BACKOFF: Final = 60.0
STUCK_AFTER: Final = 60.0  # seconds without a finished tick before `alive` says no


@dataclass(frozen=True, slots=True)
class _Answer:
    """What one GPU answered in one tick."""

    status: DeviceStatus
    processes: Mapping[int, ProcessMemory]
    sm: Mapping[int, float]  # pid -> mean SM ratio of this tick's samples, 0.0: idle
    last_seen_us: int


class Sampler:
    """Owns the reader. `sample_once` is one tick (the thread calls it every `interval`;
    tests call it directly with an injected clock); `readings` and `devices` may be
    called from any thread."""

    def __init__(
        self,
        reader: Reader,
        health: Health,
        *,
        interval: float = 1.0,
        min_window: float = 5.0,
        max_window: float = 60.0,
        reopen_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = reader
        self._health = health
        self._interval = interval
        self._min_window = min_window
        self._max_window = max(max_window, min_window)
        self._reopen_interval = reopen_interval
        self._clock = clock
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat = 0.0  # time.monotonic() when the thread last finished a tick
        # Only the ticking thread touches these.
        self._is_open = False
        self._retry_at = float("-inf")
        self._backoff = FIRST_BACKOFF
        self._opened_at = 0.0
        self._generation = 0  # successful opens so far
        self._last_seen_us: dict[str, int] = {}
        self._reported: str | None = None  # the device problem last told to health
        # Shared with readers, under the lock.
        self._lock = threading.Lock()
        self._up = False
        self._devices: list[Device] = []
        self._missing: set[str] = set()  # known GPUs the last open did not list
        self._status: dict[str, DeviceStatus] = {}
        self._lost: dict[str, str] = {}
        self._processes: dict[str, Mapping[int, ProcessMemory]] = {}
        self._history: dict[str, dict[int, deque[tuple[float, float]]]] = {}
        self._xid_count: dict[str, int] = {}
        self._last_xid: dict[str, int] = {}
        self._xid_unhealthy: dict[str, int] = {}  # uuid -> generation when it happened
        self._tick_at: float | None = None
        self._scraped_at: float | None = None

    # -- the thread ----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="gpupack-sampler", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """For liveness: the thread runs and is not stuck in a tick (a GPU falling off
        the bus can hang NVML calls); a restart is the cure for either."""
        thread = self._thread
        stuck_after = max(STUCK_AFTER, 10 * self._interval)
        return (
            thread is not None and thread.is_alive() and time.monotonic() - self._beat < stuck_after
        )

    def stop(self) -> None:
        """Stop the thread (waiting for its tick to finish) and close the reader."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._reader.close()
        self._is_open = False
        with self._lock:
            self._up = False

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception as err:  # the thread must outlive any bug below it
                self._reported = None
                self._health.failed(NVML, f"sampling failed: {err!r}")
            self._beat = time.monotonic()
            self._stopping.wait(max(0.0, self._interval - (time.monotonic() - started)))

    # -- one tick ------------------------------------------------------------------------

    def sample_once(self) -> None:
        now = self._clock()
        if not self._is_open and not self._open(now):
            return
        troubled = self._lost or self._missing
        if troubled and now - self._opened_at >= self._reopen_interval:
            self._reader.close()  # a lost GPU comes back, if at all, on a fresh NVML
            self._retry_at = now
            if not self._open(now):
                return
        try:
            answers = {
                device.uuid: self._ask(device)
                for device in self._devices
                if device.uuid not in self._missing
            }
            xids = self._reader.xids()
        except NvmlUnavailable as err:
            self._down(now, str(err))
            return
        self._commit(now, answers, xids)
        self._report()

    def _open(self, now: float) -> bool:
        if now < self._retry_at:
            return False
        try:
            listed = self._reader.open()
        except NvmlUnavailable as err:
            self._down(now, str(err))
            return False
        uuids = {device.uuid for device in listed}
        missing = [device for device in self._devices if device.uuid not in uuids]
        with self._lock:
            self._devices = sorted([*listed, *missing], key=lambda device: device.index)
            self._missing = {device.uuid for device in missing}
            for uuid in self._missing:
                self._lost[uuid] = "not listed by NVML after reopening"
        self._is_open = True
        self._generation += 1
        self._opened_at = now
        self._backoff = FIRST_BACKOFF
        return True

    def _down(self, now: float, message: str) -> None:
        self._reader.close()
        self._is_open = False
        with self._lock:
            self._up = False
            self._status.clear()
            self._lost.clear()
            self._processes.clear()
            self._history.clear()
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF)
        self._reported = message
        self._health.failed(NVML, message)

    def _ask(self, device: Device) -> _Answer | str:
        """The device's answer, or why it did not answer."""
        since = self._last_seen_us.get(device.uuid, 0)
        try:
            status = self._reader.status(device)
            processes = {process.pid: process for process in self._reader.processes(device)}
            samples = self._reader.utilization(device, since)
        except DeviceLost as err:
            return str(err) or "lost"
        by_pid: dict[int, list[float]] = {}
        newest = since
        for sample in samples:
            if sample.timestamp_us > since:
                by_pid.setdefault(sample.pid, []).append(sample.sm)
                newest = max(newest, sample.timestamp_us)
        # No sample is idle, except for an MPS client: NVML may put all of its SM time on
        # the MPS server (driver 580 does), so its silence says nothing; it has no compute.
        sm = {
            pid: _mean(by_pid[pid]) if pid in by_pid else 0.0
            for pid, process in processes.items()
            if pid in by_pid or process.kind is not ProcessKind.MPS_CLIENT
        }
        return _Answer(status, processes, sm, newest)

    def _commit(self, now: float, answers: Mapping[str, _Answer | str], xids: list[Xid]) -> None:
        oldest = now - self._max_window
        with self._lock:
            for device in self._devices:
                answer = answers.get(device.uuid)
                if answer is None:
                    continue
                if isinstance(answer, str):
                    self._lost[device.uuid] = answer
                    self._status.pop(device.uuid, None)
                    self._processes.pop(device.uuid, None)
                    self._history.pop(device.uuid, None)
                    continue
                self._lost.pop(device.uuid, None)
                self._last_seen_us[device.uuid] = answer.last_seen_us
                self._status[device.uuid] = answer.status
                self._processes[device.uuid] = answer.processes
                if not device.mig:
                    self._history[device.uuid] = _extend(
                        self._history.get(device.uuid, {}), answer.processes, answer.sm, now, oldest
                    )
                if self._xid_unhealthy.get(device.uuid, self._generation) < self._generation:
                    del self._xid_unhealthy[device.uuid]
            for xid in xids:
                self._xid_count[xid.uuid] = self._xid_count.get(xid.uuid, 0) + 1
                self._last_xid[xid.uuid] = xid.code
                if xid.code not in APPLICATION_XIDS:
                    self._xid_unhealthy[xid.uuid] = self._generation
            self._tick_at = now
            self._up = True  # scrapes see NVML up once a whole tick has landed

    def _report(self) -> None:
        problems = list(self.unhealthy().values())
        if not problems:
            self._reported = None
            self._health.ok(NVML)
        elif (message := "; ".join(problems)) != self._reported:
            self._reported = message  # tell health once per new problem, not every tick
            self._health.failed(NVML, message)

    # -- what a scrape sees --------------------------------------------------------------

    def readings(self) -> Readings:
        now = self._clock()
        with self._lock:
            since = self._scraped_at
            window = self._min_window if since is None else now - since
            window = min(max(window, self._min_window), self._max_window)
            self._scraped_at = now
            age = None if self._tick_at is None else max(0.0, now - self._tick_at)
            if not self._up:
                return Readings(gpus=(), nvml_up=False, sample_age=age, window=window)
            gpus = tuple(self._gpu(device, now - window) for device in self._devices)
        return Readings(gpus=gpus, nvml_up=True, sample_age=age, window=window)

    def devices(self) -> list[Device]:
        """The GPUs last listed (a lost one stays, so its index and UUID still resolve)."""
        with self._lock:
            return list(self._devices)

    def unhealthy(self) -> dict[str, str]:
        """Why each unhealthy GPU is (lost, a critical XID), by UUID: the health the
        scheduler reads from the capacity pod (`gpupack.io/gpu-unhealthy`)."""
        with self._lock:
            return {
                device.uuid: _problem(
                    device, self._lost.get(device.uuid), self._last_xid.get(device.uuid)
                )
                for device in self._devices
                if device.uuid in self._lost or device.uuid in self._xid_unhealthy
            }

    def _gpu(self, device: Device, start: float) -> GpuReading:
        uuid = device.uuid
        lost = uuid in self._lost
        history = self._history.get(uuid, {})
        processes = (
            ()
            if lost
            else tuple(
                ProcessUsage(
                    pid=process.pid,
                    memory=process.memory,
                    compute=None if device.mig else _windowed(history.get(process.pid), start),
                    kind=process.kind,
                )
                for process in sorted(self._processes.get(uuid, {}).values(), key=_pid)
            )
        )
        return GpuReading(
            device=device,
            status=None if lost else self._status.get(uuid),
            healthy=not lost and uuid not in self._xid_unhealthy,
            xid_errors=self._xid_count.get(uuid, 0),
            last_xid=self._last_xid.get(uuid),
            processes=processes,
        )


def _problem(device: Device, lost: str | None, xid: int | None) -> str:
    detail = f"critical XID {xid}" if lost is None else lost
    return detail if device.uuid in detail else f"{device.uuid} (index {device.index}): {detail}"


def _extend(
    history: dict[int, deque[tuple[float, float]]],
    present: Iterable[int],
    sm: Mapping[int, float],
    now: float,
    oldest: float,
) -> dict[int, deque[tuple[float, float]]]:
    """The history of the PIDs present now, with this tick's value appended where it has
    one and old ticks cut; a PID left with no ticks has none."""
    kept: dict[int, deque[tuple[float, float]]] = {}
    for pid in present:
        ticks = history.get(pid) or deque()
        if pid in sm:
            ticks.append((now, sm[pid]))
        while ticks and ticks[0][0] < oldest:
            ticks.popleft()
        if ticks:
            kept[pid] = ticks
    return kept


def _windowed(ticks: deque[tuple[float, float]] | None, start: float) -> float | None:
    """Mean of the tick values after `start`; the latest one if the sampler fell behind.
    Ticks are in time order, so only the window's tail is read."""
    if not ticks:
        return None
    total, count = 0.0, 0
    for at, value in reversed(ticks):
        if at <= start:
            break
        total += value
        count += 1
    return total / count if count else ticks[-1][1]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _pid(process: ProcessMemory) -> int:
    return process.pid
