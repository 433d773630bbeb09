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
"""

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
