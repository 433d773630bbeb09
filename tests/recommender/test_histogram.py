"""Decaying histograms: bucket schemes, percentiles, decay, renormalisation, checkpoints."""

import json
import math
from typing import Any

import pytest

from recommender.histogram import (
    COMPUTE_BUCKETS,
    MEMORY_BUCKETS,
    DecayingHistogram,
    ExponentialBuckets,
    LinearBuckets,
)

MiB = 2**20
HOUR = 3600.0
YEAR = 365 * 86_400.0


@pytest.mark.parametrize(
    "buckets",
    [
        pytest.param(COMPUTE_BUCKETS, id="compute"),
        pytest.param(MEMORY_BUCKETS, id="memory"),
        pytest.param(LinearBuckets(0.3, 1.0), id="linear-uneven"),
        pytest.param(ExponentialBuckets(1.0, 2.0, 100.0), id="exponential-doubling"),
    ],
)
def test_every_value_lies_in_its_bucket(buckets: LinearBuckets | ExponentialBuckets) -> None:
    top = buckets.max_value
    values = [top * k / 997 for k in range(997)] + [buckets.lower(i) for i in range(buckets.count)]
    for value in values:
        i = buckets.index(value)
        assert buckets.lower(i) <= value < buckets.upper(i), (value, i)
    assert buckets.upper(buckets.count - 1) == top
    assert buckets.lower(0) == 0.0


@pytest.mark.parametrize(
    ("buckets", "value", "expected"),
    [
        pytest.param(COMPUTE_BUCKETS, -0.5, 0, id="below-zero-first"),
        pytest.param(COMPUTE_BUCKETS, 0.25, 25, id="compute-quarter"),
        pytest.param(COMPUTE_BUCKETS, 1.0, 99, id="compute-max-last"),
        pytest.param(COMPUTE_BUCKETS, 7.0, 99, id="compute-above-max-last"),
        pytest.param(MEMORY_BUCKETS, -1.0, 0, id="memory-below-zero"),
        pytest.param(MEMORY_BUCKETS, 15 * MiB, 0, id="memory-first-bucket"),
        pytest.param(MEMORY_BUCKETS, 16 * MiB, 1, id="memory-second-bucket"),
        pytest.param(MEMORY_BUCKETS, 2560 * MiB, 45, id="memory-2.5Gi"),
        pytest.param(MEMORY_BUCKETS, 2.0 * 2**50, 180, id="memory-above-max-last"),
    ],
)
def test_bucket_index(
    buckets: LinearBuckets | ExponentialBuckets, value: float, expected: int
) -> None:
    assert buckets.index(value) == expected


def test_exponential_buckets_follow_vpa_bounds() -> None:
    # bucket i spans [16Mi * (1.05^i - 1) / 0.05, 16Mi * (1.05^(i+1) - 1) / 0.05)
    assert MEMORY_BUCKETS.count == 181
    assert MEMORY_BUCKETS.upper(0) == pytest.approx(16 * MiB)
    assert MEMORY_BUCKETS.lower(45) == pytest.approx(2555.2025 * MiB)
    assert MEMORY_BUCKETS.upper(45) == pytest.approx(2698.9626 * MiB)
    with pytest.raises(ValueError, match="bucket 181 out of range 0..180"):
        MEMORY_BUCKETS.upper(181)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: LinearBuckets(0.0, 1.0), id="linear-zero-size"),
        pytest.param(lambda: LinearBuckets(2.0, 1.0), id="linear-size-over-max"),
        pytest.param(lambda: ExponentialBuckets(1.0, 1.0, 10.0), id="exponential-ratio-1"),
        pytest.param(lambda: ExponentialBuckets(-1.0, 1.1, 10.0), id="exponential-negative"),
    ],
)
def test_bad_bucket_schemes_are_rejected(make: Any) -> None:
    with pytest.raises(ValueError, match="buckets need"):
        make()


def test_percentiles_of_a_uniform_distribution() -> None:
    h = DecayingHistogram(COMPUTE_BUCKETS, HOUR)
    for k in range(100):  # one sample in each 1 % bucket
        h.add(k / 100 + 0.005, 1.0, 0.0)
    assert h.total_weight == pytest.approx(100.0)
    assert h.percentile(1) == pytest.approx(0.01)
    assert h.percentile(50) == pytest.approx(0.50)
    assert h.percentile(50.5) == pytest.approx(0.51)
    assert h.percentile(90) == pytest.approx(0.90)
    assert h.percentile(100) == pytest.approx(1.0)


