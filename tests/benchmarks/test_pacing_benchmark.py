"""The pacing benchmark on a few launches: it measures the three ways and their ratios,
with neighbours on the paced pod's GPU (no timing asserted)."""

import json
from pathlib import Path

from benchmarks.pacing import run


def test_the_benchmark_reports_every_way_and_its_ratio(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    assert run.main(["--launches", "2000", "--rounds", "2", "--json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["neighbours"] == 3
    for way in ("without", "pass-through", "paced"):
        assert len(report[f"rounds_{way}"]) == 2
        assert report[f"launches_per_second_{way}"] > 0
    assert report["ratio_paced"] == (
        report["launches_per_second_paced"] / report["launches_per_second_without"]
    )
