"""A real Prometheus scrapes gpupack on the local cluster as the chart's ServiceMonitor
says, and every query the dashboard and the alerts make works on those live metrics.

The webhook, the scheduler and the recommender are the real processes; one GPU node's
exporter runs in this process over a fake NVML (tests/integration/fakenode.py). Two
workloads give every panel something to show: `hungry` uses more compute and memory
than it was allocated, `idle` almost none of its allocation; a host process uses one
GPU outside any pod.

Every panel query (Grafana's variables filled in as "All" and a range) must answer
without error and with at least one series. An alert expression is quiet on a healthy
cluster, so each must evaluate without error, every metric it reads must have series,
and every label its `by`/`on` clauses name must be on them: a renamed metric or label
fails here, not silently in production.
"""

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from doubles.nvml import GiB
from gpupack import keys
from hack.localcluster import CHART_DIR, EXPORTER_NAME, Kube, LocalCluster
from hack.localcluster.prometheus import Prometheus, QueryError, Target
from tests.integration.fakenode import FakeNode
from tests.integration.scheduling import wait_bound
from tests.integration.workloads import deployment

pytestmark = pytest.mark.integration

NODE = "gpu-a100-2"
ON_NODE = {"kubernetes.io/hostname": NODE}
DASHBOARD = CHART_DIR / "dashboards" / "gpupack.json"
RULES = CHART_DIR / "alerts" / "gpupack.rules.yaml"
GRAFANA = {"$namespace": ".*", "$__range": "2m"}
# Seconds of scrapes that rate() and *_over_time need past the first sample (several
# scrape intervals), before the dashboards' and alerts' queries are judged.
RATE_SCRAPES = 15.0
METRIC = re.compile(r"\bgpupack_[a-z0-9_]+")
GROUPING = re.compile(r"\b(?:by|on|ignoring|without|group_left|group_right)\s*\(([^)]*)\)")

JSON = dict[str, Any]


@pytest.fixture(scope="module")
def prometheus(
    scheduler: LocalCluster, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    cluster = scheduler
    node = FakeNode(cluster, NODE, 8, tmp_path_factory.mktemp("proc"))
    node.start()
    cluster.install_recommender(extra_args=[f"--exporter-url={node.url}", "--interval=1"])
    ns = kube.create_namespace("it-prometheus", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    node.usage["hungry"] = (0.5, 5 * GiB)  # 300m and 4Gi allocated: over both
    node.usage["idle"] = (0.02, GiB // 2)  # 400m and 8Gi allocated: a rightsizing candidate
    node.host_process(0, 61_000, memory=GiB, sm=0.03)
    for app, compute, memory in (("hungry", "300m", "4Gi"), ("idle", "400m", "8Gi")):
        kube.create(
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            deployment(ns, app, 1, compute, memory=memory, node_selector=ON_NODE),
        )
        wait_bound(kube, ns, app, 1)
    exporter = Target(
        cluster.metrics_service("templates/exporter.yaml"), f"{EXPORTER_NAME}-{NODE}", node.port
    )
    running = cluster.start_prometheus(extra=[exporter])
    try:
        kube.wait_for(
            "every target scraped and up",
            lambda: (
                (targets := running.targets())
                and len(targets) == 4
                and all(t["health"] == "up" for t in targets)
            ),
            timeout=60,
        )
        kube.wait_for(
            "the pods' usage in Prometheus",
            lambda: running.query('gpupack_pod_gpu_memory_used_bytes{pod=~"hungry.*"}'),
            timeout=60,
        )
        time.sleep(RATE_SCRAPES)
        yield running
    finally:
        running.stop()
        kube.delete(f"/api/v1/namespaces/{ns}")
        cluster.stop_recommender()
        node.stop()


def panels() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (f"{panel['title']} {target['refId']}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def alerts() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(rule["alert"], rule["expr"]) for group in groups for rule in group["rules"]]


def as_grafana(expr: str) -> str:
    for variable, value in GRAFANA.items():
        expr = expr.replace(variable, value)
    return expr


def test_every_component_is_scraped_with_the_service_monitors_labels(
    prometheus: Prometheus,
) -> None:
    jobs = {t["labels"]["job"] for t in prometheus.targets()}
    assert jobs == {
        "gpupack-webhook",
        "gpupack-scheduler-metrics",
        "gpupack-recommender-metrics",
        "gpupack-exporter",
    }
    # honorLabels: the exporter's own `pod` label names the pod it describes.
    (series, *_) = prometheus.query('gpupack_pod_gpu_memory_used_bytes{pod=~"hungry.*"}')
    assert series["metric"]["namespace"].startswith("it-prometheus")
    assert series["metric"]["job"] == "gpupack-exporter"


@pytest.mark.parametrize(("panel", "expr"), [pytest.param(*p, id=p[0]) for p in panels()])
def test_every_dashboard_query_answers_with_data(
    prometheus: Prometheus, panel: str, expr: str
) -> None:
    try:
        result = prometheus.query(as_grafana(expr))
    except QueryError as error:
        pytest.fail(f"{panel}: {error}\n  {expr}")
    assert result, f"{panel}: no series\n  {expr}"


@pytest.mark.parametrize(("alert", "expr"), [pytest.param(*a, id=a[0]) for a in alerts()])
def test_every_alert_reads_live_metrics_and_labels(
    prometheus: Prometheus, alert: str, expr: str
) -> None:
    try:
        prometheus.query(expr)  # quiet on a healthy cluster, but it must evaluate
    except QueryError as error:
        pytest.fail(f"{alert}: {error}")
    labels: set[str] = set()
    for metric in sorted(set(METRIC.findall(expr))):
        series = prometheus.query(metric)
        assert series, f"{alert}: no series of {metric}"
        labels |= {name for s in series for name in s["metric"]}
    for clause in GROUPING.findall(expr):
        for label in filter(None, (name.strip() for name in clause.split(","))):
            assert label in labels, f"{alert}: no series has the label {label!r}"