def test_percentiles_of_a_skewed_distribution_with_weights() -> None:
    h = DecayingHistogram(COMPUTE_BUCKETS, HOUR)
    h.add(0.105, 9.0, 0.0)  # 90 % of the weight at 0.10..0.11
    h.add(0.705, 1.0, 0.0)  # 10 % at 0.70..0.71
    assert h.percentile(50) == pytest.approx(0.11)
    assert h.percentile(90) == pytest.approx(0.11)
    assert h.percentile(90.1) == pytest.approx(0.71)
    assert h.percentile(99) == pytest.approx(0.71)


def test_memory_percentile_is_the_upper_bound_of_the_bucket() -> None:
    h = DecayingHistogram(MEMORY_BUCKETS, HOUR)
    h.add(2560 * MiB, 1.0, 0.0)
    assert h.percentile(95) == pytest.approx(2698.9626 * MiB)


def test_empty_histogram() -> None:
    h = DecayingHistogram(MEMORY_BUCKETS, HOUR)
    assert h.empty
    assert h.total_weight == 0.0
    assert h.percentile(99) == 0.0
    h.add(MiB, 0.0, 0.0)  # zero weight adds nothing
    assert h.empty


@pytest.mark.parametrize("p", [0, -1, 100.5])
def test_percentile_outside_0_100_is_rejected(p: float) -> None:
    with pytest.raises(ValueError, match=r"percentile must be in \(0, 100\]"):
        DecayingHistogram(COMPUTE_BUCKETS, HOUR).percentile(p)


@pytest.mark.parametrize(
    ("value", "weight", "time"),
    [
        pytest.param(math.nan, 1.0, 0.0, id="nan-value"),
        pytest.param(0.5, math.inf, 0.0, id="infinite-weight"),
        pytest.param(0.5, 1.0, math.nan, id="nan-time"),
        pytest.param(0.5, -1.0, 0.0, id="negative-weight"),
    ],
)
def test_bad_samples_are_rejected(value: float, weight: float, time: float) -> None:
    with pytest.raises(ValueError, match="weight|finite"):
        DecayingHistogram(COMPUTE_BUCKETS, HOUR).add(value, weight, time)


def test_a_sample_one_half_life_newer_weighs_twice_as_much() -> None:
    h = DecayingHistogram(COMPUTE_BUCKETS, HOUR)
    h.add(0.205, 1.0, 0.0)
    h.add(0.805, 1.0, HOUR)
    assert h.total_weight == pytest.approx(3.0)
    assert h.percentile(33) == pytest.approx(0.21)
    assert h.percentile(34) == pytest.approx(0.81)


def test_old_samples_count_less_after_many_half_lives() -> None:
    h = DecayingHistogram(COMPUTE_BUCKETS, HOUR)
    for k in range(100):
        h.add(0.205, 1.0, k)
    assert h.percentile(50) == pytest.approx(0.21)
    for k in range(10):  # ten half-lives later: each new sample weighs 1024 old ones
        h.add(0.805, 1.0, 10 * HOUR + k)
    assert h.percentile(50) == pytest.approx(0.81)
    assert h.percentile(10) == pytest.approx(0.81)
    assert h.percentile(0.5) == pytest.approx(0.21)


def test_samples_ten_years_apart_renormalise_and_stay_finite() -> None:
    h = DecayingHistogram(COMPUTE_BUCKETS, HOUR)
    h.add(0.205, 1.0, 1_700_000_000.0)
    h.add(0.805, 1.0, 1_700_000_000.0 + 10 * YEAR)  # 87,600 half-lives later
    assert math.isfinite(h.total_weight)
    assert h.reference == 1_700_000_000.0 + 10 * YEAR
    assert h.total_weight == pytest.approx(1.0)  # the old sample decayed to nothing
    assert h.percentile(1) == pytest.approx(0.81)


def test_hourly_samples_over_a_long_time_renormalise_repeatedly() -> None:
    h = DecayingHistogram(COMPUTE_BUCKETS, HOUR)
    for k in range(1000):  # 1000 half-lives: the reference shifts several times
        h.add(0.205 if k < 990 else 0.605, 1.0, k * HOUR)
        assert math.isfinite(h.total_weight)
    assert 0 < h.total_weight < 2.0**101
    # the last 10 hourly samples weigh 1 - 2^-10 of everything
    assert h.percentile(99) == pytest.approx(0.61)
    assert h.percentile(0.05) == pytest.approx(0.21)


def test_samples_from_the_distant_past_weigh_nothing() -> None:
    h = DecayingHistogram(COMPUTE_BUCKETS, HOUR)
    h.add(0.205, 1.0, 10 * YEAR)
    h.add(0.805, 1.0, 0.0)  # underflows to zero weight
    assert h.total_weight == pytest.approx(1.0)
    assert h.percentile(100) == pytest.approx(0.21)


