"""Usage sources: the real exporter's text parsed, real exporters scraped over HTTP beside
broken targets, and Prometheus's query API answered by a local server."""

import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporter import exposition, server
from exporter.cgroup import HOST, OwnerKind, ProcessOwner
from exporter.collector import ExporterCollector, Scrape
from exporter.pods import PodInfo
from exporter.readings import ProcessUsage, Readings
from gpupack.runtime.httpserver import Server
from recommender.usage import (
    Collected,
    ExporterScraper,
    PodUsage,
    PrometheusSource,
    exporter_targets,
    parse_exporter_metrics,
    parse_prometheus_vector,
)
from tests.exporter.test_collector import (
    CONTAINER_A,
    CONTAINER_B,
    GIB,
    GPU0,
    GPU1,
    TRAINER,
    pod,
    reading,
)

Row = tuple[str, str, float | None, int | None]

WORKER = pod("uid-worker", "worker-1", namespace="nlp", containers={CONTAINER_A: "app"})
TWIN = pod("uid-twin", "trainer-0", namespace="nlp", containers={CONTAINER_A: "main"})
BUILDER = pod("uid-builder", "notebook-0", namespace="lab", containers={CONTAINER_B: "lab"})

Process = tuple[str, PodInfo | None, str, float | None, int | None]


def node(*processes: Process) -> Scrape:
    """A node's scrape from (gpu, pod or None for a host process, container ID, compute,
    memory) per process, through the exporter's own collector types."""
    by_gpu: dict[str, list[ProcessUsage]] = {}
    owners: dict[int, ProcessOwner] = {}
    pods: dict[str, PodInfo] = {}
    for pid, (gpu, owner, container, compute, memory) in enumerate(processes, start=100):
        by_gpu.setdefault(gpu, []).append(ProcessUsage(pid=pid, memory=memory, compute=compute))
        if owner is None:
            owners[pid] = HOST
        else:
            owners[pid] = ProcessOwner(OwnerKind.POD, owner.uid, container)
            pods[owner.uid] = owner
    gpus = tuple(
        reading(uuid, index, *used) for index, (uuid, used) in enumerate(sorted(by_gpu.items()))
    )
    return Scrape(Readings(gpus=gpus, nvml_up=True, window=15.0), owners, pods)


def registry_of(scrape: Scrape) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(ExporterCollector(lambda: scrape))
    return registry


def exporter_text(scrape: Scrape) -> str:
    """`/metrics` exactly as the exporter's server writes it."""
    return exposition.text(registry_of(scrape)).decode()


def rows(usage: Collected | list[PodUsage]) -> list[Row]:
    found = usage.usage if isinstance(usage, Collected) else usage
    return [
        (u.namespace, u.pod, None if u.compute is None else round(u.compute, 9), u.memory)
        for u in found
    ]


