"""Connecting to a cluster, the raw HTTP adapter, and the Cluster the server uses.

The adapter is exercised against a tiny local HTTP server that speaks just enough of
the API (lists, a chunked watch stream, create with AlreadyExists, Status errors); the
Cluster's behaviour is checked against the in-memory fake.
"""

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes.config import ConfigException

from gpupack import keys
from gpupack.api import ApiError, Backoff, retry
from gpupack.capacity import capacity_name
from gpupack.kube import JSON
from gpupack.policy import BUILTIN, policy_spec
from gpupack.pool import pool_key, scheduling_metadata
from gpupack.recommendation import Recommendation, list_path, recommendation_object
from tests.fakes import FakeKube, FakeWatch
from webhook.cluster import Cluster, connect, policies_path
from webhook.decision import Demand
from webhook.kube import HttpClient, load_client
from webhook.policies import BUILTIN_POLICIES
from webhook.server import ClusterPort

WAIT = 10.0  # a deadline for background threads, never a measured duration
TOKEN = "test-token"
SPEC: JSON = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}
POOL = pool_key(SPEC)  # type: ignore[arg-type]


def status(code: int, reason: str, message: str) -> JSON:
    return {
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class ApiStub:
    """State of the local API server: stored pods, requests seen, watch control."""

    def __init__(self) -> None:
        self.pods: dict[str, JSON] = {"gpupack-system": {}}
        self.namespaces = [{"metadata": {"name": "ml", "labels": {keys.OPTIMIZE: "enabled"}}}]
        self.requests: list[tuple[str, str, str | None]] = []
        self.watch_events: list[JSON] = []
        self.release_watches = threading.Event()


def handler_for(stub: ApiStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, doc: JSON) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            stub.requests.append(("GET", self.path, self.headers.get("Authorization")))
            if url.path == "/api/v1/forbidden":
                self._send(403, status(403, "Forbidden", "pods is forbidden"))
            elif query.get("watch") == ["true"]:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in stub.watch_events:
                    line = json.dumps(event).encode() + b"\n"
                    self._chunk(line[:10])  # events may be split across chunks
                    self._chunk(line[10:])
                stub.release_watches.wait(WAIT)
                self._chunk(b"")
            else:
                items = stub.namespaces if url.path == "/api/v1/namespaces" else []
                self._send(
                    200, {"kind": "List", "metadata": {"resourceVersion": "7"}, "items": items}
                )

        def do_POST(self) -> None:
            stub.requests.append(("POST", self.path, self.headers.get("Authorization")))
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            name = body["metadata"]["name"]
            stored = stub.pods["gpupack-system"]
            if name in stored:
                self._send(409, status(409, "AlreadyExists", f'pods "{name}" already exists'))
                return
            stored[name] = body
            self._send(201, body)

    return Handler


@pytest.fixture
def stub() -> ApiStub:
    return ApiStub()


@pytest.fixture
def server(stub: ApiStub) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(stub))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    stub.release_watches.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(WAIT)


def write_kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
def client(server: str, tmp_path: Path) -> Iterator[HttpClient]:
    loaded = load_client(str(write_kubeconfig(tmp_path / "config", server)), environ={})
    assert isinstance(loaded, HttpClient)
    yield loaded
    loaded.close()


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Poll `predicate` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def demand(uid: str, compute: int = 300) -> Demand:
    return Demand(uid, POOL, scheduling_metadata(SPEC), compute, 2**30, "ml", "Job/train", False)  # type: ignore[arg-type]


# Finding the cluster.


def test_no_kubeconfig_and_no_service_account_means_no_cluster(tmp_path: Path) -> None:
    assert connect(None, environ={}, home=tmp_path) is None
    assert (
        load_client(None, environ={"KUBECONFIG": str(tmp_path / "missing")}, home=tmp_path) is None
    )


def test_kubeconfig_from_the_environment_or_home_is_used(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", "http://127.0.0.1:1")
    (tmp_path / ".kube").mkdir()
    write_kubeconfig(tmp_path / ".kube" / "config", "http://127.0.0.1:1")

    from_env = load_client(None, environ={"KUBECONFIG": str(path)}, home=tmp_path / "none")
    from_home = load_client(None, environ={}, home=tmp_path)

    assert isinstance(from_env, HttpClient)
    assert isinstance(from_home, HttpClient)
    from_env.close()
    from_home.close()


def test_in_cluster_service_account_is_used_when_the_service_host_is_set(
    tmp_path: Path,
) -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")

    loaded = load_client(None, environ=environ, home=tmp_path, service_account=tmp_path)

    assert isinstance(loaded, HttpClient)
    loaded.close()
    with pytest.raises(ConfigException):  # the host is set but there is no token
        load_client(None, environ=environ, home=tmp_path, service_account=tmp_path / "none")


def test_an_explicit_kubeconfig_that_does_not_load_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"kubeconfig {tmp_path / 'missing'}: ") as raised:
        connect(str(tmp_path / "missing"), environ={}, home=tmp_path)
    assert isinstance(raised.value.__cause__, ConfigException)


