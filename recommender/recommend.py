"""One workload's usage history and the allocation it recommends (pure).

The history is two decaying histograms (compute as a ratio of one GPU, memory in bytes)
whose half-life is a quarter of the policy's window, so a sample as old as the window
weighs 1/16 of a new one. The target is the policy's percentile plus headroom, rounded
up (10m, 256 MiB), applied asymmetrically as VPA does: above the policy's initial
allocation at once, below it in proportion to the confidence (how much of the window the
history covers), so a workload with a day of history does not lose its allocation on one
quiet afternoon. A running pod whose memory use nears its allocation raises memory at
once. `drift` says when running pods are far enough from the target to restart them.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpupack.policy import Policy
from gpupack.quantity import format_compute, format_memory
from recommender.histogram import COMPUTE_BUCKETS, MEMORY_BUCKETS, DecayingHistogram

MiB: Final = 2**20
GiB: Final = 2**30
COMPUTE_STEP: Final = 10  # millis
MEMORY_STEP: Final = 256 * MiB
PRESSURE: Final = 0.9  # memory in use / allocated at which memory is raised at once
PRESSURE_HEADROOM: Final = 0.2  # the least headroom over the allocation under pressure
VERSION: Final = 1


def half_life(policy: Policy) -> float:
    """A quarter of the window: a sample as old as the window weighs 1/16."""
    return policy.history_window_seconds / 4


def _round_up(value: float, step: int) -> int:
    """`value` rounded up to a multiple of `step`, forgiving float noise below it."""
    return max(0, math.ceil(value / step - 1e-9)) * step


@dataclass
class History:
    """A workload's samples: what its pods used, weighted towards the recent."""

    compute: DecayingHistogram
    memory: DecayingHistogram
    first_sample: float | None = None
    last_sample: float | None = None
    samples: int = 0

    @classmethod
    def new(cls, policy: Policy) -> "History":
        return cls(
            DecayingHistogram(COMPUTE_BUCKETS, half_life(policy)),
            DecayingHistogram(MEMORY_BUCKETS, half_life(policy)),
        )

    def add(self, compute: float | None, memory: int | None, time: float) -> None:
        """One sample: the ratio of one GPU a pod used (clamped to 0..1) and its GPU
        memory in bytes, either unknown (None); a sample with neither is ignored."""
        if compute is None and memory is None:
            return
        if compute is not None:
            self.compute.add(min(1.0, max(0.0, compute)), 1.0, time)
        if memory is not None:
            self.memory.add(float(memory), 1.0, time)
        self.first_sample = time if self.first_sample is None else min(self.first_sample, time)
        self.last_sample = time if self.last_sample is None else max(self.last_sample, time)
        self.samples += 1

    def checkpoint(self) -> dict[str, Any]:
        """JSON-safe; `firstSample`/`lastSample` are null while there are no samples."""
        return {
            "compute": self.compute.checkpoint(),
            "memory": self.memory.checkpoint(),
            "firstSample": self.first_sample,
            "lastSample": self.last_sample,
            "samples": self.samples,
            "version": VERSION,
        }

    @classmethod
    def from_checkpoint(cls, data: object) -> "History":
        """The history `checkpoint()` wrote. Raises ValueError naming the bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"history checkpoint must be an object, got {data!r}")
        if data.get("version") != VERSION:
            raise ValueError(f"history checkpoint version {data.get('version')!r} is not 1")
        histograms = []
        for key, buckets in (("compute", COMPUTE_BUCKETS), ("memory", MEMORY_BUCKETS)):
            try:
                histograms.append(DecayingHistogram.from_checkpoint(data.get(key), buckets))
            except ValueError as exc:
                raise ValueError(f"history checkpoint {key}: {exc}") from None
        first, last = _time(data, "firstSample"), _time(data, "lastSample")
        samples = data.get("samples")
        if type(samples) is not int or samples < 0:
            raise ValueError(f"history checkpoint samples {samples!r} is not a whole number >= 0")
        if (first is None) != (last is None) or (first is None) != (samples == 0):
            raise ValueError("history checkpoint firstSample/lastSample must be set iff samples")
        if first is not None and last is not None and first > last:
            raise ValueError(f"history checkpoint firstSample {first} is after lastSample {last}")
        return cls(histograms[0], histograms[1], first, last, samples)


def _time(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"history checkpoint {key} {value!r} is not a time in unix seconds")
    return float(value)


@dataclass(frozen=True, slots=True)
class Running:
    """What the workload's running pods have now."""

    pods: int
    compute: int  # the largest allocated compute among them, millis
    memory: int  # the largest allocated memory, bytes
    memory_used: int | None  # the most GPU memory any of them uses now, bytes; None: unknown


@dataclass(frozen=True, slots=True)
class Target:
    """The recommended allocation and why."""

    compute: int  # millis
    memory: int  # bytes
    confidence: float  # 0..1
    reason: str
    memory_pressure: bool


def _approx_memory(nbytes: float) -> str:
    """`2.64Gi`, `900Mi`: a measured value, for people (not the exact annotation form)."""
    unit, name = (GiB, "Gi") if nbytes >= GiB else (MiB, "Mi")
    return f"{nbytes / unit:.2f}".rstrip("0").rstrip(".") + name