# --- parse_exporter_metrics ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            exporter_text(
                node(
                    (GPU0, TRAINER, CONTAINER_A, 0.25, 6 * GIB),
                    (GPU0, TRAINER, CONTAINER_A, 0.05, 2 * GIB),
                    (GPU0, TRAINER, CONTAINER_B, 0.10, 1 * GIB),
                    (GPU1, TRAINER, CONTAINER_A, 0.20, 3 * GIB),
                    (GPU1, WORKER, CONTAINER_A, 0.40, 2 * GIB),
                    (GPU1, None, "", 0.30, 5 * GIB),  # a host process: charged to no pod
                )
            ),
            [("ml", "trainer-0", 0.6, 12 * GIB), ("nlp", "worker-1", 0.4, 2 * GIB)],
            id="containers-and-gpus-of-a-pod-are-summed-and-host-use-is-ignored",
        ),
        pytest.param(
            exporter_text(node((GPU0, WORKER, CONTAINER_A, None, 4 * GIB))),
            [("nlp", "worker-1", None, 4 * GIB)],
            id="a-pod-without-per-process-compute-has-memory-only",
        ),
        pytest.param(
            exporter_text(
                node((GPU0, TRAINER, CONTAINER_A, 0.5, GIB), (GPU0, TWIN, CONTAINER_A, 0.25, GIB))
            ),
            [("ml", "trainer-0", 0.5, GIB), ("nlp", "trainer-0", 0.25, GIB)],
            id="pods-of-one-name-in-two-namespaces-stay-apart",
        ),
        pytest.param(exporter_text(node()), [], id="a-node-without-gpu-use-has-no-pods"),
        pytest.param("", [], id="an-empty-page-has-no-pods"),
        pytest.param(
            "# TYPE gpupack_pod_gpu_compute_ratio gauge\n"
            'gpupack_pod_gpu_compute_ratio{container="a",gpu="g",namespace="ml",pod="p"} NaN\n'
            'gpupack_pod_gpu_compute_ratio{container="b",gpu="g",namespace="ml",pod="p"} 0.5\n'
            "# TYPE gpupack_pod_gpu_compute_allocated_ratio gauge\n"
            'gpupack_pod_gpu_compute_allocated_ratio{gpu="g",namespace="ml",pod="p"} 0.9\n'
            'other_metric{namespace="ml",pod="q"} 7\n',
            [("ml", "p", 0.5, None)],
            id="nan-samples-and-other-series-are-ignored",
        ),
    ],
)
def test_exporter_metrics_are_summed_per_pod(text: str, expected: list[Row]) -> None:
    assert rows(parse_exporter_metrics(text)) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("<html><body>502 Bad Gateway</body></html>", id="an-html-page"),
        pytest.param(
            'gpupack_pod_gpu_compute_ratio{namespace="ml",pod="p"} lots\n', id="a-word-for-a-value"
        ),
        pytest.param(
            'gpupack_pod_gpu_compute_ratio{namespace="ml",pod="p" 1\n', id="an-unclosed-label-set"
        ),
        pytest.param(
            'gpupack_pod_gpu_memory_used_bytes{namespace="ml"} 1024\n',
            id="a-use-series-without-its-pod-label",
        ),
    ],
)
def test_text_that_is_not_exporter_metrics_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="^not Prometheus metrics: .+"):
        parse_exporter_metrics(text)


# --- exporter_targets ----------------------------------------------------------------


def exporter_pod(
    ip: str | None, *, phase: str = "Running", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"gpupack-exporter-{ip}", "namespace": "gpupack-system"}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param(
            [exporter_pod("10.0.0.9"), exporter_pod("10.0.0.10")],
            ["http://10.0.0.10:9400/metrics", "http://10.0.0.9:9400/metrics"],
            id="running-pods-sorted",
        ),
        pytest.param(
            [exporter_pod("10.0.0.9", phase=phase) for phase in ("Pending", "Succeeded", "Failed")],
            [],
            id="only-running-pods",
        ),
        pytest.param([exporter_pod("10.0.0.9", deleting=True)], [], id="not-pods-being-deleted"),
        pytest.param(
            [exporter_pod(None), exporter_pod(""), exporter_pod("not-an-ip")],
            [],
            id="not-pods-without-a-valid-ip",
        ),
        pytest.param(
            [exporter_pod("fd00:0::a")], ["http://[fd00::a]:9400/metrics"], id="ipv6-in-brackets"
        ),
        pytest.param(
            [exporter_pod("10.0.0.9"), exporter_pod("10.0.0.9")],
            ["http://10.0.0.9:9400/metrics"],
            id="duplicates-once",
        ),
        pytest.param([{}, {"status": None}], [], id="pods-without-status"),
    ],
)
def test_exporter_targets_are_running_exporters_by_pod_ip(
    pods: list[dict[str, Any]], expected: list[str]
) -> None:
    assert exporter_targets(pods, 9400) == expected


@pytest.mark.parametrize("port", [pytest.param(0, id="zero"), pytest.param(65536, id="too-high")])
def test_exporter_port_out_of_range_is_an_error(port: int) -> None:
    with pytest.raises(ValueError, match=f"exporter port {port}"):
        exporter_targets([exporter_pod("10.0.0.9")], port)


# --- local HTTP servers --------------------------------------------------------------


@contextmanager
def serving(http: ThreadingHTTPServer | Server) -> Iterator[str]:
    """Serve in a thread; yield `http://127.0.0.1:<port>`."""
    if isinstance(http, Server):
        http.start()
        try:
            yield f"http://127.0.0.1:{http.port}"
        finally:
            http.close()
        return
    http.daemon_threads = True
    # A short poll interval: shutdown() waits for the serving loop's next poll.
    thread = threading.Thread(target=http.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}"
    finally:
        http.shutdown()
        http.server_close()
        thread.join()


