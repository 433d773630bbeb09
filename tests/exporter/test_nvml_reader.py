"""PynvmlReader against an in-memory `pynvml`: the real module's error class, constants
and ctypes structs, with GPUs scripted in Python. The fake's functions are checked
against the real pynvml's names and parameters, so it cannot drift from the library."""

# ruff: noqa: N802, N803 - the fake's functions and parameters carry pynvml's camelCase names

import ctypes
import inspect
import subprocess
import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pynvml
import pytest

from exporter.nvml import PynvmlReader
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

GiB, MiB = 1 << 30, 1 << 20
T = 1_700_000_000_000_000  # microseconds, as NVML's CPU timestamps
NOT_AVAILABLE = (1 << 64) - 1
UUID0 = "GPU-5a4c1f3e-8b2d-4e6f-9a1b-0c2d3e4f5a6b"
UUID1 = "GPU-0d6e2b71-3c4f-4a59-8e7d-1f2a3b4c5d6e"
Procs = list[tuple[int, int | None]]  # (pid, usedGpuMemory)


@dataclass
class Gpu:
    uuid: str | bytes = UUID0
    name: bytes = b"NVIDIA H100 80GB HBM3"
    total: int = 81_559 * MiB
    used: int = 3 * GiB
    util: int | None = 37  # percent; None: NOT_SUPPORTED
    temperature: int | None = 41
    power_mw: int | None = 250_500
    mig: int | None = 0  # current MIG mode; None: NOT_SUPPORTED
    compute: Procs = field(default_factory=list)
    graphics: Procs = field(default_factory=list)
    mps: Procs = field(default_factory=list)
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # pid, µs, smUtil %
    new_util_error: int | None = None  # what nvmlDeviceGetProcessesUtilizationInfo raises
    mig_devices: list["Gpu | None"] = field(default_factory=list)  # slots; None: empty
    events_error: int | None = None  # what registering XID events raises
    error: int | None = None  # every call on this GPU raises it


def _raise(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)


class FakeNvml(types.ModuleType):
    """pynvml over scripted GPUs. Each `nvml*` method mirrors the real function."""

    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError

    def __init__(
        self, gpus: Iterable[Gpu], *, init_error: int | None = None, without: Iterable[str] = ()
    ) -> None:
        super().__init__("pynvml")
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        for name in without:  # as an older pynvml that lacks the function
            setattr(self, name, None)
        self.gpus = list(gpus)
        self.init_error = init_error
        self.shutdown_error: int | None = None
        self.initialised = 0
        self.calls: list[str] = []
        self.events: list[tuple[int, int, int]] = []  # (handle address, type, data)
        self.registered: list[int] = []
        self.freed = 0
        self._by_address: dict[int, Gpu] = {}

    def _gpu(self, handle: Any, name: str) -> Gpu:
        self.calls.append(name)
        if not self.initialised:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu = self._by_address[ctypes.cast(handle, ctypes.c_void_p).value or 0]
        if gpu.error is not None:
            _raise(gpu.error)
        return gpu

    def _handle(self, gpu: Gpu, address: int) -> Any:
        self._by_address[address] = gpu
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlDevice_t)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            _raise(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        if self.shutdown_error is not None:
            _raise(self.shutdown_error)
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self._handle(self.gpus[index], 0x1000 * (index + 1))

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        return self._gpu(handle, "uuid").uuid

    def nvmlDeviceGetName(self, handle: Any) -> bytes:
        return self._gpu(handle, "name").name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu(handle, "memory")
        return pynvml.c_nvmlMemory_t(gpu.total, gpu.total - gpu.used, gpu.used)

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        mode = self._gpu(device, "mig-mode").mig
        if mode is None:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [mode, mode]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        util = self._gpu(handle, "utilization").util
        return _or_not_supported(util, lambda u: pynvml.c_nvmlUtilization_t(u, 10))

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return int(_or_not_supported(self._gpu(handle, "temperature").temperature, int))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(_or_not_supported(self._gpu(handle, "power").power_mw, int))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return _processes(self._gpu(handle, "compute").compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        return _processes(self._gpu(handle, "graphics").graphics)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return _processes(self._gpu(handle, "mps").mps)

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        return len(self._gpu(device, "mig-count").mig_devices)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._gpu(device, "mig-handle")
        mig = gpu.mig_devices[index]
        if mig is None:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)
        address = ctypes.cast(device, ctypes.c_void_p).value or 0
        return self._handle(mig, address + index + 1)

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, timeStamp: int) -> list[Any]:
        gpu = self._gpu(handle, "utilization-info")
        if gpu.new_util_error is not None:
            _raise(gpu.new_util_error)
        return _newer(
            gpu,
            timeStamp,
            lambda p, t, sm: pynvml.c_nvmlProcessUtilizationInfo_v1_t(t, p, sm, 0, 0, 0, 0, 0),
        )

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        gpu = self._gpu(handle, "process-utilization")
        return _newer(
            gpu,
            timeStamp,
            lambda p, t, sm: pynvml.c_nvmlProcessUtilizationSample_t(p, t, sm, 0, 0, 0),
        )

    def nvmlEventSetCreate(self) -> Any:
        return ctypes.c_void_p(0xE0E0)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu(handle, "register")
        assert eventTypes == pynvml.nvmlEventTypeXidCriticalError
        if gpu.events_error is not None:
            _raise(gpu.events_error)
        self.registered.append(self.gpus.index(gpu))

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        self.calls.append("wait")
        assert timeoutms == 0
        if not self.events:
            _raise(pynvml.NVML_ERROR_TIMEOUT)
        address, kind, data = self.events.pop(0)
        event = pynvml.c_nvmlEventData_t()
        event.device = ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlDevice_t)
        event.eventType, event.eventData = kind, data
        return event

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self.freed += 1


