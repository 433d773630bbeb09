"""The policy model and the six built-in policies (DESIGN.md, Policies).

Initial memory allocations stay at or below 12 GiB so that they fit the smallest common
data-centre GPUs (T4: 15 GiB) without knowing the device at admission time.

A policy is data: how much history the recommender looks at, which percentile plus
how much headroom becomes the allocation, the bounds, the allocation a workload gets
before there is any history, and whether its GPU may be shared with other workloads.
Operators override these with `GPUPolicy` objects; the built-ins apply when none exist.
"""

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from gpupack.errors import ContractError

GiB: Final = 2**30
DAY: Final = 86_400


class Sharing(StrEnum):
    """How a GPU is shared and how the shares are enforced."""

    SHARED = "shared"  # any workloads of the pool share a GPU; shares are accounting only
    MPS = "mps"  # CUDA MPS limits; a GPU only hosts pods of one workload


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    history_window_seconds: int
    percentile: float  # 0 < p <= 100
    compute_headroom: float  # fraction added on top of the percentile, 0.2 = +20 %
    memory_headroom: float
    min_compute: int  # millis of one GPU
    max_compute: int
    min_memory: int  # bytes
    max_memory: int | None  # None: up to the device's memory
    initial_compute: int  # before any history
    initial_memory: int
    sharing: Sharing = Sharing.SHARED

    def __post_init__(self) -> None:
        key = f"policy {self.name}"
        if not 1 <= self.min_compute <= self.initial_compute <= self.max_compute <= 1000:
            raise ContractError(key, self, "1 <= min_compute <= initial_compute <= max <= 1000")
        max_memory = self.max_memory if self.max_memory is not None else self.initial_memory
        if not 0 < self.min_memory <= self.initial_memory <= max_memory:
            raise ContractError(key, self, "0 < min_memory <= initial_memory <= max_memory")
        if not 0 < self.percentile <= 100:
            raise ContractError(key, self.percentile, "a percentile in (0, 100]")

    def clamp_compute(self, millis: int) -> int:
        return max(self.min_compute, min(self.max_compute, millis))

    def clamp_memory(self, nbytes: int) -> int:
        upper = self.max_memory if self.max_memory is not None else nbytes
        return max(self.min_memory, min(upper, nbytes))


BUILTIN: Final[dict[str, Policy]] = {
    p.name: p
    for p in (
        Policy(
            name="real-time",
            description="model serving, latency-sensitive inference",
            history_window_seconds=14 * DAY,
            percentile=99.0,
            compute_headroom=0.30,
            memory_headroom=0.25,
            min_compute=100,
            max_compute=1000,
            min_memory=1 * GiB,
            max_memory=None,
            initial_compute=500,
            initial_memory=8 * GiB,
        ),
        Policy(
            name="real-time-mps",
            description="low-latency, high-throughput inference with CUDA MPS",
            history_window_seconds=14 * DAY,
            percentile=99.0,
            compute_headroom=0.30,
            memory_headroom=0.25,
            min_compute=100,
            max_compute=1000,
            min_memory=1 * GiB,
            max_memory=None,
            initial_compute=500,
            initial_memory=8 * GiB,
            sharing=Sharing.MPS,
        ),
        Policy(
            name="near-real-time",
            description="inference with stable load",
            history_window_seconds=7 * DAY,
            percentile=95.0,
            compute_headroom=0.15,
            memory_headroom=0.15,
            min_compute=100,
            max_compute=1000,
            min_memory=1 * GiB,
            max_memory=None,
            initial_compute=400,
            initial_memory=8 * GiB,
        ),
        Policy(
            name="batch",
            description="offline scoring, batch inference",
            history_window_seconds=28 * DAY,
            percentile=90.0,
            compute_headroom=0.05,
            memory_headroom=0.10,
            min_compute=50,
            max_compute=1000,
            min_memory=1 * GiB,
            max_memory=None,
            initial_compute=250,
            initial_memory=6 * GiB,
        ),
        Policy(
            name="training",
            description="training, fine-tuning",
            history_window_seconds=7 * DAY,
            percentile=90.0,
            compute_headroom=0.10,
            memory_headroom=0.10,
            min_compute=250,
            max_compute=1000,
            min_memory=4 * GiB,
            max_memory=None,
            initial_compute=1000,
            initial_memory=12 * GiB,
        ),
        Policy(
            name="build",
            description="notebooks, experimentation",
            history_window_seconds=1 * DAY,
            percentile=75.0,
            compute_headroom=0.20,
            memory_headroom=0.20,
            min_compute=50,
            max_compute=500,
            min_memory=1 * GiB,
            max_memory=24 * GiB,
            initial_compute=200,
            initial_memory=4 * GiB,
        ),
    )
}
DEFAULT_POLICY: Final = "near-real-time"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
NAME_FORM: Final = "a policy name (lowercase DNS label), one of the GPUPolicy objects or built-ins"


def parse_policy_name(value: object, key: str) -> str:
    """A syntactically valid policy name; whether it exists is the caller's question."""
    if not isinstance(value, str) or _NAME.match(value.strip()) is None:
        raise ContractError(key, value, NAME_FORM)
    return value.strip()