Answer = Callable[[BaseHTTPRequestHandler], tuple[int, bytes]]


def answering(answer: Answer) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answer(self)
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def exporter_server(scrape: Scrape) -> Server:
    """The exporter's real HTTP server over the exporter's real collector."""
    return server.make_server("127.0.0.1", 0, registry_of(scrape), lambda: (True, {}))


def refused_url(path: str = "/metrics") -> str:
    """A port nothing listens on (it was just free)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


# --- ExporterScraper -----------------------------------------------------------------


def test_scraper_counts_good_exporters_and_names_each_failed_target() -> None:
    with ExitStack() as stack:
        first = stack.enter_context(
            serving(
                exporter_server(
                    node(
                        (GPU0, TRAINER, CONTAINER_A, 0.25, 6 * GIB),
                        (GPU1, TRAINER, CONTAINER_B, 0.5, 2 * GIB),
                    )
                )
            )
        )
        second = stack.enter_context(
            serving(
                exporter_server(
                    node(
                        (GPU0, WORKER, CONTAINER_A, 0.4, GIB),
                        (GPU0, BUILDER, CONTAINER_B, None, 3 * GIB),
                    )
                )
            )
        )
        garbage = stack.enter_context(serving(answering(lambda _: (200, b"<html>hi</html>"))))
        broken = stack.enter_context(serving(answering(lambda _: (500, b"scrape failed\n"))))
        refused = refused_url()
        targets = [
            f"{first}/metrics",
            refused,
            f"{garbage}/metrics",
            f"{second}/metrics",
            f"{broken}/metrics",
        ]
        scraper = stack.enter_context(ExporterScraper(lambda: targets, timeout=5.0, workers=3))

        collected = scraper.collect()

    assert rows(collected) == [
        ("lab", "notebook-0", None, 3 * GIB),
        ("ml", "trainer-0", 0.75, 8 * GIB),
        ("nlp", "worker-1", 0.4, GIB),
    ]
    assert collected.targets == 5
    refused_error, garbage_error, broken_error = collected.errors
    assert refused_error == f"{refused}: connection refused"
    assert garbage_error.startswith(f"{garbage}/metrics: not Prometheus metrics: ")
    assert broken_error == f"{broken}/metrics: HTTP 500 Internal Server Error"


def test_a_pod_in_two_targets_keeps_the_sum() -> None:
    with ExitStack() as stack:
        targets = [
            stack.enter_context(serving(exporter_server(scrape))) + "/metrics"
            for scrape in (
                node((GPU0, WORKER, CONTAINER_A, 0.25, GIB)),
                node((GPU1, WORKER, CONTAINER_A, 0.5, 2 * GIB)),
            )
        ]
        scraper = stack.enter_context(ExporterScraper(lambda: targets))
        collected = scraper.collect()

    assert rows(collected) == [("nlp", "worker-1", 0.75, 3 * GIB)]
    assert collected.errors == ()


def test_an_exporter_that_does_not_answer_times_out() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/metrics"
        with ExporterScraper(lambda: [url], timeout=0.2) as scraper:
            collected = scraper.collect()

    assert collected == Collected((), (f"{url}: timed out after 0.2s",), 1)


def trickling(body_bytes: int, pause: float) -> ThreadingHTTPServer:
    """Answers 200 at once, then sends its body one byte per `pause` seconds."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(body_bytes))
            self.end_headers()
            try:
                for _ in range(body_bytes):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(pause)
            except OSError:
                pass  # the scraper gave up

        def log_message(self, format: str, *args: object) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def test_an_exporter_that_trickles_times_out_in_all() -> None:
    with (
        serving(trickling(100, 0.02)) as url,
        ExporterScraper(lambda: [f"{url}/metrics"], timeout=0.3) as scraper,
    ):
        collected = scraper.collect()

    assert collected == Collected((), (f"{url}/metrics: timed out after 0.3s",), 1)


def test_an_answer_too_large_is_refused() -> None:
    big = exporter_text(node(*[(GPU0, WORKER, CONTAINER_A, 0.01, GIB)] * 30))
    assert len(big) > 1000
    with (
        serving(answering(lambda _: (200, big.encode()))) as url,
        ExporterScraper(lambda: [f"{url}/metrics"], max_body=1000) as scraper,
    ):
        collected = scraper.collect()

    assert collected.errors == (f"{url}/metrics: response larger than 1000 bytes",)


