"""Recommendations: per-policy targets from synthetic usage, confidence, pressure, drift.

Expected values are worked out by hand from the rules, not with the code under test:
a percentile is the upper bound of its bucket (compute: 1 % buckets; memory: VPA's
16Mi * 1.05^i scheme, where 2.5Gi..2.63Gi lies in [2555.2Mi, 2698.96Mi) and 4Gi..4.03Gi
in [3927.98Mi, 4140.38Mi)), times 1 + headroom, rounded up to 10m / 256Mi.
"""

import dataclasses
import json
import random
from typing import Any

import pytest

from gpupack.policy import BUILTIN, DAY, Policy
from recommender.recommend import (
    History,
    Running,
    Target,
    drift,
    half_life,
    recommend,
)

MiB = 2**20
GiB = 2**30
T0 = 1_700_000_000.0


def steady(
    policy: Policy,
    compute: float,
    memory_mib: int,
    span: float | None = None,
    samples: int = 2001,
    seed: int = 7,
) -> History:
    """Usage steady at `compute` (+0.001..0.009) and `memory_mib` (+0..20Mi) over `span`
    seconds (the policy's whole window by default): every sample in one bucket."""
    rng = random.Random(seed)
    span = policy.history_window_seconds if span is None else span
    history = History.new(policy)
    for k in range(samples):
        history.add(
            compute + rng.uniform(0.001, 0.009),
            (memory_mib + rng.randint(0, 20)) * MiB,
            T0 + span * k / (samples - 1),
        )
    return history


def serving(policy: Policy) -> History:
    """2001 samples over the policy's whole window, repeating every 40 samples:
    24 at 0.25 GPU (bucket upper bound 0.26) and 2.5Gi..2.62Gi (upper 2698.96Mi),
    13 at 0.40 GPU (upper 0.41) and the same memory,
     3 at 0.60 GPU (upper 0.61) and 4Gi..4.03Gi (upper 4140.38Mi).
    Cumulative weight: compute 60 % / 92.5 % / 100 %; memory 92.5 % / 100 %."""
    rng = random.Random(2023)
    window = policy.history_window_seconds
    history = History.new(policy)
    for k in range(2001):
        slot = k % 40
        if slot < 3:
            compute, memory = 0.60, 4096 + rng.uniform(0, 30)
        elif slot < 16:
            compute, memory = 0.40, 2560 + rng.uniform(0, 120)
        else:
            compute, memory = 0.25, 2560 + rng.uniform(0, 120)
        history.add(compute + rng.uniform(0.001, 0.009), int(memory * MiB), T0 + window * k / 2000)
    return history


@pytest.mark.parametrize(
    ("policy", "compute", "memory"),
    [
        # p99 -> 0.61 * 1.30 = 0.793 -> 800m; 4140.38Mi * 1.25 = 5175.5Mi -> 5376Mi
        pytest.param("real-time", 800, 5376 * MiB, id="real-time"),
        pytest.param("real-time-mps", 800, 5376 * MiB, id="real-time-mps"),
        # p95 -> 0.61 * 1.15 = 0.7015 -> 710m; 4140.38Mi * 1.15 = 4761.4Mi -> 4864Mi
        pytest.param("near-real-time", 710, 4864 * MiB, id="near-real-time"),
        # p90 -> 0.41 * 1.05 = 0.4305 -> 440m; 2698.96Mi * 1.10 = 2968.9Mi -> 3Gi
        pytest.param("batch", 440, 3 * GiB, id="batch"),
        # p90 -> 0.41 * 1.10 = 0.451 -> 460m; 3Gi, raised to the policy's minimum 4Gi
        pytest.param("training", 460, 4 * GiB, id="training"),
        # p75 -> 0.41 * 1.20 = 0.492 -> 500m (also its maximum); 2698.96Mi * 1.2 -> 3328Mi
        pytest.param("build", 500, 3328 * MiB, id="build"),
    ],
)
def test_each_builtin_policy_over_a_full_window(policy: str, compute: int, memory: int) -> None:
    target = recommend(serving(BUILTIN[policy]), BUILTIN[policy], None)
    assert target is not None
    assert (target.compute, target.memory) == (compute, memory)
    assert target.confidence == 1.0
    assert not target.memory_pressure
    assert "confidence 1.00" in target.reason


