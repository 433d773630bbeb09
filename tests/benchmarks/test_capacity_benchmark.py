"""The capacity benchmark on a small burst: what it reports, on a cluster of its own (no
timing is asserted; the figures it measures are in docs/scheduler.md)."""

import json

import pytest

from benchmarks.capacity import run

pytestmark = pytest.mark.integration


def test_a_small_burst_is_reported_against_its_lower_bounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run.main(["--only", "burst", "--burst", "6", "--settle", "0"]) == 0

    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    burst = report["burst"]
    assert burst["pods_bound"] == burst["placeable_pods"] == 6
    assert burst["gpus_lower_bound"] == 2  # 6 x 250m
    assert burst["nodes_lower_bound"] == 1
    assert burst["gpus_in_use"] >= burst["gpus_lower_bound"]
    assert burst["capacity_pods_created"] >= burst["gpus_held_peak"] >= burst["gpus_in_use"]
    assert burst["held_peak_ratio"] == round(burst["gpus_held_peak"] / 2, 2)


def test_unknown_scenarios_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run.main(["--only", "burst,nope"])
    assert info.value.code == 2
    assert "unknown scenario(s): nope" in capsys.readouterr().err
