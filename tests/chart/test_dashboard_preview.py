"""docs/dashboard.png's data path: the simulated scrapes, backfilled into a real
Prometheus TSDB with promtool, answer every query of every drawn panel."""

import json
import os
from pathlib import Path

from hack.dashboard_preview.query import drawn_panels, evaluate, openmetrics, prometheus_over
from hack.dashboard_preview.simulate import DASHBOARD, STEPS, Frame, simulate


def test_every_drawn_panel_query_is_answered_by_prometheus_over_the_simulation() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    bin_dir = Path(os.environ.get("GPUPACK_BIN_DIR", ""))
    assert (bin_dir / "promtool").is_file(), "built by hack/lib/binaries.sh: run hack/test"

    with prometheus_over(simulate(), bin_dir) as prometheus:
        for panel in drawn_panels(dashboard):
            if panel["type"] == "row":
                continue
            results = evaluate(prometheus, panel)
            for target in panel["targets"]:
                lines = results[target["refId"]]
                assert lines, f"{panel['title']!r} {target['refId']}: no series"
                assert all(len(v) == STEPS for v in lines.values())
                assert any(x is not None for v in lines.values() for x in v)


def test_the_openmetrics_text_groups_each_metric_and_ends_with_eof() -> None:
    frame: Frame = {"a_total": [({"x": 'q"uote'}, 1.0)], "b": [({}, 2.5)]}
    text = openmetrics([frame, frame])
    lines = text.splitlines()
    assert lines[0] == "# TYPE a_total unknown"
    assert lines[1].startswith('a_total{x="q\\"uote"} 1.0 ')
    assert lines.index("# TYPE b unknown") == 3  # both samples of a_total before it
    assert lines[-1] == "# EOF"
