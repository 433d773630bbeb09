"""The `Reader` over NVML (nvidia-ml-py, imported as `pynvml`): the only code touching NVML.

It turns pynvml's ctypes structs and `NVMLError` codes into the plain values and the two
exceptions of `exporter.readings`, and absorbs NVML's quirks so nothing above has to:

- a value this GPU does not support (`NOT_SUPPORTED`: power on some boards, utilization
  under MIG) is None, per field; "no samples" (`NOT_FOUND`) is idle, an empty list;
- per-process utilization prefers `nvmlDeviceGetProcessesUtilizationInfo` and falls back
  to `nvmlDeviceGetProcessUtilization` where the driver or pynvml lacks it, once per GPU;
- in MIG mode processes are listed per MIG device (the parent handle may refuse), and
  per-process SM utilization does not exist, so `utilization` answers [] without asking;
- MPS clients are listed too (`ProcessKind.MPS_CLIENT`): who is charged for the MPS
  server is decided by PID attribution, not here;
- `GPU_IS_LOST`, `RESET_REQUIRED` and other unexpected errors of one GPU raise
  `DeviceLost`; NVML itself going away (uninitialised, driver unloaded, library and
  kernel module out of step) raises `NvmlUnavailable`.

pynvml is imported in the constructor, so importing this module needs no driver; tests
pass an in-memory module with pynvml's names instead.
"""

import contextlib
import ctypes
import types
from collections.abc import Callable, Iterable
from typing import Any, Final

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

_VALUE_NOT_AVAILABLE: Final = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong
_MAX_EVENTS_PER_DRAIN: Final = 4096
_PROCESS_LISTS: Final = (  # in order of precedence when one PID is in several
    ("nvmlDeviceGetMPSComputeRunningProcesses", ProcessKind.MPS_CLIENT),
    ("nvmlDeviceGetComputeRunningProcesses", ProcessKind.COMPUTE),
    ("nvmlDeviceGetGraphicsRunningProcesses", ProcessKind.GRAPHICS),
)
_INIT_HINTS: Final = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 is not on this node or not mounted",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded",
    "NVML_ERROR_NO_PERMISSION": "no permission to open /dev/nvidia*",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "libnvidia-ml and the kernel driver differ",
}


class _NeverRaisedError(Exception):
    """Stands in for pynvml exception classes an older pynvml does not have."""


