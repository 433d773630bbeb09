"""A fake NVML below the exporter's `Reader` interface, with the shapes a real node gives.

GPUs look like the real thing: NVML-style UUIDs (`GPU-1f0c...-...`), product names and
memory totals in bytes of an H100 80GB HBM3 or an A100-SXM4-80GB, host PIDs, process
memory in bytes, and utilization samples with microsecond CPU timestamps that advance by
`period_us` on every `utilization` call (honouring `since_us` as NVML does). The status
of a GPU follows its processes unless a test pins it with `set_status`.

Scripting, all by GPU UUID:

    fake = FakeReader.typical(gpus=8, processes_per_gpu=8, mig=(7,))
    gpu = fake.uuids[0]
    fake.set_process(gpu, 4242, memory=3 * GiB, sm=0.5)     # busy: one 50 % sample per call
    fake.set_process(gpu, 4243, memory=GiB, sm=[0.2, 0.4])  # two samples per call
    fake.set_process(gpu, 4244, memory=GiB, sm=None)        # idle: no samples (NOT_FOUND)
    fake.remove_process(gpu, 4242)
    fake.lose(gpu)                  # DeviceLost from every per-device call ...
    fake.recover(gpu)               # ... until the next open() after this
    fake.fail_open("NVML Shared Library Not Found")  # open() raises NvmlUnavailable
    fake.go_down("Driver Not Loaded")               # open() and every call raise it
    fake.restore()                  # NVML works again
    fake.add_xid(gpu, 79)           # returned once by the next xids()

It records what it was asked (`opens`, `closes`, `is_open`, `utilization_calls`) and is
thread-safe, so a sampler thread can run against it while a test scripts it.
"""

import threading
import uuid as uuidlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Self

from exporter.readings import (
    Device,
    DeviceLost,
    DeviceStatus,
    NvmlUnavailable,
    ProcessKind,
    ProcessMemory,
    ProcessSample,
    Xid,
)

GiB: Final = 1 << 30
MiB: Final = 1 << 20
H100: Final = ("NVIDIA H100 80GB HBM3", 81_559 * MiB)
A100: Final = ("NVIDIA A100-SXM4-80GB", 81_920 * MiB)
L4: Final = ("NVIDIA L4", 23_034 * MiB)
EPOCH_US: Final = 1_700_000_000_000_000  # NVML timestamps are CPU time in microseconds
CONTEXT_OVERHEAD: Final = 512 * MiB  # what the driver holds on a GPU beyond processes


def fake_uuid(index: int) -> str:
    """A stable, NVML-shaped GPU UUID for device `index`."""
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'gpupack-fake-gpu/{index}')}"


@dataclass
class _Gpu:
    device: Device
    processes: dict[int, ProcessMemory] = field(default_factory=dict)
    sm: dict[int, tuple[float, ...]] = field(default_factory=dict)  # () = idle
    status: DeviceStatus | None = None  # None: follow the processes
    lost: str | None = None
    unlisted: bool = False  # a lost GPU that open() does not list
    recover_on_open: bool = False
    now_us: int = EPOCH_US