def _duration(seconds: float) -> str:
    """`1.75 days`, `1 day`, `6 h`, `12 min`."""
    if seconds >= 86_400:
        days = seconds / 86_400
        return f"{days:.3g} day" + ("" if f"{days:.3g}" == "1" else "s")
    if seconds >= 3_600:
        return f"{seconds / 3_600:.3g} h"
    return f"{seconds / 60:.0f} min"


def _settle(
    name: str,
    histogram: DecayingHistogram,
    policy: Policy,
    headroom: float,
    scale: float,
    step: int,
    base: int,
    confidence: float,
) -> tuple[int, str]:
    """One dimension before pressure and bounds: (value, the clause explaining it)."""
    fmt, approx = (
        (format_compute, lambda v: f"{v:.2f} GPU")
        if name == "compute"
        else (format_memory, _approx_memory)
    )
    if histogram.empty:
        return base, f"no {name} samples yet: the initial {fmt(base)}"
    used = histogram.percentile(policy.percentile)
    raw = _round_up(used * (1 + headroom) * scale, step)
    clause = (
        f"p{policy.percentile:g} {name} {approx(used)} +{headroom * 100:.0f} % headroom"
        f" = {fmt(raw)}"
    )
    if raw >= base or confidence >= 1:
        return raw, clause
    value = _round_up(base - (base - raw) * confidence, step)
    return value, (
        f"{clause}, {confidence * 100:.0f} % of the way down from the initial {fmt(base)}"
        f" = {fmt(value)}"
    )


def recommend(history: History, policy: Policy, running: Running | None) -> Target | None:
    """The target for the workload's pods; None while the history has no samples."""
    first, last = history.first_sample, history.last_sample
    if history.samples == 0 or first is None or last is None:
        return None
    if history.compute.empty and history.memory.empty:
        return None
    window = policy.history_window_seconds
    confidence = min(1.0, max(0.0, (last - first) / window))
    compute, compute_why = _settle(
        "compute",
        history.compute,
        policy,
        policy.compute_headroom,
        1000,
        COMPUTE_STEP,
        policy.initial_compute,
        confidence,
    )
    memory, memory_why = _settle(
        "memory",
        history.memory,
        policy,
        policy.memory_headroom,
        1,
        MEMORY_STEP,
        policy.initial_memory,
        confidence,
    )
    clauses = [compute_why, memory_why]
    pressure = (
        running is not None
        and running.memory_used is not None
        and running.memory > 0
        and running.memory_used >= PRESSURE * running.memory
    )
    if pressure and running is not None and running.memory_used is not None:
        headroom = max(policy.memory_headroom, PRESSURE_HEADROOM)
        floor = _round_up(math.ceil(running.memory * (1 + headroom)), MEMORY_STEP)
        memory = max(memory, floor)
        clauses.append(
            f"memory at {running.memory_used / running.memory * 100:.0f} % of its"
            f" {format_memory(running.memory)} allocation: at least"
            f" +{headroom * 100:.0f} % = {format_memory(floor)}"
        )
    clamped_compute, clamped_memory = policy.clamp_compute(compute), policy.clamp_memory(memory)
    if (clamped_compute, clamped_memory) != (compute, memory):
        upper = format_memory(policy.max_memory) if policy.max_memory is not None else "device"
        clauses.append(
            f"policy {policy.name} bounds {format_compute(policy.min_compute)}.."
            f"{format_compute(policy.max_compute)}, {format_memory(policy.min_memory)}..{upper}:"
            f" {format_compute(clamped_compute)} / {format_memory(clamped_memory)}"
        )
    clauses.append(
        f"confidence {confidence:.2f} ({_duration(last - first)} of history, window"
        f" {_duration(window)})"
    )
    return Target(clamped_compute, clamped_memory, confidence, "; ".join(clauses), pressure)


def drift(target: Target, running: Running, threshold: float) -> str | None:
    """Why the running pods should be restarted onto `target`, or None. A dimension
    drifts when the larger value exceeds the smaller by more than 1 + threshold times
    (a running value of 0, unknown, never drifts); memory under pressure drifts as soon
    as the target is above the running allocation."""
    if threshold < 0:
        raise ValueError(f"drift threshold must be >= 0, got {threshold}")
    if running.pods <= 0:
        return None
    if target.memory_pressure and target.memory > running.memory:
        return (
            f"memory {format_memory(running.memory)} -> {format_memory(target.memory)}"
            " (memory pressure)"
        )
    reasons = []
    for name, now, then, fmt in (
        ("compute", running.compute, target.compute, format_compute),
        ("memory", running.memory, target.memory, format_memory),
    ):
        if now <= 0 or then <= 0:
            continue
        apart = max(now, then) / min(now, then)
        if apart > 1 + threshold:
            reasons.append(
                f"{name} {fmt(now)} -> {fmt(then)}"
                f" ({apart:.1f}x apart, threshold {1 + threshold:g}x)"
            )
    return "; ".join(reasons) or None
