"""Decaying histograms of usage, as the Kubernetes VPA recommender keeps them.

A sample's weight doubles every `half_life` seconds of sample time, so newer samples
count more and a sample one half-life old counts half as much as one taken now. Weights
are kept relative to a reference time; when a new sample would weigh more than 2**100,
every weight is renormalised to a new reference (VPA's shiftReferenceTimestamp), so
floats never overflow however far apart the samples are.

A percentile is the upper bound of the bucket where the cumulative weight reaches it,
so it errs upwards by at most one bucket. Checkpoints are compact and JSON-safe: the
bucket weights scaled so the largest is 10000, plus the total to restore their scale.
Pure: the caller passes every time in (unix seconds).
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

MAX_EXPONENT: Final = 100.0  # renormalise before a weight factor passes 2**100
CHECKPOINT_SCALE: Final = 10_000  # the largest bucket's weight in a checkpoint
_REACHED: Final = 1 - 1e-12  # "reaches p %", forgiving the last bits of a float sum


class Buckets(Protocol):
    """A bucket scheme: `count` buckets covering [0, max_value], the last one open."""

    @property
    def count(self) -> int: ...
    def index(self, value: float) -> int: ...
    def lower(self, index: int) -> float: ...
    def upper(self, index: int) -> float: ...


def _locate(scheme: Buckets, value: float, guess: int) -> int:
    """`guess`, corrected for float error so that lower(i) <= value < upper(i)."""
    last = scheme.count - 1
    i = max(0, min(last, guess))
    while i > 0 and scheme.lower(i) > value:
        i -= 1
    while i < last and scheme.upper(i) <= value:
        i += 1
    return i


def _check(scheme: Buckets, index: int) -> None:
    if not 0 <= index < scheme.count:
        raise ValueError(f"bucket {index} out of range 0..{scheme.count - 1}")


@dataclass(frozen=True, slots=True)
class LinearBuckets:
    """Buckets of equal `size`: [i*size, (i+1)*size); the last one ends at `max_value`."""

    size: float
    max_value: float
    count: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.size < self.max_value:
            raise ValueError(f"linear buckets need 0 < size < max_value, got {self}")
        object.__setattr__(self, "count", math.ceil(self.max_value / self.size - 1e-9))

    def index(self, value: float) -> int:
        return _locate(self, value, math.floor(value / self.size) if value > 0 else 0)

    def lower(self, index: int) -> float:
        _check(self, index)
        return index * self.size

    def upper(self, index: int) -> float:
        _check(self, index)
        return min(self.max_value, (index + 1) * self.size)


@dataclass(frozen=True, slots=True)
class ExponentialBuckets:
    """Bucket i spans [first*(ratio**i - 1)/(ratio - 1), first*(ratio**(i+1) - 1)/(ratio - 1)),
    VPA's scheme: each bucket `ratio` times as wide as the one before."""

    first_size: float
    ratio: float
    max_value: float
    count: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (0 < self.first_size < self.max_value and self.ratio > 1):
            raise ValueError(f"exponential buckets need 0 < first_size < max, ratio > 1: {self}")
        # the fewest buckets whose last one reaches max_value
        n = math.ceil(math.log(self.max_value * (self.ratio - 1) / self.first_size + 1, self.ratio))
        while n > 1 and self._start(n - 1) >= self.max_value:
            n -= 1
        while self._start(n) < self.max_value:
            n += 1
        object.__setattr__(self, "count", n)

    def _start(self, index: int) -> float:
        return self.first_size * (self.ratio**index - 1) / (self.ratio - 1)

    def index(self, value: float) -> int:
        if value <= 0:
            return 0
        guess = math.log(value * (self.ratio - 1) / self.first_size + 1, self.ratio)
        return _locate(self, value, math.floor(guess))

    def lower(self, index: int) -> float:
        _check(self, index)
        return self._start(index)

    def upper(self, index: int) -> float:
        _check(self, index)
        return min(self.max_value, self._start(index + 1))


MiB: Final = 2**20
COMPUTE_BUCKETS: Final = LinearBuckets(0.01, 1.0)  # a ratio of one GPU, 1 % buckets
MEMORY_BUCKETS: Final = ExponentialBuckets(16 * MiB, 1.05, float(2 * 2**40))  # bytes