# The raw HTTP adapter.


def test_list_returns_the_raw_json_with_the_bearer_token(client: HttpClient, stub: ApiStub) -> None:
    listed = client.list("/api/v1/namespaces", {"labelSelector": "a=b"})

    assert listed["metadata"]["resourceVersion"] == "7"
    assert listed["items"] == stub.namespaces
    method, path, authorization = stub.requests[-1]
    assert (method, authorization) == ("GET", f"Bearer {TOKEN}")
    assert "labelSelector=a%3Db" in path


def test_watch_streams_one_event_per_line(client: HttpClient, stub: ApiStub) -> None:
    stub.watch_events = [
        {"type": "ADDED", "object": {"metadata": {"name": f"p{i}", "resourceVersion": str(i)}}}
        for i in range(3)
    ]
    stub.release_watches.set()

    events = list(client.watch("/api/v1/pods", {"timeoutSeconds": "5"}))

    assert [e["object"]["metadata"]["name"] for e in events] == ["p0", "p1", "p2"]
    assert "watch=true" in stub.requests[-1][1]


def test_closing_a_watch_interrupts_a_blocked_read(client: HttpClient, stub: ApiStub) -> None:
    stub.watch_events = [{"type": "ADDED", "object": {"metadata": {"name": "p0"}}}]
    stream = client.watch("/api/v1/pods", {"timeoutSeconds": "60"})
    seen: list[JSON] = []
    first = threading.Event()

    def consume() -> None:
        for event in stream:
            seen.append(event)
            first.set()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    assert first.wait(WAIT)

    stream.close()
    reader.join(WAIT)

    assert not reader.is_alive()
    assert len(seen) == 1


def test_create_and_already_exists(client: HttpClient, stub: ApiStub) -> None:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {}}

    created = client.create("/api/v1/namespaces/gpupack-system/pods", body)
    with pytest.raises(ApiError) as again:
        client.create("/api/v1/namespaces/gpupack-system/pods", body)

    assert created["metadata"]["name"] == "x"
    assert again.value.status == 409
    assert again.value.already_exists
    assert "already exists" in again.value.message


def test_status_errors_keep_reason_and_message(client: HttpClient) -> None:
    with pytest.raises(ApiError) as error:
        client.list("/api/v1/forbidden", {})

    assert (error.value.status, error.value.reason) == (403, "Forbidden")
    assert error.value.message == "pods is forbidden"
    assert not error.value.retryable


