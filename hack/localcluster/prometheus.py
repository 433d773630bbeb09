"""A real Prometheus (the pinned build from hack/lib/binaries.sh), started on demand.

For the local cluster it scrapes gpupack's components the way the chart's
ServiceMonitor has prometheus-operator scrape them: one job per Service (the job is
the Service's name, as the operator names it), the endpoint's path, `honorLabels`,
`relabelings` and `metricRelabelings`, and the target labels the operator adds
(`namespace`, `service`, `pod`, `endpoint`, `instance`). There is no kube-proxy and no
pod network here, so targets are the components' local ports instead of endpoints
discovered through the API server; everything after discovery is the same.

`Prometheus.query` and `query_range` are the HTTP API's; an error (a query that does not
parse, a bad function) raises `QueryError` with Prometheus' own message.
"""

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Self

import yaml

from hack.localcluster import chart
from hack.localcluster.processes import Process, free_port

JSON = dict[str, Any]
READY_TIMEOUT: Final = 60.0


class QueryError(Exception):
    """Prometheus refused a query; the message is its own."""


@dataclass(frozen=True, slots=True)
class Target:
    """One component's metrics port, as the endpoint of the chart's metrics Service."""

    service: str  # the chart's Service for the component: prometheus-operator's job
    pod: str
    port: int
    host: str = "127.0.0.1"


def service_monitor_endpoint(helm: Path, namespace: str, sets: Sequence[str] = ()) -> JSON:
    """The one endpoint of the chart's ServiceMonitor, as the chart renders it."""
    rendered = chart.render_chart(
        helm, "templates/metrics.yaml", namespace, ("metrics.serviceMonitor.enabled=true", *sets)
    )
    for doc in yaml.safe_load_all(rendered):
        if doc and doc.get("kind") == "ServiceMonitor":
            (endpoint,) = doc["spec"]["endpoints"]
            result: JSON = endpoint
            return result
    raise LookupError("templates/metrics.yaml renders no ServiceMonitor")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _relabel(rules: Sequence[JSON]) -> list[JSON]:
    """prometheus-operator's RelabelConfig (camelCase) as Prometheus' relabel_config."""
    out = []
    for rule in rules:
        converted = {_snake(k): v for k, v in rule.items()}
        if "source_labels" in converted:
            converted["source_labels"] = list(converted["source_labels"])
        out.append(converted)
    return out


def scrape_configs(
    endpoint: JSON, namespace: str, targets: Sequence[Target], interval: str
) -> list[JSON]:
    """One scrape job per Service, configured from the ServiceMonitor's endpoint."""
    by_service: dict[str, list[Target]] = {}
    for target in targets:
        by_service.setdefault(target.service, []).append(target)
    jobs = []
    for service, members in sorted(by_service.items()):
        job: JSON = {
            "job_name": service,  # the `job` label: the Service's name, as the operator sets it
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "metrics_path": endpoint.get("path", "/metrics"),
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "static_configs": [
                {
                    "targets": [f"{t.host}:{t.port}"],
                    "labels": {
                        "namespace": namespace,
                        "service": service,
                        "pod": t.pod,
                        "endpoint": str(endpoint.get("port", "metrics")),
                    },
                }
                for t in members
            ],
        }
        if endpoint.get("relabelings"):
            job["relabel_configs"] = _relabel(endpoint["relabelings"])
        if endpoint.get("metricRelabelings"):
            job["metric_relabel_configs"] = _relabel(endpoint["metricRelabelings"])
        jobs.append(job)
    return jobs


class Prometheus:
    """`prometheus` serving `config` (or an existing TSDB) from `workdir`, on a free port."""

    def __init__(self, binary: str, workdir: Path, *, name: str = "prometheus") -> None:
        self._binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.process = Process(name, [], workdir / f"{name}.log")
        self.url = f"http://127.0.0.1:{self.port}"

    def start(
        self,
        config: JSON,
        *,
        storage: Path | None = None,
        retention: str = "1d",
        extra_args: Sequence[str] = (),
    ) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.process.args = [
            self._binary,
            f"--config.file={path}",
            f"--storage.tsdb.path={storage or self.workdir / 'data'}",
            f"--storage.tsdb.retention.time={retention}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            *extra_args,
        ]
        self.process.start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._ready():
            if not self.process.alive():
                raise RuntimeError(f"prometheus exited:\n{self.process.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"prometheus not ready in {READY_TIMEOUT}s:\n{self.process.tail()}"
                )
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _ready(self) -> bool:
        try:
            ready = f"{self.url}/-/ready"  # http://127.0.0.1: ours
            with urllib.request.urlopen(ready, timeout=2) as answer:  # noqa: S310
                return bool(answer.status == 200)
        except OSError:
            return False

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 (ours, http)
                body = json.loads(answer.read())
        except urllib.error.HTTPError as error:
            body = json.loads(error.read() or b"{}")
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[JSON]:
        """The instant vector (or scalar, as one sample) of `expr` now or at `at`."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[JSON] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[JSON]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"}
        result: list[JSON] = self._get("/api/v1/query_range", params)["result"]
        return result

    def targets(self) -> list[JSON]:
        result: list[JSON] = self._get("/api/v1/targets", {"state": "active"})["activeTargets"]
        return result