class DecayingHistogram:
    """Weighted samples in buckets; a weight doubles with every `half_life` of sample time."""

    def __init__(self, buckets: Buckets, half_life: float) -> None:
        if not (math.isfinite(half_life) and half_life > 0):
            raise ValueError(f"half_life must be a positive number of seconds, got {half_life}")
        self.buckets = buckets
        self.half_life = half_life
        self.reference = 0.0
        self._weights = [0.0] * buckets.count
        self._total = 0.0

    @property
    def empty(self) -> bool:
        return self._total <= 0

    @property
    def total_weight(self) -> float:
        return self._total

    def add(self, value: float, weight: float, time: float) -> None:
        """Add `value` with `weight` as of `time` (unix seconds)."""
        if not (math.isfinite(value) and math.isfinite(weight) and math.isfinite(time)):
            raise ValueError(f"value, weight and time must be finite: {value}, {weight}, {time}")
        if weight < 0:
            raise ValueError(f"weight must not be negative, got {weight}")
        if self.empty:
            self.reference = time
        exponent = (time - self.reference) / self.half_life
        if exponent > MAX_EXPONENT:
            self._shift_reference(time)
            exponent = 0.0
        scaled = weight * 2.0**exponent
        if scaled > 0:  # zero, or so old that it underflows: it weighs nothing
            self._weights[self.buckets.index(value)] += scaled
            self._total += scaled

    def _shift_reference(self, reference: float) -> None:
        factor = 2.0 ** ((self.reference - reference) / self.half_life)
        self._weights = [w * factor for w in self._weights]
        self._total = sum(self._weights)
        self.reference = reference

    def percentile(self, p: float) -> float:
        """The upper bound of the first bucket where the cumulative weight reaches p % of
        the total; 0.0 when empty."""
        if not 0 < p <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {p}")
        if self.empty:
            return 0.0
        threshold = self._total * p / 100 * _REACHED
        cumulative, last = 0.0, 0
        for i, w in enumerate(self._weights):
            if w > 0:
                cumulative += w
                last = i
                if cumulative >= threshold:
                    return self.buckets.upper(i)
        return self.buckets.upper(last)  # float sums fell short of the total

    def checkpoint(self) -> dict[str, Any]:
        """`{"reference", "halfLife", "totalWeight", "buckets": {"<index>": weight}}` with
        the weights scaled so that the largest is 10000 (buckets that round to 0 dropped)."""
        top = max(self._weights)
        scaled = {
            str(i): round(w / top * CHECKPOINT_SCALE) for i, w in enumerate(self._weights) if w > 0
        }
        return {
            "reference": self.reference,
            "halfLife": self.half_life,
            "totalWeight": self._total,
            "buckets": {i: w for i, w in scaled.items() if w > 0},
        }

    @classmethod
    def from_checkpoint(cls, data: object, buckets: Buckets) -> "DecayingHistogram":
        """The histogram `checkpoint()` wrote. Raises ValueError naming the bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"histogram checkpoint must be an object, got {data!r}")
        reference = _number(data, "reference")
        half_life = _number(data, "halfLife")
        total = _number(data, "totalWeight")
        if half_life <= 0 or total < 0:
            raise ValueError(f"halfLife must be > 0 and totalWeight >= 0: {half_life}, {total}")
        raw = data.get("buckets")
        if not isinstance(raw, Mapping):
            raise ValueError(f"buckets must be an object of index -> weight, got {raw!r}")
        weights: dict[int, int] = {}
        for key, weight in raw.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit()):
                raise ValueError(f"bucket index {key!r} is not a non-negative whole number")
            if not int(key) < buckets.count:
                raise ValueError(f"bucket index {key} out of range 0..{buckets.count - 1}")
            if type(weight) is not int or weight < 0:
                raise ValueError(f"bucket {key} weight {weight!r} is not a whole number >= 0")
            weights[int(key)] = weight
        stored = sum(weights.values())
        if (stored == 0) != (total == 0):
            raise ValueError(f"totalWeight {total} disagrees with bucket weights summing {stored}")
        histogram = cls(buckets, half_life)
        histogram.reference = reference
        for i, weight in weights.items():
            histogram._weights[i] = weight * total / stored
        histogram._total = total
        return histogram


def _number(data: Mapping[str, Any], key: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    return float(value)