def test_checkpoint_is_compact_json() -> None:
    h = DecayingHistogram(MEMORY_BUCKETS, HOUR)
    h.add(1024 * MiB, 3.0, 100.0)
    h.add(4096 * MiB, 1.0, 100.0)
    h.add(64 * MiB, 1e-9, 100.0)  # rounds to 0 at a scale of 10000: dropped
    data = h.checkpoint()
    assert data == {
        "reference": 100.0,
        "halfLife": HOUR,
        "totalWeight": pytest.approx(4.0),
        "buckets": {"29": 10000, "53": 3333},
    }
    assert json.loads(json.dumps(data)) == data


def test_checkpoint_of_an_empty_histogram_round_trips() -> None:
    data = DecayingHistogram(COMPUTE_BUCKETS, HOUR).checkpoint()
    assert data["buckets"] == {}
    assert DecayingHistogram.from_checkpoint(data, COMPUTE_BUCKETS).empty


@pytest.mark.parametrize(
    ("buckets", "values"),
    [
        pytest.param(COMPUTE_BUCKETS, [k / 1000 for k in range(0, 1000, 7)], id="compute"),
        pytest.param(MEMORY_BUCKETS, [k * 37 * MiB for k in range(1, 400)], id="memory"),
    ],
)
def test_checkpoint_round_trip_preserves_percentiles(
    buckets: LinearBuckets | ExponentialBuckets, values: list[float]
) -> None:
    h = DecayingHistogram(buckets, HOUR)
    for k, value in enumerate(values):
        h.add(value, 1.0, 1_700_000_000.0 + k * 60)
    restored = DecayingHistogram.from_checkpoint(json.loads(json.dumps(h.checkpoint())), buckets)
    assert restored.total_weight == pytest.approx(h.total_weight)
    assert restored.reference == h.reference
    assert restored.half_life == h.half_life
    for p in (1, 10, 25, 50, 75, 90, 95, 99, 100):
        assert restored.percentile(p) == pytest.approx(h.percentile(p)), p
    # new samples weigh against the restored ones as they would have against the originals
    h.add(values[-1], 50.0, 1_700_000_000.0 + len(values) * 60)
    restored.add(values[-1], 50.0, 1_700_000_000.0 + len(values) * 60)
    for p in (10, 50, 90):
        assert restored.percentile(p) == pytest.approx(h.percentile(p)), p


GOOD: dict[str, Any] = {
    "reference": 1.0,
    "halfLife": 3600.0,
    "totalWeight": 2.0,
    "buckets": {"3": 10000},
}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param([], "must be an object", id="not-an-object"),
        pytest.param(
            {**GOOD, "reference": "now"}, "reference must be a finite number", id="ref-str"
        ),
        pytest.param(
            {**GOOD, "reference": True}, "reference must be a finite number", id="ref-bool"
        ),
        pytest.param({**GOOD, "halfLife": None}, "halfLife must be a finite number", id="hl-null"),
        pytest.param({**GOOD, "halfLife": 0}, "halfLife must be > 0", id="hl-zero"),
        pytest.param({**GOOD, "totalWeight": -1.0}, "totalWeight >= 0", id="total-negative"),
        pytest.param({**GOOD, "totalWeight": math.inf}, "totalWeight must be a finite", id="inf"),
        pytest.param(
            {k: v for k, v in GOOD.items() if k != "totalWeight"}, "totalWeight", id="no-total"
        ),
        pytest.param({**GOOD, "buckets": [10000]}, "buckets must be an object", id="buckets-list"),
        pytest.param({**GOOD, "buckets": {"x": 1}}, "bucket index 'x' is not", id="index-word"),
        pytest.param({**GOOD, "buckets": {"-1": 1}}, "bucket index '-1' is not", id="index-neg"),
        pytest.param(
            {**GOOD, "buckets": {"100": 1}}, "bucket index 100 out of range 0..99", id="range"
        ),
        pytest.param({**GOOD, "buckets": {"3": -5}}, "bucket 3 weight -5 is not", id="weight-neg"),
        pytest.param(
            {**GOOD, "buckets": {"3": 1.5}}, "bucket 3 weight 1.5 is not", id="weight-float"
        ),
        pytest.param(
            {**GOOD, "buckets": {"3": "9"}}, "bucket 3 weight '9' is not", id="weight-str"
        ),
        pytest.param({**GOOD, "buckets": {}}, "totalWeight 2.0 disagrees", id="total-no-buckets"),
        pytest.param(
            {**GOOD, "totalWeight": 0}, "totalWeight 0.0 disagrees", id="buckets-no-total"
        ),
    ],
)
def test_malformed_checkpoints_are_rejected(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecayingHistogram.from_checkpoint(data, COMPUTE_BUCKETS)