def test_the_cases_cover_every_builtin_policy() -> None:
    assert set(BUILTIN) == {
        "real-time",
        "real-time-mps",
        "near-real-time",
        "batch",
        "training",
        "build",
    }


def test_half_life_is_a_quarter_of_the_window() -> None:
    assert half_life(BUILTIN["near-real-time"]) == 7 * DAY / 4
    assert History.new(BUILTIN["build"]).compute.half_life == DAY / 4


def test_reason_explains_percentile_headroom_and_bounds() -> None:
    target = recommend(serving(BUILTIN["training"]), BUILTIN["training"], None)
    assert target is not None
    assert target.reason == (
        "p90 compute 0.41 GPU +10 % headroom = 460m; "
        "p90 memory 2.64Gi +10 % headroom = 3Gi; "
        "policy training bounds 250m..1, 4Gi..device: 460m / 4Gi; "
        "confidence 1.00 (7 days of history, window 7 days)"
    )


def test_low_confidence_scales_down_only_part_of_the_way() -> None:
    policy = BUILTIN["near-real-time"]  # initial 400m / 8Gi, window 7 days
    # a quarter of the window: confidence 0.25
    target = recommend(steady(policy, 0.10, 1024, span=1.75 * DAY), policy, None)
    assert target is not None
    assert target.confidence == pytest.approx(0.25)
    # raw: 0.11 * 1.15 -> 130m; 1063.02Mi * 1.15 = 1222.5Mi -> 1280Mi
    # 400 - 270 * 0.25 = 332.5 -> 340m; 8192 - 6912 * 0.25 = 6464Mi -> 6656Mi
    assert (target.compute, target.memory) == (340, 6656 * MiB)
    assert "25 % of the way down from the initial 400m = 340m" in target.reason
    assert "confidence 0.25 (1.75 days of history, window 7 days)" in target.reason
    # with the whole window behind it, all the way down
    full = recommend(steady(policy, 0.10, 1024), policy, None)
    assert full is not None
    assert (full.compute, full.memory, full.confidence) == (130, 1280 * MiB, 1.0)


def test_scale_up_is_immediate_even_with_a_minute_of_history() -> None:
    policy = BUILTIN["real-time"]  # initial 500m / 8Gi
    target = recommend(steady(policy, 0.60, 10240, span=60, samples=5), policy, None)
    assert target is not None
    assert target.confidence == pytest.approx(60 / (14 * DAY))
    # 0.61 * 1.3 = 0.793 -> 800m; 10414.44Mi * 1.25 = 13018.1Mi -> 13056Mi
    assert (target.compute, target.memory) == (800, 13056 * MiB)


@pytest.mark.parametrize(
    ("policy", "used", "memory", "pressure"),
    [
        # steady 2.5Gi: 3584Mi; at 95 % of 4Gi: 4Gi * 1.25 = 5Gi
        pytest.param("real-time", int(3.8 * GiB), 5 * GiB, True, id="real-time-95pct"),
        # training's 10 % headroom is raised to 20 %: 4.8Gi -> 5Gi
        pytest.param("training", int(3.7 * GiB), 5 * GiB, True, id="training-92pct"),
        pytest.param("real-time", int(3.5 * GiB), 3584 * MiB, False, id="under-90pct"),
        pytest.param("real-time", None, 3584 * MiB, False, id="use-unknown"),
    ],
)
def test_memory_pressure_raises_memory_at_once(
    policy: str, used: int | None, memory: int, pressure: bool
) -> None:
    history = steady(BUILTIN[policy], 0.25, 2560)
    running = Running(pods=3, compute=500, memory=4 * GiB, memory_used=used)
    target = recommend(history, BUILTIN[policy], running)
    assert target is not None
    assert (target.memory, target.memory_pressure) == (memory, pressure)
    assert ("% of its 4Gi allocation" in target.reason) == pressure


