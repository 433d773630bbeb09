"""The bill benchmark's pure parts: the traces it replays and what it adds up."""

import csv
from pathlib import Path

import pytest

from benchmarks.bill.tally import Seen, Side, compare, percentile
from benchmarks.bill.trace import SHORT_BOUNDS, GiB, bound_gpus, trace


def test_the_short_mix_is_the_churn_reports_trace() -> None:
    workloads = trace("short", 400, 900.0, seed=3)
    assert len(workloads) == 400
    assert [w.start for w in workloads] == sorted(w.start for w in workloads)
    assert all(SHORT_BOUNDS[0] <= round(w.lifetime, 1) + 0.1 for w in workloads)
    assert all(w.lifetime <= SHORT_BOUNDS[1] + 0.1 for w in workloads)
    assert {w.replicas for w in workloads} == {1, 2, 3}
    assert all(100 <= w.compute <= 1000 and 8 * GiB <= w.memory <= 40 * GiB for w in workloads)
    assert 500 <= sum(w.compute for w in workloads) / 400 <= 600
    assert trace("short", 400, 900.0, seed=3) == workloads  # seeded


def test_a_scaled_trace_is_the_same_trace_faster() -> None:
    full, fast = trace("short", 20, 900.0, seed=1), trace("short", 20, 900.0, seed=1, scale=0.1)
    for slow, quick in zip(full, fast, strict=True):
        assert quick.start == pytest.approx(slow.start * 0.1, abs=0.1)
        assert quick.end == pytest.approx(slow.end * 0.1, abs=0.1)
        assert (quick.compute, quick.memory, quick.replicas) == (
            slow.compute,
            slow.memory,
            slow.replicas,
        )


def test_long_lived_workloads_end_at_the_horizon() -> None:
    workloads = trace("long", 30, 900.0, seed=1)
    assert {w.end for w in workloads} == {900.0 + SHORT_BOUNDS[1]}


def test_the_openb_mix_keeps_the_traces_sharing_pods_in_order(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    rows = [
        # name, num_gpu, gpu_milli, creation, deletion
        ("p0", 1, 500, 100, 400),
        ("p1", 0, 0, 150, 300),  # no GPU
        ("p2", 1, 1000, 200, 900),  # a whole GPU
        ("p3", 1, 250, 300, 500),
        ("p4", 2, 500, 350, 700),  # two GPUs
        ("p5", 1, 750, 500, 600),
    ]
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["name", "num_gpu", "gpu_milli", "creation_time", "deletion_time"])
        out.writerows(rows)
    workloads = trace("openb", 3, 40.0, seed=0, openb_pods=path)
    assert [(w.start, w.end, w.compute) for w in workloads] == [
        (0.0, 30.0, 500),
        (20.0, 40.0, 250),
        (40.0, 50.0, 750),
    ]
    with pytest.raises(ValueError, match="3 sharing pods, fewer than the 4 asked"):
        trace("openb", 4, 40.0, seed=0, openb_pods=path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("nope", 1, 10.0, 0), "unknown mix", id="mix"),
        pytest.param(("short", 0, 10.0, 0), "count must be at least 1", id="count"),
        pytest.param(("short", 1, 10.0, 0, 2.0), "scale in", id="scale"),
        pytest.param(("openb", 1, 10.0, 0), "needs the openb pod list", id="openb"),
    ],
)
def test_a_trace_it_cannot_make_is_a_clear_error(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trace(*args)  # type: ignore[arg-type]


def test_the_bound_is_compute_or_memory_rounded_up() -> None:
    assert bound_gpus([]) == 0
    assert bound_gpus([(300, GiB), (300, GiB), (500, GiB)]) == 2
    assert bound_gpus([(100, 50 * GiB), (100, 50 * GiB)]) == 2  # 100 GiB of 80 GiB GPUs


def test_a_side_adds_each_sample_until_the_next() -> None:
    side = Side(gpus_per_node=8)
    side.add(Seen(nodes=2, gpus=10, bound_gpus=9, running=20), 10.0)
    side.add(Seen(nodes=1, gpus=3, bound_gpus=1, running=2, orphans=1), 5.0)
    side.waits = {"a": 0.0, "b": 1.0, "c": 30.0}
    side.moves = {"w1": 2, "w2": 1}
    report = side.report()
    assert report["node_seconds"] == 25
    assert report["bound_node_seconds"] == 2 * 10 + 1 * 5
    assert report["gpu_seconds"] == 115
    assert report["gpu_seconds_over_bound"] == round(115 / 95, 3)
    assert (report["peak_nodes"], report["peak_gpus"]) == (2, 10)
    assert report["samples_with_a_share_on_an_unheld_gpu"] == 1
    assert (report["wait_p50_seconds"], report["wait_p99_seconds"]) == (1.0, 30.0)
    assert (report["pods_moved"], report["most_moves_of_a_workload"]) == (3, 2)


def test_the_comparison_is_against_the_whole_gpu_run() -> None:
    gpupack, whole = Side(8), Side(8)
    gpupack.add(Seen(1, 4, 3, 6), 100.0)
    whole.add(Seen(2, 6, 6, 6), 100.0)
    figures = compare(gpupack, whole)
    assert figures["gpupack_over_whole_node_seconds"] == 0.5
    assert figures["gpupack_over_whole_gpu_seconds"] == round(4 / 6, 3)


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
