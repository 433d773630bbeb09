"""The recommender benchmark on a tiny cluster: what it reports (no timing)."""

import json
from pathlib import Path

from benchmarks.recommender import run


def test_the_benchmark_reports_a_round_against_parsing_the_same_usage(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"

    code = run.main(
        ["--workloads", "5", "--pods", "3", "--rounds", "5", "--json", str(report_path)]
    )

    assert code == 0
    report = json.loads(report_path.read_text())
    assert (report["workloads"], report["pods"], report["rounds"]) == (5, 15, 5)
    assert report["round_p50_ms"] > 0
    assert report["baseline_parse_p50_ms"] > 0
    assert report["ratio"] > 0
    # One simulated minute per round, a checkpoint every 5 minutes: every workload is
    # written once in 5 rounds.
    assert report["writes_per_round"] == 1.0
    # A week of history stays a small object in etcd.
    assert 200 < report["recommendation_object_bytes"] < 4096
