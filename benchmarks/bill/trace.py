"""The workloads the bill benchmark replays: when each arrives, how long it lives, what it
asks. Pure: a mix, a seed and a time scale in, the same trace out.

Mixes (`MIXES`):

- **short**: what a platform team sees from notebooks, builds and batch jobs, the mix the
  churn report measured: Deployments of 1-3 replicas arriving as a Poisson process over
  `duration` seconds, each living an exponential time (mean 6 minutes, clipped to 2-12),
  each pod a share of compute 100m-1000m (mean ~550m) and memory 8-40 GiB.
- **long**: the same arrivals, living hours (exponential, mean 4 hours, at least 1):
  what runs for most of a day, scaled (`scale`) like every time here.
- **openb**: the arrivals and lifetimes of the openb trace's single-GPU sharing pods
  (Alibaba, cluster-trace-gpu-v2023: `creation_time`, `deletion_time`, `gpu_milli`),
  a window of `count` consecutive arrivals mapped onto `duration` seconds; memory from
  the share of an 80 GiB GPU. Pods become Deployments of one replica.

`scale` multiplies every time (arrivals and lifetimes): 0.1 replays 15 minutes in 90 s,
for CI. Autoscaler and gpupack timings (`consolidateAfter`, grace periods) do not scale, so a
scaled run measures less than a full one does; the closing figures are full runs.
"""

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

GiB: Final = 2**30
MIXES: Final = ("short", "long", "openb")
SHORT_MEAN: Final = 360.0  # seconds a short-lived workload lives, on average
SHORT_BOUNDS: Final = (120.0, 720.0)
LONG_MEAN: Final = 4 * 3600.0
LONG_LEAST: Final = 3600.0
GPU_MEMORY: Final = 80 * GiB  # the instance types' GPUs (H100 and A100, 80 GB)


@dataclass(frozen=True, slots=True)
class Workload:
    """A Deployment of `replicas` pods of one share, created at `start` and deleted at
    `end` (seconds from the replay's start)."""

    name: str
    start: float
    end: float
    replicas: int
    compute: int  # millis of a GPU
    memory: int  # bytes

    @property
    def lifetime(self) -> float:
        return self.end - self.start


def short(
    count: int, duration: float, rng: random.Random, *, lifetime: str = "short"
) -> list[Workload]:
    """`count` workloads arriving as a Poisson process over `duration` seconds."""
    rate = count / duration
    at = 0.0
    made: list[Workload] = []
    for index in range(count):
        at += rng.expovariate(rate)
        if lifetime == "short":
            lives = min(max(rng.expovariate(1 / SHORT_MEAN), SHORT_BOUNDS[0]), SHORT_BOUNDS[1])
        else:
            lives = max(rng.expovariate(1 / LONG_MEAN), LONG_LEAST)
        made.append(
            Workload(
                f"w{index:03d}",
                round(at, 1),
                round(at + lives, 1),
                rng.randint(1, 3),
                rng.randrange(100, 1001, 10),
                rng.randint(8, 40) * GiB,
            )
        )
    return made


def openb(path: Path, count: int, duration: float, rng: random.Random) -> list[Workload]:
    """`count` consecutive single-GPU sharing pods of the openb pod list at `path`, from a
    random place in it, their times mapped so the arrivals span `duration` seconds."""
    rows = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            milli = int(row["gpu_milli"] or 0)
            if int(row["num_gpu"] or 0) != 1 or not 0 < milli < 1000:
                continue
            created, deleted = int(row["creation_time"]), int(row["deletion_time"] or 0)
            if deleted > created:
                rows.append((created, deleted, milli))
    if len(rows) < count:
        raise ValueError(f"{path}: {len(rows)} sharing pods, fewer than the {count} asked")
    rows.sort()
    first = rng.randrange(0, len(rows) - count + 1)
    window = rows[first : first + count]
    origin = window[0][0]
    span = max(window[-1][0] - origin, 1)
    factor = duration / span
    return [
        Workload(
            f"w{index:03d}",
            round((created - origin) * factor, 1),
            round((deleted - origin) * factor, 1),
            1,
            milli,
            max(GiB, math.ceil(milli / 1000 * GPU_MEMORY / GiB) * GiB),
        )
        for index, (created, deleted, milli) in enumerate(window)
    ]


def trace(
    mix: str,
    count: int,
    duration: float,
    seed: int,
    scale: float = 1.0,
    openb_pods: Path | None = None,
) -> list[Workload]:
    """`count` workloads of `mix` arriving over `duration` seconds, every time then
    multiplied by `scale` (0.1: ten times faster). Every workload ends by the horizon,
    `duration` + `SHORT_BOUNDS[1]` (a long-lived one is deleted there: the replay's end),
    scaled likewise. Sorted by arrival."""
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}: one of {', '.join(MIXES)}")
    if count < 1 or duration <= 0 or not 0 < scale <= 1:
        raise ValueError("count must be at least 1, duration positive, scale in (0, 1]")
    rng = random.Random(seed)
    if mix == "openb":
        if openb_pods is None:
            raise ValueError("the openb mix needs the openb pod list (--openb-pods)")
        made = openb(openb_pods, count, duration, rng)
    else:
        made = short(count, duration, rng, lifetime=mix)
    horizon = duration + SHORT_BOUNDS[1]
    scaled = [
        Workload(
            w.name,
            round(w.start * scale, 1),
            round(min(w.end, horizon) * scale, 1),
            w.replicas,
            w.compute,
            w.memory,
        )
        for w in made
    ]
    return sorted(scaled, key=lambda w: (w.start, w.name))


def bound_gpus(shares: Sequence[tuple[int, int]]) -> int:
    """The fewest whole GPUs that could hold these (compute, memory) shares: their compute
    and their memory over one GPU's, rounded up (`scheduler.consolidation.lower_bound`)."""
    compute = sum(c for c, _ in shares)
    memory = sum(m for _, m in shares)
    return max(math.ceil(compute / 1000), math.ceil(memory / GPU_MEMORY))