class PynvmlReader:
    """`Reader` over pynvml. Not thread-safe: one sampler thread owns it."""

    def __init__(self, nvml: types.ModuleType | None = None) -> None:
        if nvml is None:
            import pynvml  # noqa: PLC0415 - lazily: importing the exporter needs no driver

            nvml = pynvml
        self._nvml: Any = nvml
        n = self._nvml
        self._unavailable = _codes(
            n,
            "UNINITIALIZED",
            "DRIVER_NOT_LOADED",
            "LIB_RM_VERSION_MISMATCH",
            "LIBRARY_NOT_FOUND",
        )
        self._unknown_field = _codes(n, "NOT_SUPPORTED", "NO_PERMISSION", "NO_DATA", "NOT_READY")
        self._absent = _codes(n, "NOT_SUPPORTED", "NOT_FOUND", "FUNCTION_NOT_FOUND")
        self._idle = _codes(n, "NOT_FOUND") | {0}  # 0: SUCCESS with no samples
        self._no_new_util = _codes(
            n, "NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH"
        )
        self._mismatch: type[Exception] = getattr(n, "NVMLLibraryMismatchError", _NeverRaisedError)
        self._open = False
        self._handles: dict[str, Any] = {}
        self._by_address: dict[object, str] = {}
        self._events: Any = None
        self._old_util: set[str] = set()  # GPUs where only the older utilization call works

    def open(self) -> list[Device]:
        n = self._nvml
        self.close()
        try:
            n.nvmlInit()
        except n.NVMLError as err:
            raise NvmlUnavailable(self._init_message(err)) from err
        self._open = True
        try:
            count = int(n.nvmlDeviceGetCount())
            devices = list(self._enumerate(count))
            self._register_xid_events()
        except n.NVMLError as err:
            self.close()
            raise NvmlUnavailable(f"NVML: listing GPUs failed: {err}") from err
        return devices

    def status(self, device: Device) -> DeviceStatus:
        n, handle = self._nvml, self._handle(device)
        unknown = self._unknown_field
        rates = self._call(device, n.nvmlDeviceGetUtilizationRates, handle, none_on=unknown)
        memory = self._call(device, n.nvmlDeviceGetMemoryInfo, handle, none_on=unknown)
        temperature = self._call(
            device, n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU, none_on=unknown
        )
        power_mw = self._call(device, n.nvmlDeviceGetPowerUsage, handle, none_on=unknown)
        return DeviceStatus(
            utilization=None if rates is None else int(rates.gpu) / 100,
            memory_used=None if memory is None else int(memory.used),
            temperature=None if temperature is None else float(temperature),
            power=None if power_mw is None else int(power_mw) / 1000,
        )

    def processes(self, device: Device) -> list[ProcessMemory]:
        handle = self._handle(device)
        handles = list(self._mig_handles(device, handle)) if device.mig else [handle]
        merged: dict[int, ProcessMemory] = {}
        for each in handles:  # a PID on two MIG devices holds memory on both: add it up
            for process in self._processes_of(device, each):
                seen = merged.get(process.pid)
                merged[process.pid] = (
                    process
                    if seen is None
                    else ProcessMemory(process.pid, _add(seen.memory, process.memory), seen.kind)
                )
        return sorted(merged.values(), key=lambda process: process.pid)

    def utilization(self, device: Device, since_us: int) -> list[ProcessSample]:
        if device.mig:  # NVML has no per-process SM utilization under MIG
            return []
        n, handle = self._nvml, self._handle(device)
        newer = getattr(n, "nvmlDeviceGetProcessesUtilizationInfo", None)
        if newer is not None and device.uuid not in self._old_util:
            try:
                return _samples(newer(handle, since_us), since_us)
            except n.NVMLError as err:
                if err.value in self._idle:
                    return []
                if err.value not in self._no_new_util:
                    raise self._translate(err, device) from err
            self._old_util.add(device.uuid)
        raw = self._call(
            device, n.nvmlDeviceGetProcessUtilization, handle, since_us, none_on=self._idle
        )
        return [] if raw is None else _samples(raw, since_us)

    def xids(self) -> list[Xid]:
        n = self._nvml
        if not self._open or self._events is None:
            return []
        found: list[Xid] = []
        for _ in range(_MAX_EVENTS_PER_DRAIN):
            try:
                event = n.nvmlEventSetWait(self._events, 0)
            except n.NVMLError as err:
                if err.value in self._unavailable:
                    raise NvmlUnavailable(f"NVML: reading XID events failed: {err}") from err
                break  # TIMEOUT: drained; anything else: try again next time
            if int(event.eventType) & int(n.nvmlEventTypeXidCriticalError):
                found.append(Xid(self._uuid_of(event.device), int(event.eventData)))
        return found

    def close(self) -> None:
        if not self._open:
            return
        n = self._nvml
        self._open = False
        if self._events is not None:
            with contextlib.suppress(Exception):
                n.nvmlEventSetFree(self._events)
        with contextlib.suppress(Exception):
            n.nvmlShutdown()
        self._events = None
        self._handles.clear()
        self._by_address.clear()
        self._old_util.clear()

    # -- helpers -------------------------------------------------------------------------

    def _enumerate(self, count: int) -> Iterable[Device]:
        n = self._nvml
        for index in range(count):
            try:
                handle = n.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(n.nvmlDeviceGetUUID(handle))
                name = _text(n.nvmlDeviceGetName(handle))
                total = int(n.nvmlDeviceGetMemoryInfo(handle).total)
                mode = self._call(None, n.nvmlDeviceGetMigMode, handle, none_on=self._absent)
            except n.NVMLError as err:
                if err.value in self._unavailable:
                    raise
                continue  # a GPU too broken to list: the sampler still knows its UUID
            mig = mode is not None and int(mode[0]) == int(n.NVML_DEVICE_MIG_ENABLE)
            self._handles[uuid] = handle
            self._by_address[_address(handle)] = uuid
            yield Device(index=index, uuid=uuid, name=name, memory_total=total, mig=mig)

    def _register_xid_events(self) -> None:
        n = self._nvml
        try:
            self._events = n.nvmlEventSetCreate()
        except n.NVMLError as err:
            if err.value in self._unavailable:
                raise
            return  # no XID events on this node; everything else still works
        for handle in self._handles.values():
            try:
                n.nvmlDeviceRegisterEvents(handle, n.nvmlEventTypeXidCriticalError, self._events)
            except n.NVMLError as err:
                if err.value in self._unavailable:
                    raise
                # NOT_SUPPORTED (and the like): this GPU reports no XID events

    def _handle(self, device: Device) -> Any:
        if not self._open:
            raise NvmlUnavailable("NVML is not initialised")
        handle = self._handles.get(device.uuid)
        if handle is None:
            raise DeviceLost(f"{device.uuid}: not listed by NVML since it was last opened")
        return handle

    def _call(
        self, device: Device | None, fn: Callable[..., Any], *args: Any, none_on: set[int]
    ) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            if err.value in none_on:
                return None
            if device is None:
                raise
            raise self._translate(err, device) from err

    def _translate(self, err: Exception, device: Device) -> Exception:
        if getattr(err, "value", None) in self._unavailable:
            return NvmlUnavailable(f"NVML: {err}")
        return DeviceLost(f"{device.uuid} (index {device.index}): {err}")

    def _processes_of(self, device: Device, handle: Any) -> list[ProcessMemory]:
        found: dict[int, ProcessMemory] = {}
        for name, kind in _PROCESS_LISTS:
            for raw in self._list(device, handle, name):
                pid, memory = int(raw.pid), _memory(raw.usedGpuMemory)
                seen = found.get(pid)
                if seen is None:
                    found[pid] = ProcessMemory(pid, memory, kind)
                elif memory is not None and (seen.memory is None or memory > seen.memory):
                    found[pid] = ProcessMemory(pid, memory, seen.kind)
        return list(found.values())

    def _list(self, device: Device, handle: Any, name: str) -> list[Any]:
        fn = getattr(self._nvml, name, None)
        if fn is None:
            return []
        try:
            listed = self._call(device, fn, handle, none_on=self._absent)
        except self._mismatch:  # an old driver without the _v3 symbol
            older = getattr(self._nvml, f"{name}_v2", None)
            listed = (
                None if older is None else self._call(device, older, handle, none_on=self._absent)
            )
        return [] if listed is None else list(listed)

    def _mig_handles(self, device: Device, handle: Any) -> Iterable[Any]:
        n = self._nvml
        slots = self._call(device, n.nvmlDeviceGetMaxMigDeviceCount, handle, none_on=self._absent)
        for index in range(int(slots or 0)):
            mig = self._call(
                device, n.nvmlDeviceGetMigDeviceHandleByIndex, handle, index, none_on=self._absent
            )
            if mig is not None:  # NOT_FOUND: an empty slot
                yield mig

    def _uuid_of(self, handle: Any) -> str:
        known = self._by_address.get(_address(handle))
        if known is not None:
            return known
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(handle))
        except self._nvml.NVMLError:
            return "unknown"

    def _init_message(self, err: Exception) -> str:
        code = getattr(err, "value", None)
        hint = next(
            (text for name, text in _INIT_HINTS.items() if getattr(self._nvml, name, -1) == code),
            None,
        )
        return f"NVML failed to initialise: {err}" + (f" ({hint})" if hint else "")


def _codes(nvml: Any, *names: str) -> set[int]:
    return {
        int(getattr(nvml, f"NVML_ERROR_{name}"))
        for name in names
        if hasattr(nvml, f"NVML_ERROR_{name}")
    }


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _memory(value: int | None) -> int | None:
    return None if value is None or int(value) == _VALUE_NOT_AVAILABLE else int(value)


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


def _samples(raw: Iterable[Any], since_us: int) -> list[ProcessSample]:
    return [
        ProcessSample(int(s.pid), int(s.timeStamp), min(max(int(s.smUtil) / 100, 0.0), 1.0))
        for s in raw
        if int(s.timeStamp) > since_us
    ]


def _address(handle: Any) -> object:
    """A hashable identity for a device handle: NVML returns a fresh ctypes pointer object
    for the same device in an event, so compare the address, not the Python object."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle
