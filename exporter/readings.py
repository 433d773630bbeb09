"""What the exporter reads from a node, as values, and the reader interface below them.

`Reader` is the only door to NVML (its one implementation is `exporter.nvml`; tests put
a fake behind it). It answers in plain values: the devices, each device's status, the
processes holding memory on it, and per-process SM utilization samples. The sampler
turns those into `Readings` (averaged over a scrape window); the collector turns
`Readings` and the pod map into metric families.

Units are base units throughout: bytes, ratios in 0..1, degrees Celsius, watts,
seconds. A value NVML cannot give (not supported on this GPU, MIG) is None, never 0:
"unknown" and "idle" are different answers.
"""

import enum
from dataclasses import dataclass
from typing import Protocol


class NvmlUnavailable(Exception):
    """NVML could not start: no driver, no library, no permission, or it went away."""


class DeviceLost(Exception):
    """A GPU stopped answering (fell off the bus, NVML_ERROR_GPU_IS_LOST)."""


class ProcessKind(enum.StrEnum):
    COMPUTE = "compute"
    GRAPHICS = "graphics"
    MPS_CLIENT = "mps-client"  # a client of a CUDA MPS server, listed by NVML separately


@dataclass(frozen=True, slots=True)
class Device:
    """A GPU (or, under MIG, a whole GPU in MIG mode), fixed for the reader's session."""

    index: int
    uuid: str
    name: str
    memory_total: int  # bytes
    mig: bool = False  # MIG mode on: per-process SM utilization is not available


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    utilization: float | None  # ratio of time a kernel ran over NVML's last period
    memory_used: int | None  # bytes
    temperature: float | None  # degrees Celsius
    power: float | None  # watts


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """A process with a context on a device, and the device memory it uses."""

    pid: int  # host PID (the exporter runs with hostPID)
    memory: int | None  # bytes; None when NVML does not say (NVML_VALUE_NOT_AVAILABLE)
    kind: ProcessKind = ProcessKind.COMPUTE


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One NVML per-process utilization sample."""

    pid: int
    timestamp_us: int  # NVML's CPU timestamp of the sample, microseconds
    sm: float  # ratio of SM time this process used over the sample period


@dataclass(frozen=True, slots=True)
class Xid:
    """An XID error NVML reported for a device (a driver-detected fault)."""

    uuid: str
    code: int


class Reader(Protocol):
    """NVML, reduced to what the exporter asks. Every method may raise NvmlUnavailable;
    the per-device ones raise DeviceLost when that GPU stopped answering."""

    def open(self) -> list[Device]:
        """Initialise NVML and list the devices."""
        ...

    def status(self, device: Device) -> DeviceStatus: ...

    def processes(self, device: Device) -> list[ProcessMemory]: ...

    def utilization(self, device: Device, since_us: int) -> list[ProcessSample]:
        """Per-process samples newer than `since_us` (0: whatever NVML still buffers).
        An empty list means idle (NVML answers NOT_FOUND when no process ran), or, on a
        device in MIG mode, that NVML has no per-process utilization: the sampler tells
        the two apart by `Device.mig`."""
        ...

    def xids(self) -> list[Xid]:
        """XID events since the last call, without blocking."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """A process's use of one GPU over the scrape window."""

    pid: int
    memory: int | None  # bytes, as last seen
    compute: float | None  # mean SM ratio over the window; None when NVML cannot attribute
    kind: ProcessKind = ProcessKind.COMPUTE


@dataclass(frozen=True, slots=True)
class GpuReading:
    device: Device
    status: DeviceStatus | None  # None when the device is lost
    healthy: bool
    xid_errors: int = 0  # XID events seen since the exporter started
    last_xid: int | None = None
    processes: tuple[ProcessUsage, ...] = ()


@dataclass(frozen=True, slots=True)
class Readings:
    """One scrape's view of the node's GPUs."""

    gpus: tuple[GpuReading, ...] = ()
    nvml_up: bool = False
    sample_age: float | None = None  # seconds since the last complete sample; None: never
    window: float = 0.0  # seconds the per-process compute is averaged over