def _or_not_supported(value: int | None, make: Callable[[int], Any]) -> Any:
    if value is None:
        _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return make(value)


def _processes(listed: Procs) -> list[Any]:
    return [
        pynvml.nvmlFriendlyObject(
            {
                "pid": pid,
                "usedGpuMemory": memory,
                "gpuInstanceId": 0xFFFFFFFF,
                "computeInstanceId": 0xFFFFFFFF,
            }
        )
        for pid, memory in listed
    ]


def _newer(gpu: Gpu, since: int, make: Callable[[int, int, int], Any]) -> list[Any]:
    found = [make(pid, at, sm) for pid, at, sm in gpu.samples if at > since]
    if not found:
        _raise(pynvml.NVML_ERROR_NOT_FOUND)
    return found


def opened(*gpus: Gpu, **options: Any) -> tuple[PynvmlReader, FakeNvml, list[Device]]:
    nvml = FakeNvml(gpus or [Gpu()], **options)
    reader = PynvmlReader(nvml)
    return reader, nvml, reader.open()


# -- the fake is honest --------------------------------------------------------------------


def test_fake_pynvml_has_the_real_names_and_parameters() -> None:
    functions = {name: fn for name, fn in vars(FakeNvml).items() if name.startswith("nvml")}
    assert len(functions) == 22
    for name, fn in functions.items():
        assert hasattr(pynvml, name), name
        real = list(inspect.signature(getattr(pynvml, name)).parameters)
        assert list(inspect.signature(fn).parameters)[1:] == real, name


def test_importing_the_reader_needs_no_nvml() -> None:
    code = "import sys, exporter.nvml; print('pynvml' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_the_real_pynvml_without_a_gpu_is_unavailable_not_a_crash() -> None:
    reader = PynvmlReader()
    try:
        reader.open()  # on a GPU machine this simply works
    except NvmlUnavailable as err:
        assert str(err).startswith("NVML failed to initialise")
    finally:
        reader.close()


# -- open ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "message"),
    [
        pytest.param(
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "NVML failed to initialise: NVML Shared Library Not Found (libnvidia-ml.so.1 is not on this node or not mounted)",
            id="no-library",
        ),
        pytest.param(
            pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
            "NVML failed to initialise: Driver Not Loaded (the NVIDIA kernel driver is not loaded)",
            id="no-driver",
        ),
        pytest.param(
            pynvml.NVML_ERROR_NO_PERMISSION,
            "NVML failed to initialise: Insufficient Permissions (no permission to open /dev/nvidia*)",
            id="no-permission",
        ),
        pytest.param(
            pynvml.NVML_ERROR_UNKNOWN, "NVML failed to initialise: Unknown Error", id="unknown"
        ),
    ],
)
def test_nvml_that_fails_to_initialise_is_unavailable_with_the_reason(
    code: int, message: str
) -> None:
    reader = PynvmlReader(FakeNvml([Gpu()], init_error=code))
    with pytest.raises(NvmlUnavailable) as raised:
        reader.open()
    assert str(raised.value) == message


def test_open_lists_devices_with_text_uuids_and_names() -> None:
    _, _, devices = opened(
        Gpu(uuid=UUID0.encode()), Gpu(uuid=UUID1, name=b"NVIDIA A100-SXM4-80GB", total=80 * GiB)
    )
    assert devices == [
        Device(0, UUID0, "NVIDIA H100 80GB HBM3", 81_559 * MiB),
        Device(1, UUID1, "NVIDIA A100-SXM4-80GB", 80 * GiB),
    ]