def test_an_unreachable_server_is_a_connection_error(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loaded = load_client(str(write_kubeconfig(tmp_path / "c", f"http://127.0.0.1:{port}")))
    assert isinstance(loaded, HttpClient)

    with pytest.raises(ApiError) as error:
        loaded.list("/api/v1/pods", {})
    loaded.close()

    assert error.value.status == 0
    assert error.value.reason == "ConnectionError"
    assert error.value.retryable


def test_retry_backs_off_boundedly_and_never_retries_a_conflict() -> None:
    sleeps: list[float] = []
    failures = [ApiError(503, "ServiceUnavailable", "")] * 4

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "ok"

    assert retry(flaky, attempts=5, backoff=Backoff(0.1, 0.25), sleep=sleeps.append) == "ok"
    assert sleeps == [0.1, 0.2, 0.25, 0.25]

    def conflict() -> str:
        raise ApiError(409, "AlreadyExists", "exists")

    with pytest.raises(ApiError):
        retry(conflict, attempts=5, sleep=sleeps.append)
    assert len(sleeps) == 4


# The Cluster.


def test_cluster_matches_the_servers_port() -> None:
    port: ClusterPort = Cluster(FakeKube())
    assert not port.synced


def test_cluster_over_http_syncs_and_creates_capacity(
    server: str, tmp_path: Path, stub: ApiStub
) -> None:
    created: list[int] = []
    cluster = connect(
        str(write_kubeconfig(tmp_path / "config", server)), on_capacity_created=created.append
    )
    assert cluster is not None
    cluster.start()
    try:
        assert wait_until(lambda: cluster.synced)
        assert (cluster.namespace("ml") or {})["metadata"]["labels"] == {keys.OPTIMIZE: "enabled"}
        assert cluster.namespace("unknown") is None

        outcome = asyncio.run(cluster.ensure_capacity(demand("uid-1"), dry_run=False))
    finally:
        cluster.stop()

    # The admission is answered before the pod exists; stop() waits for the creation.
    assert outcome.action == "creating"
    assert outcome.created == (capacity_name(POOL, 0),)
    assert list(stub.pods["gpupack-system"]) == [capacity_name(POOL, 0)]
    assert created == [1]
    assert not any(
        i.running
        for i in (
            cluster.namespaces,
            cluster.capacity_pods,
            cluster.fractional_pods,
            cluster.gpupolicies,
            cluster.gpurecommendations,
        )
    )
    listed = {path for verb, path, _ in stub.requests if verb == "GET" and "watch" not in path}
    assert {urlsplit(path).path for path in listed} >= {
        "/apis/gpupack.io/v1alpha1/namespaces/gpupack-system/gpupolicies",
        "/apis/gpupack.io/v1alpha1/gpurecommendations",
    }


def test_ensure_capacity_answers_on_the_event_loop_and_creates_in_the_background() -> None:
    kube = FakeKube()
    threads: list[str] = []
    kube.before_create = lambda _: threads.append(threading.current_thread().name)
    cluster = Cluster(kube)
    cluster.start()
    try:
        assert cluster.capacity_pods.wait_synced(WAIT)
        assert cluster.fractional_pods.wait_synced(WAIT)

        async def admit() -> list[str]:
            first = await cluster.ensure_capacity(demand("uid-1"), dry_run=False)
            second = await cluster.ensure_capacity(demand("uid-2"), dry_run=False)
            dry = await cluster.ensure_capacity(demand("uid-3", compute=900), dry_run=True)
            return [first.action, second.action, dry.action]

        actions = asyncio.run(admit())
    finally:
        cluster.stop()  # waits for the background creation

    # The second pod counts the GPU the first one claimed; the dry run claims nothing.
    assert actions == ["creating", "sufficient", "dry-run"]
    assert len(threads) == 1
    assert threads[0].startswith("capacity")
    assert kube.count("create") == 1


# GPUPolicy objects and GPURecommendations.


class RoutingKube:
    """The in-memory API with the two gpupack.io collections the webhook watches: each is
    served by a FakeKube of its own, under that fake's pods path, so its objects get the
    fake's resourceVersions, watch history and events."""

    def __init__(self) -> None:
        self.core = FakeKube()
        self.policies = FakeKube()
        self.recommendations = FakeKube()
        self._routes = {
            policies_path(keys.SYSTEM_NAMESPACE): (self.policies, "/api/v1/pods"),
            list_path(): (self.recommendations, "/api/v1/pods"),
        }

    def _route(self, path: str) -> tuple[FakeKube, str]:
        return self._routes.get(path, (self.core, path))

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        kube, routed = self._route(path)
        return kube.list(routed, params)

    def watch(self, path: str, params: Mapping[str, str]) -> FakeWatch:
        kube, routed = self._route(path)
        return kube.watch(routed, params)

    def create(self, path: str, body: JSON) -> JSON:
        return self.core.create(path, body)

    def close(self) -> None:
        for kube in (self.core, self.policies, self.recommendations):
            kube.close()


def gpupolicy(name: str, **spec: Any) -> JSON:
    fields = {**policy_spec(BUILTIN[name]), **spec}
    meta = {"name": name, "namespace": keys.SYSTEM_NAMESPACE}
    return {
        "apiVersion": "gpupack.io/v1alpha1",
        "kind": "GPUPolicy",
        "metadata": meta,
        "spec": fields,
    }


def recommendation(compute: int, name: str = "web") -> JSON:
    rec = Recommendation("ml", "Deployment", name, "near-real-time", compute, 2**30, 0.5, "", "")
    return recommendation_object(rec, {})


def recommended_compute(cluster: Cluster) -> int | None:
    found = cluster.recommendation("ml", "Deployment", "web")
    return None if found is None else found.compute


def test_cluster_keeps_the_policies_and_recommendations_current() -> None:
    kube = RoutingKube()
    kube.policies.put(gpupolicy("batch", initialCompute="300m"))
    kube.recommendations.put(recommendation(250))
    cluster = Cluster(kube)
    assert cluster.policies == BUILTIN_POLICIES  # before the first list
    assert cluster.recommendation("ml", "Deployment", "web") is None
    cluster.start()
    try:
        assert wait_until(lambda: cluster.synced)
        assert cluster.policies.policies["batch"].initial_compute == 300
        assert recommended_compute(cluster) == 250

        kube.policies.put(gpupolicy("batch", initialCompute="200m"))
        assert wait_until(lambda: cluster.policies.policies["batch"].initial_compute == 200)
        kube.policies.put(gpupolicy("batch", percentile="high"))
        assert wait_until(lambda: "batch" in cluster.policies.invalid)
        assert cluster.policies.policies["batch"] == BUILTIN["batch"]

        kube.recommendations.put(recommendation(400))
        assert wait_until(lambda: recommended_compute(cluster) == 400)
        kube.recommendations.delete("pods", "ml", "deployment-web")
        assert wait_until(lambda: recommended_compute(cluster) is None)
    finally:
        cluster.stop()


def test_cluster_is_not_synced_while_a_gpupack_collection_cannot_be_listed() -> None:
    kube = RoutingKube()
    kube.policies.fail("list", ApiError(403, "Forbidden", "gpupolicies is forbidden"), times=1000)
    cluster = Cluster(kube)
    cluster.start()
    try:
        assert cluster.namespaces.wait_synced(WAIT)
        assert cluster.gpurecommendations.wait_synced(WAIT)
        assert wait_until(lambda: "forbidden" in cluster.gpupolicies.error)
        assert not cluster.synced
    finally:
        cluster.stop()