def test_targets_are_asked_again_on_every_collect() -> None:
    targets: list[str] = []
    with (
        serving(exporter_server(node((GPU0, WORKER, CONTAINER_A, 0.5, GIB)))) as url,
        ExporterScraper(lambda: targets) as scraper,
    ):
        assert scraper.describe() == "0 exporters"
        assert scraper.collect() == Collected((), (), 0)
        targets.extend([f"{url}/metrics", f"{url}/metrics"])
        assert scraper.describe() == "1 exporter"
        assert rows(scraper.collect()) == [("nlp", "worker-1", 0.5, GIB)]


def test_a_closed_scraper_collects_no_more() -> None:
    scraper = ExporterScraper(lambda: [refused_url()])
    scraper.close()
    with pytest.raises(RuntimeError, match="shutdown"):
        scraper.collect()


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("file:///etc/passwd", id="file"),
        pytest.param("ftp://127.0.0.1/metrics", id="ftp"),
    ],
)
def test_scraper_opens_only_http_urls(url: str) -> None:
    with ExporterScraper(lambda: [url]) as scraper:
        collected = scraper.collect()
    assert collected.usage == ()
    assert collected.errors == (f"{url}: unknown url type: {url.partition(':')[0]}",)


# --- PrometheusSource ----------------------------------------------------------------


def vector(*series: tuple[str, str, str]) -> dict[str, Any]:
    result = [
        {"metric": {"namespace": ns, "pod": name}, "value": [1735689600.123, value]}
        for ns, name, value in series
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


@dataclass
class FakePrometheus:
    """Answers `/prom/api/v1/query` by the metric its query names; records requests."""

    compute: tuple[int, bytes] = (200, json.dumps(vector()).encode())
    memory: tuple[int, bytes] = (200, json.dumps(vector()).encode())
    queries: list[str] = field(default_factory=list)
    authorization: list[str | None] = field(default_factory=list)

    def answer(self, request: BaseHTTPRequestHandler) -> tuple[int, bytes]:
        path, _, query = request.path.partition("?")
        if path != "/prom/api/v1/query":
            return 404, b"not found"
        params = urllib.parse.parse_qs(query)
        self.queries.append(params["query"][0])
        self.authorization.append(request.headers.get("Authorization"))
        assert params["timeout"] == ["10s"]
        return self.compute if "compute_ratio" in params["query"][0] else self.memory


@pytest.fixture
def prometheus() -> Iterator[tuple[FakePrometheus, str]]:
    fake = FakePrometheus()
    with serving(answering(fake.answer)) as url:
        yield fake, url + "/prom/"


def test_prometheus_answers_are_merged_per_pod(
    prometheus: tuple[FakePrometheus, str], tmp_path: Path
) -> None:
    fake, url = prometheus
    fake.compute = (
        200,
        json.dumps(
            vector(("ml", "trainer-0", "0.6"), ("nlp", "worker-1", "0.4"), ("ml", "gone", "NaN"))
        ).encode(),
    )
    fake.memory = (
        200,
        json.dumps(vector(("ml", "trainer-0", str(12 * GIB)), ("ml", "idle", str(GIB)))).encode(),
    )
    token = tmp_path / "token"
    token.write_text("first-token\n")
    source = PrometheusSource(url, window_seconds=300, bearer_token_file=str(token))

    collected = source.collect()

    assert rows(collected) == [
        ("ml", "idle", None, GIB),
        ("ml", "trainer-0", 0.6, 12 * GIB),
        ("nlp", "worker-1", 0.4, None),
    ]
    assert (collected.errors, collected.targets) == ((), 1)
    compute, memory = fake.queries
    assert "sum by (namespace, pod)" in compute
    assert "avg_over_time(gpupack_pod_gpu_compute_ratio[300s])" in compute
    assert "sum by (namespace, pod)" in memory
    assert "max_over_time(gpupack_pod_gpu_memory_used_bytes[300s])" in memory
    assert fake.authorization == ["Bearer first-token"] * 2
    assert source.describe() == f"Prometheus at {url.rstrip('/')}"

    token.write_text("rotated-token")  # a projected token rotates: read on every collect
    source.collect()
    assert fake.authorization[2:] == ["Bearer rotated-token"] * 2


def test_prometheus_without_a_token_file_sends_no_authorization(
    prometheus: tuple[FakePrometheus, str],
) -> None:
    fake, url = prometheus
    assert PrometheusSource(url, window_seconds=60).collect() == Collected((), (), 1)
    assert fake.authorization == [None, None]


def error_json(kind: str, message: str) -> bytes:
    return json.dumps({"status": "error", "errorType": kind, "error": message}).encode()


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        pytest.param(
            (400, error_json("bad_data", "1:5: parse error: unexpected character")),
            "Prometheus error bad_data: 1:5: parse error: unexpected character",
            id="prometheus-rejects-the-query",
        ),
        pytest.param(
            (503, error_json("timeout", "query timed out in expression evaluation")),
            "Prometheus error timeout: query timed out in expression evaluation",
            id="prometheus-times-out",
        ),
        pytest.param(
            (200, error_json("execution", "many-to-many matching not allowed")),
            "Prometheus error execution: many-to-many matching not allowed",
            id="an-error-with-status-200",
        ),
        pytest.param(
            (502, b"<html>Bad Gateway</html>"),
            "HTTP 502 Bad Gateway",
            id="a-proxy-in-front-fails",
        ),
        pytest.param(
            (200, b"<html>login</html>"),
            "Prometheus answer is not JSON: Expecting value: line 1 column 1 (char 0)",
            id="not-json",
        ),
        pytest.param(
            (200, json.dumps({"status": "success", "data": {"resultType": "matrix"}}).encode()),
            "Prometheus answer: expected a vector, got 'matrix'",
            id="not-a-vector",
        ),
    ],
)
def test_a_failed_prometheus_query_is_an_error_not_an_exception(
    prometheus: tuple[FakePrometheus, str], answer: tuple[int, bytes], reason: str
) -> None:
    fake, url = prometheus
    fake.compute = fake.memory = answer

    collected = PrometheusSource(url, window_seconds=60).collect()

    where = f"Prometheus at {url.rstrip('/')}"
    assert collected == Collected(
        (), (f"{where}: compute query: {reason}; memory query: {reason}",), 1
    )


