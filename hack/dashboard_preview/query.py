"""The dashboard's PromQL, run by a real Prometheus over the simulated half hour.

`simulate()` scrapes the exporter's and the scheduler's real collectors; here every
sample is written as OpenMetrics with its timestamp, backfilled into a TSDB with
`promtool tsdb create-blocks-from openmetrics`, and the pinned Prometheus evaluates each
panel's queries over it with `query_range`, as Grafana asks them (`$namespace` = All,
`$__range` = the half hour). What the preview draws is what Prometheus answered.
"""

import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path
from typing import Any

from hack.dashboard_preview.simulate import ROWS, START, STEP, STEPS, Frame, Labels
from hack.localcluster.prometheus import Prometheus

JSON = dict[str, Any]
Results = dict[str, dict[Labels, list[float | None]]]  # refId -> labels -> value per step
BEGIN = START.replace(tzinfo=UTC).timestamp()
END = BEGIN + (STEPS - 1) * STEP
GRAFANA = {"$namespace": ".*", "$__range": f"{(STEPS - 1) * STEP}s"}


def drawn_panels(dashboard: JSON) -> list[JSON]:
    """The panels of the rows in ROWS, top to bottom."""
    row, drawn = "", []
    for panel in sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        row = panel["title"] if panel["type"] == "row" else row
        if row in ROWS:
            drawn.append(panel)
    return drawn


def _label_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics(frames: Sequence[Frame]) -> str:
    """Every sample of every frame, grouped by metric as OpenMetrics requires, each with
    its frame's timestamp (seconds). Types are `unknown`: PromQL does not use them."""
    series: dict[str, list[str]] = {}
    for step, frame in enumerate(frames):
        at = BEGIN + step * STEP
        for name, samples in frame.items():
            lines = series.setdefault(name, [])
            for labels, value in samples:
                text = ",".join(f'{k}="{_label_text(v)}"' for k, v in sorted(labels.items()))
                lines.append(f"{name}{{{text}}} {value!r} {at:.3f}")
    out = []
    for name, lines in sorted(series.items()):
        out.append(f"# TYPE {name} unknown")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"


@contextmanager
def prometheus_over(frames: Sequence[Frame], bin_dir: Path) -> Iterator[Prometheus]:
    """A Prometheus serving a TSDB backfilled with `frames`."""
    with tempfile.TemporaryDirectory(prefix="gpupack-dashboard-") as directory:
        work = Path(directory)
        source, data = work / "samples.om", work / "data"
        source.write_text(openmetrics(frames))
        subprocess.run(  # noqa: S603 (the pinned promtool, fixed arguments)
            [
                str(bin_dir / "promtool"),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(source),
                str(data),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        with Prometheus(str(bin_dir / "prometheus"), work).start(
            {"global": {}}, storage=data, retention="100y"
        ) as prometheus:
            yield prometheus


def as_grafana(expr: str) -> str:
    for variable, value in GRAFANA.items():
        expr = expr.replace(variable, value)
    return expr


def evaluate(prometheus: Prometheus, panel: JSON) -> Results:
    """Each target of `panel`, over the half hour, one value per scrape (None: no sample)."""
    results: Results = {}
    for target in panel["targets"]:
        values: dict[Labels, list[float | None]] = {}
        for series in prometheus.query_range(as_grafana(target["expr"]), BEGIN, END, STEP):
            labels: Labels = tuple(sorted(series["metric"].items()))
            line: list[float | None] = [None] * STEPS
            for at, value in series["values"]:
                line[round((float(at) - BEGIN) / STEP)] = float(value)
            values[labels] = line
        results[target["refId"]] = values
    return results
