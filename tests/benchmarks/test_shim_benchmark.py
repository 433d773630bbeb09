"""The shim benchmark on a few pairs: it measures both ways, through the shim, with the
pod's other processes holding memory (no timing asserted)."""

import json
from pathlib import Path

from benchmarks.shim import run


def test_the_benchmark_reports_both_ways_and_their_ratio(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    argv = "--pairs 500 --rounds 2 --processes 2 --parallel 2 --kind async --baseline HEAD"
    assert run.main([*argv.split(), "--json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["other_processes"] == 2
    assert len(report["rounds_with"]) == len(report["rounds_without"]) == 2
    assert report["pairs_per_second_with"] > 0
    assert report["pairs_per_second_without"] > 0
    assert report["ratio"] == report["pairs_per_second_with"] / report["pairs_per_second_without"]
    assert report["parallel"] == 2
    assert len(report["rounds_baseline"]) == 2  # HEAD's shim, built from git, beside it
    assert report["pairs_per_second_baseline"] > 0