def test_when_one_query_fails_the_other_still_counts(
    prometheus: tuple[FakePrometheus, str],
) -> None:
    fake, url = prometheus
    fake.compute = (200, json.dumps(vector(("ml", "trainer-0", "0.25"))).encode())
    fake.memory = (503, b"unavailable")

    collected = PrometheusSource(url, window_seconds=60).collect()

    assert rows(collected) == [("ml", "trainer-0", 0.25, None)]
    assert collected.errors == (
        f"Prometheus at {url.rstrip('/')}: memory query: HTTP 503 Service Unavailable",
    )


def test_unreachable_prometheus_is_an_error() -> None:
    url = refused_url("")
    collected = PrometheusSource(url, window_seconds=60, timeout=2).collect()
    assert collected == Collected(
        (),
        (
            f"Prometheus at {url}: compute query: connection refused; "
            "memory query: connection refused",
        ),
        1,
    )


def test_an_unreadable_token_file_is_an_error_and_nothing_is_asked(
    prometheus: tuple[FakePrometheus, str], tmp_path: Path
) -> None:
    fake, url = prometheus
    missing, empty = tmp_path / "missing", tmp_path / "empty"
    empty.write_text("\n")
    where = f"Prometheus at {url.rstrip('/')}"

    for path, reason in ((missing, "No such file or directory"), (empty, "it is empty")):
        collected = PrometheusSource(url, window_seconds=60, bearer_token_file=str(path)).collect()
        assert collected == Collected((), (f"{where}: bearer token file {path}: {reason}",), 1)
    assert fake.queries == []


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        pytest.param("", "expected http", id="empty"),
        pytest.param("prometheus:9090", "expected http", id="no-scheme"),
        pytest.param("ftp://prometheus:9090", "expected http", id="not-http"),
        pytest.param("http://", "expected http", id="no-host"),
        pytest.param("http://prometheus:port", "Port could not be cast", id="bad-port"),
        pytest.param("http://prometheus:9090/?x=1", "no query or fragment", id="a-query"),
    ],
)
def test_a_bad_prometheus_url_is_refused_by_name(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"Prometheus URL {url!r}: ") + ".*" + reason):
        PrometheusSource(url, window_seconds=60)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://prometheus.monitoring:9090", id="in-cluster"),
        pytest.param("https://thanos.example.com/prometheus/", id="https-with-a-path"),
        pytest.param("http://[fd00::1]:9090", id="ipv6"),
    ],
)
def test_a_good_prometheus_url_is_accepted(url: str) -> None:
    assert PrometheusSource(url, window_seconds=60).describe() == f"Prometheus at {url.rstrip('/')}"