@pytest.mark.parametrize(
    ("mode", "mig"),
    [
        pytest.param(pynvml.NVML_DEVICE_MIG_ENABLE, True, id="enabled"),
        pytest.param(pynvml.NVML_DEVICE_MIG_DISABLE, False, id="disabled"),
        pytest.param(None, False, id="not-supported-by-this-gpu"),
    ],
)
def test_open_reads_the_current_mig_mode(mode: int | None, mig: bool) -> None:
    _, _, (device,) = opened(Gpu(mig=mode))
    assert device.mig is mig


def test_open_skips_a_gpu_too_broken_to_list() -> None:
    _, _, devices = opened(Gpu(uuid=UUID0, error=pynvml.NVML_ERROR_GPU_IS_LOST), Gpu(uuid=UUID1))
    assert [(d.index, d.uuid) for d in devices] == [(1, UUID1)]


def test_gpu_that_cannot_report_xids_is_still_listed() -> None:
    _, nvml, devices = opened(
        Gpu(uuid=UUID0, events_error=pynvml.NVML_ERROR_NOT_SUPPORTED), Gpu(uuid=UUID1)
    )
    assert len(devices) == 2
    assert nvml.registered == [1]


# -- status and processes ------------------------------------------------------------------


def test_status_is_in_base_units() -> None:
    reader, _, (device,) = opened(Gpu())
    assert reader.status(device) == DeviceStatus(
        utilization=0.37, memory_used=3 * GiB, temperature=41.0, power=250.5
    )


@pytest.mark.parametrize(
    ("unsupported", "expected"),
    [
        pytest.param({"util": None}, DeviceStatus(None, 3 * GiB, 41.0, 250.5), id="utilization"),
        pytest.param(
            {"temperature": None}, DeviceStatus(0.37, 3 * GiB, None, 250.5), id="temperature"
        ),
        pytest.param({"power_mw": None}, DeviceStatus(0.37, 3 * GiB, 41.0, None), id="power"),
    ],
)
def test_status_field_not_supported_is_none(
    unsupported: dict[str, Any], expected: DeviceStatus
) -> None:
    reader, _, (device,) = opened(Gpu(**unsupported))
    assert reader.status(device) == expected


def test_processes_are_deduplicated_across_compute_graphics_and_mps_lists() -> None:
    gpu = Gpu(
        compute=[(10, 1 * GiB), (11, 2 * GiB)],
        graphics=[(11, 2 * GiB), (12, 512 * MiB)],
        mps=[(13, 3 * GiB), (10, 1 * GiB)],
    )
    reader, _, (device,) = opened(gpu)
    assert reader.processes(device) == [
        ProcessMemory(10, 1 * GiB, ProcessKind.MPS_CLIENT),
        ProcessMemory(11, 2 * GiB, ProcessKind.COMPUTE),
        ProcessMemory(12, 512 * MiB, ProcessKind.GRAPHICS),
        ProcessMemory(13, 3 * GiB, ProcessKind.MPS_CLIENT),
    ]


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(None, id="pynvml-converted-none"),
        pytest.param(NOT_AVAILABLE, id="raw-nvml-value-not-available"),
    ],
)
def test_process_memory_nvml_does_not_know_is_none(raw: int | None) -> None:
    reader, _, (device,) = opened(Gpu(compute=[(10, raw)], graphics=[(11, raw), (11, 4 * GiB)]))
    assert reader.processes(device) == [
        ProcessMemory(10, None),
        ProcessMemory(11, 4 * GiB, ProcessKind.GRAPHICS),
    ]


def test_mig_processes_come_from_the_mig_device_handles() -> None:
    gpu = Gpu(
        mig=pynvml.NVML_DEVICE_MIG_ENABLE,
        compute=[(99, GiB)],  # the parent handle is not asked
        mig_devices=[Gpu(compute=[(20, GiB)]), None, Gpu(compute=[(21, 2 * GiB), (20, GiB)])],
    )
    reader, nvml, (device,) = opened(gpu)
    assert reader.processes(device) == [ProcessMemory(20, 2 * GiB), ProcessMemory(21, 2 * GiB)]
    assert reader.utilization(device, 0) == []
    assert not {"utilization-info", "process-utilization"} & set(nvml.calls)


# -- utilization ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("without", "asked"),
    [
        pytest.param((), "utilization-info", id="newer-call"),
        pytest.param(
            ("nvmlDeviceGetProcessesUtilizationInfo",), "process-utilization", id="older-pynvml"
        ),
    ],
)
def test_utilization_samples_newer_than_since_as_ratios(
    without: tuple[str, ...], asked: str
) -> None:
    gpu = Gpu(samples=[(10, T - 5, 30), (10, T + 1, 50), (11, T + 2, 100)])
    reader, nvml, (device,) = opened(gpu, without=without)
    assert reader.utilization(device, T) == [
        ProcessSample(10, T + 1, 0.5),
        ProcessSample(11, T + 2, 1.0),
    ]
    assert asked in nvml.calls


