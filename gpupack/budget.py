"""The memory shim's budget file, read: who is there and what each holds, per GPU.

A memory-enforced pod's directory holds one `budget` (cuda-shim/budget.c writes it; its
layout is the shim's and this module's contract). Each process the shim is loaded into
claims a slot for its life and writes there its PID (in its own PID namespace), its start
time (clock ticks after boot, the 22nd field of /proc/<pid>/stat, which reads the same
from the host), the GPUs it has a context or memory on, and the bytes it holds on each.
The node agent matches slots with NVML's GPU processes to find processes that run
without the shim, reading nothing of any process but /proc/<pid>/stat and status.

Pure and standard library only: bytes in, a `Budget` out; `BudgetError` for a file that
is not a budget of this layout.

The roster: the node agent's CSI driver (which writes the pods' directories) answers on a
Unix socket which processes each pod's budget records, so the exporter beside it learns
that without reading the kubelet's pod directories or any process's memory. A request is
one line, a pod's UID; the answer one JSON line, `{"processes": [[pid, start_time], ...]}`
(none: the pod has no budget), or `{"error": "..."}`.
"""

import json
import re
import struct
from dataclasses import dataclass
from typing import Final

MAGIC: Final = b"GPUPACK2"
HEADER_BYTES: Final = 4096
SLOTS: Final = 1024
SLOT_BYTES: Final = 64
DEVICES: Final = 16
DEVICE_TABLE: Final = 64  # offset of the device table in the header: 16 x 32 bytes
USED_OFFSET: Final = HEADER_BYTES + SLOTS * SLOT_BYTES
BYTES: Final = USED_OFFSET + DEVICES * SLOTS * 8

_DEVICE = struct.Struct("<I16s12x")
_SLOT = struct.Struct("<IiQIIQQ24x")
_DEVICE_SET: Final = 2


class BudgetError(ValueError):
    """Not a budget of this layout (another version of the shim made it, or not a budget)."""


@dataclass(frozen=True, slots=True)
class Slot:
    """A process of the pod, as the shim recorded it."""

    index: int
    pid: int  # in the process's own PID namespace
    start_time: int  # clock ticks after boot
    gpus: frozenset[str]  # the UUIDs it has a context or memory on
    refused: int
    peak: int
    held: dict[str, int]  # bytes by GPU UUID


@dataclass(frozen=True, slots=True)
class Budget:
    gpus: tuple[str, ...]  # the device table: GPU UUIDs by index
    slots: tuple[Slot, ...]  # slots marked live (a dead process's stays until reclaimed)

    def held(self, gpu: str) -> int:
        """Bytes every recorded process holds on `gpu`."""
        return sum(slot.held.get(gpu, 0) for slot in self.slots)


# A pod's UID as the kubelet names its directory: nothing else reaches a path.
POD_UID = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$|^[0-9a-f]{32}$"
)


def roster_answer(budget: Budget | None) -> bytes:
    """The roster's answer for a pod: the processes its budget records (none: no budget)."""
    processes = [[slot.pid, slot.start_time] for slot in budget.slots] if budget else []
    return json.dumps({"processes": processes}).encode() + b"\n"


def roster_error(message: str) -> bytes:
    return json.dumps({"error": message}).encode() + b"\n"


def read_roster(line: bytes) -> frozenset[tuple[int, int]]:
    """The (pid, start time) pairs of a roster answer. Raises BudgetError for an error
    answer or one that does not parse."""
    try:
        answer = json.loads(line)
    except ValueError as error:
        raise BudgetError(f"the roster's answer does not parse: {error}") from None
    if not isinstance(answer, dict):
        raise BudgetError("the roster's answer is not an object")
    if "error" in answer:
        raise BudgetError(str(answer["error"]))
    processes = answer.get("processes")
    if not isinstance(processes, list):
        raise BudgetError("the roster's answer has no list of processes")
    try:
        return frozenset((int(pid), int(start)) for pid, start in processes)
    except (TypeError, ValueError):
        raise BudgetError("the roster's processes are not [pid, start time] pairs") from None


def uuid_text(raw: bytes) -> str:
    """NVML's spelling of a 16-byte UUID: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def read_budget(data: bytes) -> Budget:
    """The budget `data` holds. Raises BudgetError for another layout or a short file."""
    if len(data) < BYTES:
        raise BudgetError(f"a budget is {BYTES} bytes, this is {len(data)}")
    if data[:8] == bytes(8):
        return Budget(gpus=(), slots=())  # made by the node agent, not used yet
    if data[:8] != MAGIC:
        raise BudgetError(f"not a {MAGIC.decode()} budget (it starts {data[:8]!r})")
    gpus: list[str] = []
    for i in range(DEVICES):
        state, raw = _DEVICE.unpack_from(data, DEVICE_TABLE + i * _DEVICE.size)
        gpus.append(uuid_text(raw) if state == _DEVICE_SET else "")
    slots = []
    for i in range(SLOTS):
        live, pid, start, devices, refused, peak, _held = _SLOT.unpack_from(
            data, HEADER_BYTES + i * SLOT_BYTES
        )
        if not live:
            continue
        held = {}
        for d, gpu in enumerate(gpus):
            (used,) = struct.unpack_from("<Q", data, USED_OFFSET + (d * SLOTS + i) * 8)
            if gpu and used:
                held[gpu] = used
        on = frozenset(gpu for d, gpu in enumerate(gpus) if gpu and devices & (1 << d))
        slots.append(Slot(i, pid, start, on, refused, peak, held))
    return Budget(gpus=tuple(g for g in gpus if g), slots=tuple(slots))