def test_memory_pressure_reason_names_the_use() -> None:
    policy = BUILTIN["real-time"]
    running = Running(pods=1, compute=500, memory=4 * GiB, memory_used=int(0.93 * 4 * GiB))
    target = recommend(steady(policy, 0.25, 2560), policy, running)
    assert target is not None
    assert "memory at 93 % of its 4Gi allocation: at least +25 % = 5Gi" in target.reason


@pytest.mark.parametrize(
    ("policy", "compute", "memory_mib", "expected"),
    [
        # 0.91 * 1.2 -> 1100m and 30Gi+ -> clamped to build's 500m / 24Gi
        pytest.param("build", 0.90, 30 * 1024, (500, 24 * GiB), id="build-max"),
        # 0.02 * 1.05 -> 30m and 200Mi -> raised to batch's 50m / 1Gi
        pytest.param("batch", 0.01, 200, (50, GiB), id="batch-min"),
        # 1.0 * 1.3 -> 1300m: one GPU at most; no memory maximum: 41760.4Mi * 1.25 -> 51Gi
        pytest.param("real-time", 1.2, 40 * 1024, (1000, 51 * GiB), id="real-time-max"),
    ],
)
def test_bounds_clamp(
    policy: str, compute: float, memory_mib: int, expected: tuple[int, int]
) -> None:
    target = recommend(steady(BUILTIN[policy], compute, memory_mib), BUILTIN[policy], None)
    assert target is not None
    assert (target.compute, target.memory) == expected


def test_no_recommendation_without_samples() -> None:
    policy = BUILTIN["batch"]
    history = History.new(policy)
    assert recommend(history, policy, None) is None
    history.add(None, None, T0)  # nothing known: ignored
    assert history.samples == 0
    assert recommend(history, policy, None) is None


def test_a_dimension_without_samples_keeps_the_initial_allocation() -> None:
    policy = BUILTIN["near-real-time"]
    history = History.new(policy)
    for k in range(10):
        history.add(None, 1024 * MiB, T0 + k * DAY)  # memory only, confidence 1
    target = recommend(history, policy, None)
    assert target is not None
    assert (target.compute, target.memory) == (400, 1280 * MiB)
    assert "no compute samples yet: the initial 400m" in target.reason


def test_compute_is_clamped_to_one_gpu_when_sampled() -> None:
    history = History.new(BUILTIN["batch"])
    history.add(-0.5, None, T0)
    history.add(3.0, None, T0)
    assert history.compute.percentile(50) == pytest.approx(0.01)
    assert history.compute.percentile(100) == pytest.approx(1.0)
    assert (history.first_sample, history.last_sample, history.samples) == (T0, T0, 2)


def test_out_of_order_samples_widen_the_span() -> None:
    history = History.new(BUILTIN["batch"])
    history.add(0.5, GiB, T0)
    history.add(0.5, GiB, T0 - 100)
    history.add(0.5, GiB, T0 + 50)
    assert (history.first_sample, history.last_sample) == (T0 - 100, T0 + 50)


@pytest.mark.parametrize("policy", sorted(BUILTIN))
def test_checkpoint_round_trip_gives_the_same_target(policy: str) -> None:
    history = serving(BUILTIN[policy])
    running = Running(pods=2, compute=300, memory=3 * GiB, memory_used=int(2.9 * GiB))
    restored = History.from_checkpoint(json.loads(json.dumps(history.checkpoint())))
    assert restored.samples == history.samples == 2001
    assert (restored.first_sample, restored.last_sample) == (
        history.first_sample,
        history.last_sample,
    )
    for running_now in (None, running):
        assert recommend(restored, BUILTIN[policy], running_now) == recommend(
            history, BUILTIN[policy], running_now
        )


def test_checkpoint_of_an_empty_history_round_trips() -> None:
    data = History.new(BUILTIN["build"]).checkpoint()
    assert (data["firstSample"], data["lastSample"], data["samples"], data["version"]) == (
        None,
        None,
        0,
        1,
    )
    restored = History.from_checkpoint(json.loads(json.dumps(data)))
    assert restored.samples == 0
    assert recommend(restored, BUILTIN["build"], None) is None