class FakeReader:
    """`Reader` over scripted GPUs. Per-device calls need `open()` first, as with NVML."""

    def __init__(self, devices: Iterable[Device], *, period_us: int = 1_000_000) -> None:
        self._lock = threading.RLock()
        self._gpus = {device.uuid: _Gpu(device) for device in devices}
        self._period_us = period_us
        self._open_error: str | None = None
        self._down: str | None = None
        self._xids: list[Xid] = []
        self.is_open = False
        self.opens = 0  # open() calls, failed ones included
        self.closes = 0
        self.utilization_calls: list[tuple[str, int]] = []  # (uuid, since_us)

    @classmethod
    def typical(
        cls,
        gpus: int = 8,
        processes_per_gpu: int = 8,
        *,
        model: tuple[str, int] = H100,
        mig: Iterable[int] = (),
        first_pid: int = 41_000,
    ) -> Self:
        """`gpus` GPUs of `model`, each with `processes_per_gpu` compute processes of 1 to
        8 GiB and 0 to 90 % SM (a tenth of them idle); GPU indices in `mig` in MIG mode.
        PIDs are `first_pid + gpu * processes_per_gpu + n`."""
        name, total = model
        in_mig = set(mig)
        fake = cls(Device(i, fake_uuid(i), name, total, mig=i in in_mig) for i in range(gpus))
        for gpu in range(gpus):
            for n in range(processes_per_gpu):
                pid = first_pid + gpu * processes_per_gpu + n
                sm = None if n % 10 == 9 else (n % 10) / 10
                fake.set_process(fake_uuid(gpu), pid, memory=(1 + n % 8) * GiB, sm=sm)
        return fake

    # -- scripting -----------------------------------------------------------------------

    @property
    def uuids(self) -> list[str]:
        with self._lock:
            return list(self._gpus)

    def device(self, uuid: str) -> Device:
        with self._lock:
            return self._gpus[uuid].device

    def set_process(
        self,
        uuid: str,
        pid: int,
        *,
        memory: int | None = GiB,
        sm: float | Sequence[float] | None = 0.0,
        kind: ProcessKind = ProcessKind.COMPUTE,
    ) -> None:
        """Add or change a process. `sm`: a ratio (one sample per `utilization` call), a
        sequence of ratios (that many samples per call) or None (idle: no samples)."""
        samples = () if sm is None else (sm,) if isinstance(sm, float | int) else tuple(sm)
        with self._lock:
            gpu = self._gpus[uuid]
            gpu.processes[pid] = ProcessMemory(pid, memory, kind)
            gpu.sm[pid] = tuple(float(value) for value in samples)

    def remove_process(self, uuid: str, pid: int) -> None:
        with self._lock:
            self._gpus[uuid].processes.pop(pid, None)
            self._gpus[uuid].sm.pop(pid, None)

    def set_status(self, uuid: str, status: DeviceStatus | None) -> None:
        """Pin what `status` answers; None goes back to following the processes."""
        with self._lock:
            self._gpus[uuid].status = status

    def lose(self, uuid: str, message: str = "GPU is lost", *, unlisted: bool = False) -> None:
        """The GPU falls off the bus; with `unlisted`, open() stops listing it too."""
        with self._lock:
            gpu = self._gpus[uuid]
            gpu.lost, gpu.unlisted, gpu.recover_on_open = message, unlisted, False

    def recover(self, uuid: str) -> None:
        """The GPU is back (reset), but, as with NVML, only for the next open()."""
        with self._lock:
            self._gpus[uuid].recover_on_open = True

    def fail_open(self, message: str = "NVML Shared Library Not Found") -> None:
        with self._lock:
            self._open_error = message

    def go_down(self, message: str = "Driver Not Loaded") -> None:
        with self._lock:
            self._down = message

    def restore(self) -> None:
        with self._lock:
            self._open_error = self._down = None

    def add_xid(self, uuid: str, code: int) -> None:
        with self._lock:
            self._xids.append(Xid(uuid, code))

    # -- Reader --------------------------------------------------------------------------

    def open(self) -> list[Device]:
        with self._lock:
            self.opens += 1
            error = self._down or self._open_error
            if error is not None:
                raise NvmlUnavailable(f"NVML failed to initialise: {error}")
            self.is_open = True
            for gpu in self._gpus.values():
                if gpu.recover_on_open:
                    gpu.lost, gpu.unlisted, gpu.recover_on_open = None, False, False
            return [gpu.device for gpu in self._gpus.values() if not gpu.unlisted]

    def status(self, device: Device) -> DeviceStatus:
        with self._lock:
            gpu = self._answering(device)
            if gpu.status is not None:
                return gpu.status
            busy = min(1.0, sum(_mean(samples) for samples in gpu.sm.values()))
            used = sum(process.memory or 0 for process in gpu.processes.values())
            return DeviceStatus(
                utilization=None if device.mig else round(busy, 2),
                memory_used=min(device.memory_total, used + CONTEXT_OVERHEAD),
                temperature=float(32 + round(40 * busy)),
                power=round(68.0 + 600.0 * busy, 3),
            )

    def processes(self, device: Device) -> list[ProcessMemory]:
        with self._lock:
            return sorted(self._answering(device).processes.values(), key=lambda p: p.pid)

    def utilization(self, device: Device, since_us: int) -> list[ProcessSample]:
        with self._lock:
            gpu = self._answering(device)
            self.utilization_calls.append((device.uuid, since_us))
            start, gpu.now_us = gpu.now_us, gpu.now_us + self._period_us
            if device.mig:
                return []
            found: list[ProcessSample] = []
            for pid, samples in gpu.sm.items():
                for n, sm in enumerate(samples):
                    at = start + (n + 1) * self._period_us // len(samples)
                    if at > since_us:  # NVML percent is an integer
                        found.append(ProcessSample(pid, at, round(sm * 100) / 100))
            return sorted(found, key=lambda sample: sample.timestamp_us)

    def xids(self) -> list[Xid]:
        with self._lock:
            self._check_up()
            found, self._xids = self._xids, []
            return found

    def close(self) -> None:
        with self._lock:
            self.closes += 1
            self.is_open = False

    def _check_up(self) -> None:
        if self._down is not None:
            raise NvmlUnavailable(f"NVML: {self._down}")
        if not self.is_open:
            raise NvmlUnavailable("NVML: Uninitialized")

    def _answering(self, device: Device) -> _Gpu:
        self._check_up()
        gpu = self._gpus[device.uuid]
        if gpu.lost is not None:
            raise DeviceLost(f"{device.uuid} (index {device.index}): {gpu.lost}")
        return gpu


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