@pytest.mark.parametrize(
    "without",
    [
        pytest.param((), id="newer-call"),
        pytest.param(("nvmlDeviceGetProcessesUtilizationInfo",), id="older-call"),
    ],
)
def test_no_samples_means_idle(without: tuple[str, ...]) -> None:
    reader, _, (device,) = opened(Gpu(samples=[(10, T, 40)]), without=without)
    assert reader.utilization(device, T) == []


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(pynvml.NVML_ERROR_NOT_SUPPORTED, id="not-supported"),
        pytest.param(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, id="driver-lacks-the-function"),
    ],
)
def test_utilization_falls_back_to_the_older_call_once_per_gpu(error: int) -> None:
    old = Gpu(uuid=UUID0, samples=[(10, T + 1, 20)], new_util_error=error)
    new = Gpu(uuid=UUID1, samples=[(11, T + 1, 70)])
    reader, nvml, devices = opened(old, new)
    for _ in range(3):
        assert [reader.utilization(d, T) for d in devices] == [
            [ProcessSample(10, T + 1, 0.2)],
            [ProcessSample(11, T + 1, 0.7)],
        ]
    assert nvml.calls.count("utilization-info") == 4  # once for the old GPU, 3x the new
    assert nvml.calls.count("process-utilization") == 3


# -- errors --------------------------------------------------------------------------------

CALLS: dict[str, Callable[[PynvmlReader, Device], object]] = {
    "status": PynvmlReader.status,
    "processes": PynvmlReader.processes,
    "utilization": lambda reader, device: reader.utilization(device, 0),
}


@pytest.mark.parametrize("call", [pytest.param(name, id=name) for name in CALLS])
@pytest.mark.parametrize(
    "code",
    [
        pytest.param(pynvml.NVML_ERROR_GPU_IS_LOST, id="gpu-is-lost"),
        pytest.param(pynvml.NVML_ERROR_RESET_REQUIRED, id="reset-required"),
        pytest.param(pynvml.NVML_ERROR_UNKNOWN, id="unknown-error"),
    ],
)
def test_gpu_that_stops_answering_raises_device_lost(call: str, code: int) -> None:
    gpu = Gpu(uuid=UUID1, samples=[(10, T, 10)])
    reader, _, (device,) = opened(gpu)
    gpu.error = code
    with pytest.raises(DeviceLost, match=UUID1):
        CALLS[call](reader, device)


@pytest.mark.parametrize("call", [pytest.param(name, id=name) for name in CALLS])
@pytest.mark.parametrize(
    "code",
    [
        pytest.param(pynvml.NVML_ERROR_UNINITIALIZED, id="uninitialized"),
        pytest.param(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, id="driver-not-loaded"),
        pytest.param(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, id="library-and-driver-differ"),
    ],
)
def test_nvml_going_away_raises_nvml_unavailable(call: str, code: int) -> None:
    gpu = Gpu(samples=[(10, T, 10)])
    reader, _, (device,) = opened(gpu)
    gpu.error = code
    with pytest.raises(NvmlUnavailable):
        CALLS[call](reader, device)


def test_calls_before_open_or_after_close_are_unavailable() -> None:
    reader, _, (device,) = opened(Gpu())
    reader.close()
    with pytest.raises(NvmlUnavailable, match="not initialised"):
        reader.status(device)


# -- XIDs and closing ----------------------------------------------------------------------


def test_xids_are_drained_until_timeout_even_from_a_lost_gpu() -> None:
    reader, nvml, _ = opened(Gpu(uuid=UUID0.encode()), Gpu(uuid=UUID1))
    nvml.gpus[0].error = pynvml.NVML_ERROR_GPU_IS_LOST
    nvml.events = [
        (0x1000, pynvml.nvmlEventTypeXidCriticalError, 79),
        (0x2000, pynvml.nvmlEventTypeSingleBitEccError, 0),
        (0x2000, pynvml.nvmlEventTypeXidCriticalError, 13),
    ]
    assert reader.xids() == [Xid(UUID0, 79), Xid(UUID1, 13)]
    assert nvml.calls.count("wait") == 4
    assert reader.xids() == []


def test_close_frees_the_events_shuts_down_and_never_raises() -> None:
    reader, nvml, _ = opened(Gpu())
    nvml.shutdown_error = pynvml.NVML_ERROR_UNINITIALIZED
    reader.close()
    reader.close()
    assert nvml.freed == 1
    nvml.shutdown_error = None
    nvml.initialised = 0
    assert len(reader.open()) == 1
    reader.close()
    assert nvml.initialised == 0