def _good() -> dict[str, Any]:
    history = History.new(BUILTIN["build"])
    history.add(0.3, GiB, T0)
    history.add(0.3, GiB, T0 + 60)
    return history.checkpoint()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"version": 2}, "version 2 is not 1", id="version"),
        pytest.param({"version": None}, "version None is not 1", id="no-version"),
        pytest.param(
            {"compute": None}, "history checkpoint compute: .*must be an object", id="compute"
        ),
        pytest.param(
            {"memory": {"reference": 0, "halfLife": 1, "totalWeight": 1, "buckets": {"181": 1}}},
            "history checkpoint memory: bucket index 181 out of range 0..180",
            id="memory-index",
        ),
        pytest.param({"samples": -1}, "samples -1 is not a whole number", id="samples-negative"),
        pytest.param({"samples": "2"}, "samples '2' is not a whole number", id="samples-string"),
        pytest.param(
            {"firstSample": "yesterday"}, "firstSample 'yesterday' is not a time", id="first"
        ),
        pytest.param({"lastSample": None}, "must be set iff samples", id="last-missing"),
        pytest.param({"samples": 0}, "must be set iff samples", id="times-without-samples"),
        pytest.param({"firstSample": T0 + 61}, "is after lastSample", id="first-after-last"),
    ],
)
def test_malformed_history_checkpoints_are_rejected(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        History.from_checkpoint({**_good(), **change})


def test_a_history_checkpoint_must_be_an_object() -> None:
    with pytest.raises(ValueError, match="history checkpoint must be an object"):
        History.from_checkpoint("{}")


def target(compute: int, memory: int, pressure: bool = False) -> Target:
    return Target(compute, memory, 1.0, "", pressure)


@pytest.mark.parametrize(
    ("want", "running", "expected"),
    [
        pytest.param(
            target(280, 4 * GiB),
            Running(2, 1000, 4 * GiB, None),
            "compute 1 -> 280m (3.6x apart, threshold 1.5x)",
            id="compute-down",
        ),
        pytest.param(
            target(500, 3 * GiB),
            Running(1, 500, 8 * GiB, None),
            "memory 8Gi -> 3Gi (2.7x apart, threshold 1.5x)",
            id="memory-down",
        ),
        pytest.param(
            target(800, 12 * GiB),
            Running(1, 200, 4 * GiB, None),
            "compute 200m -> 800m (4.0x apart, threshold 1.5x); memory 4Gi -> 12Gi (3.0x apart,"
            " threshold 1.5x)",
            id="both-up",
        ),
        pytest.param(target(450, 4 * GiB), Running(1, 300, 4 * GiB, None), None, id="at-threshold"),
        pytest.param(
            target(460, 4 * GiB),
            Running(1, 300, 4 * GiB, None),
            "compute 300m -> 460m (1.5x apart, threshold 1.5x)",
            id="past-threshold",
        ),
        pytest.param(target(280, 4 * GiB), Running(0, 1000, 4 * GiB, None), None, id="no-pods"),
        pytest.param(
            target(500, 5 * GiB, pressure=True),
            Running(1, 500, 4 * GiB, 4 * GiB),
            "memory 4Gi -> 5Gi (memory pressure)",
            id="pressure",
        ),
        pytest.param(
            target(500, 4 * GiB, pressure=True),
            Running(1, 500, 4 * GiB, 4 * GiB),
            None,
            id="pressure-met",
        ),
        pytest.param(
            target(500, 4 * GiB), Running(1, 0, 4 * GiB, None), None, id="running-unknown"
        ),
    ],
)
def test_drift(want: Target, running: Running, expected: str | None) -> None:
    assert drift(want, running, 0.5) == expected


def test_drift_threshold_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        drift(target(500, GiB), Running(1, 500, GiB, None), -0.1)


def test_targets_are_values() -> None:
    one = target(500, GiB)
    assert dataclasses.replace(one) == one
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.compute = 1  # type: ignore[misc]