@pytest.mark.parametrize("window", [pytest.param(0, id="zero"), pytest.param(-5, id="negative")])
def test_a_window_below_one_second_is_refused(window: int) -> None:
    with pytest.raises(ValueError, match="Prometheus window"):
        PrometheusSource("http://prometheus:9090", window_seconds=window)


# --- parse_prometheus_vector ---------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param(vector(), {}, id="empty"),
        pytest.param(
            vector(("ml", "a", "0.5"), ("ml", "b", "1e9"), ("nlp", "a", "0")),
            {("ml", "a"): 0.5, ("ml", "b"): 1e9, ("nlp", "a"): 0.0},
            id="series",
        ),
        pytest.param(
            vector(("ml", "a", "NaN"), ("ml", "b", "+Inf"), ("ml", "c", "-Inf")),
            {},
            id="nan-and-infinities-skipped",
        ),
    ],
)
def test_prometheus_vector_by_namespace_and_pod(
    payload: dict[str, Any], expected: dict[tuple[str, str], float]
) -> None:
    assert parse_prometheus_vector(payload) == expected


def with_result(*result: object) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": list(result)}}


GOOD_METRIC = {"namespace": "ml", "pod": "a"}


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        pytest.param([], "Prometheus answer: expected a JSON object", id="not-an-object"),
        pytest.param(
            {"status": "error", "errorType": "bad_data", "error": "invalid parameter"},
            "Prometheus error bad_data: invalid parameter",
            id="prometheus-error",
        ),
        pytest.param(
            {"data": {}}, "Prometheus answer: expected status success, got None", id="no-status"
        ),
        pytest.param(
            {"status": "success"}, "Prometheus answer: expected data to be a dict", id="no-data"
        ),
        pytest.param(
            {"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}},
            "Prometheus answer: expected a vector, got 'scalar'",
            id="a-scalar",
        ),
        pytest.param(
            {"status": "success", "data": {"resultType": "vector", "result": {}}},
            "Prometheus answer: expected result to be a list",
            id="result-not-a-list",
        ),
        pytest.param(with_result("a"), "Prometheus result 0: expected an object", id="not-series"),
        pytest.param(
            with_result({"value": [1, "1"]}),
            "Prometheus result 0: expected metric to be a dict",
            id="no-metric",
        ),
        pytest.param(
            with_result({"metric": {"namespace": "ml"}, "value": [1, "1"]}),
            "Prometheus result 0: expected namespace and pod labels",
            id="no-pod-label",
        ),
        pytest.param(
            with_result({"metric": GOOD_METRIC}),
            'Prometheus result 0: expected value [timestamp, "number"], got None',
            id="no-value",
        ),
        pytest.param(
            with_result({"metric": GOOD_METRIC, "value": [1, 0.5]}),
            'Prometheus result 0: expected value [timestamp, "number"]',
            id="a-number-not-a-string",
        ),
        pytest.param(
            with_result({"metric": GOOD_METRIC, "value": ["now", "1"]}),
            'Prometheus result 0: expected value [timestamp, "number"]',
            id="a-timestamp-not-a-number",
        ),
        pytest.param(
            with_result({"metric": GOOD_METRIC, "value": [1]}),
            'Prometheus result 0: expected value [timestamp, "number"]',
            id="a-value-without-its-number",
        ),
        pytest.param(
            with_result({"metric": GOOD_METRIC, "value": [1, "lots"]}),
            "Prometheus result 0: value 'lots' is not a number",
            id="not-a-number",
        ),
        pytest.param(
            with_result(
                {"metric": GOOD_METRIC, "value": [1, "1"]},
                {"metric": GOOD_METRIC, "value": [1, "2"]},
            ),
            "Prometheus result 1: ml/a appears twice",
            id="a-series-twice",
        ),
    ],
)
def test_malformed_prometheus_answer_names_what_is_wrong(payload: object, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_prometheus_vector(payload)
