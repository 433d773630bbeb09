"""The webhook over real HTTPS: uvicorn (uvloop, httptools) with our TLS context in a
thread, an httpx client that verifies the test CA, and the metrics port over plain HTTP."""

import asyncio
import base64
import copy
import io
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import kubernetes_validate
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from doubles.pods import namespace, review, vllm_pod
from gpupack import keys, seal
from gpupack.objects import JSON
from gpupack.policy import BUILTIN, PolicySet, effective_policies, policy_spec
from gpupack.recommendation import Recommendation
from gpupack.runtime.api import ApiError
from gpupack.runtime.endpoints import ANY, listen_family, listening_socket
from hack.localcluster.processes import free_port
from webhook.app import ClusterPort, Decide, create_app
from webhook.audit import AUDIT_MARKER, AuditLog
from webhook.decision import CapacityOutcome, Decision, Demand, Outcome, Reason
from webhook.metrics import WebhookMetrics, start_metrics_server
from webhook.mutate import MutationContext, process_key
from webhook.policies import BUILTIN_POLICIES
from webhook.review import MAX_BODY_BYTES, AdmissionRequest
from webhook.serve import build_uvicorn_config, serve
from webhook.tls import CertificateReloader

from .conftest import CertificateAuthority, ServingFiles, run_server
from .hostile import no_cluster_env, serve_command

IPV6 = listen_family(ANY)[0] == socket.AF_INET6

KUBERNETES_VERSION = "1.34"


def cpu_pod() -> JSON:
    pod = vllm_pod()
    del pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    del pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
    return pod


@dataclass
class FakeCluster:
    """A ClusterPort in memory: namespaces by name, policies, recommendations by
    (namespace, kind, name), a scripted capacity answer."""

    namespaces: dict[str, JSON] = field(default_factory=dict)
    policies: PolicySet = BUILTIN_POLICIES
    recommendations: dict[tuple[str, str, str], Recommendation] = field(default_factory=dict)
    capacity: Callable[[Demand, bool], CapacityOutcome] | None = None
    synced: bool = True
    calls: list[tuple[Demand, bool]] = field(default_factory=list)
    lifecycle: list[str] = field(default_factory=list)
    live: dict[str, JSON | Exception | None] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)
    server_time: float | None = None  # the API server's clock; None: this machine's

    def now(self) -> float:
        return time.time() if self.server_time is None else self.server_time

    def namespace(self, name: str) -> JSON | None:
        return self.namespaces.get(name)

    def read_namespace(self, name: str) -> JSON | None:
        """The API server's Namespace: `live` where a test set it, else the cache's; a
        `live` of ApiError is raised (the API server cannot be reached)."""
        self.reads.append(name)
        answer = self.live.get(name, self.namespaces.get(name))
        if isinstance(answer, Exception):
            raise answer
        return answer

    def recommendation(self, namespace: str, kind: str, name: str) -> Recommendation | None:
        return self.recommendations.get((namespace, kind, name))

    def plan_capacity(self, demand: Demand, dry_run: bool) -> CapacityOutcome:
        self.calls.append((demand, dry_run))
        if self.capacity is not None:
            return self.capacity(demand, dry_run)
        return CapacityOutcome("sufficient")

    def start(self) -> None:
        self.lifecycle.append("start")

    def stop(self) -> None:
        self.lifecycle.append("stop")


@dataclass
class Webhook:
    client: httpx.Client
    metrics_url: str
    audit: io.StringIO

    def post(self, doc: Any) -> httpx.Response:
        return self.client.post("/mutate", json=doc)

    def admit(self, pod: JSON, uid: str = "req-1", dry_run: bool = False) -> JSON:
        """The answer to one admission, once the webhook has also written its audit line
        (and so counted it: the line is the last thing an admission does after its answer)."""
        lines = len(self.audit_lines())
        response = self.post(review(pod, uid=uid, dry_run=dry_run))
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/json"
        answer: JSON = response.json()["response"]
        assert answer["uid"] == uid
        self.wait_for_audit(lines + 1)
        return answer

    def audit_lines(self) -> list[JSON]:
        return [json.loads(line) for line in self.audit.getvalue().splitlines()]

    def wait_for_audit(self, count: int, timeout: float = 10.0) -> list[JSON]:
        """The audit lines once there are `count` of them (AssertionError after `timeout`)."""
        deadline = time.monotonic() + timeout
        while len(lines := self.audit_lines()) < count:
            assert time.monotonic() < deadline, f"{len(lines)} audit line(s), not {count}"
            time.sleep(0.005)
        return lines

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.metrics_url).raise_for_status().text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return 0.0


StartWebhook = Callable[..., Webhook]


@pytest.fixture
def start_webhook(ca: CertificateAuthority, serving_files: ServingFiles) -> Iterator[StartWebhook]:
    """Start the whole webhook (TLS, app, metrics port) with the given dependencies."""
    with ExitStack() as stack:

        def start(
            cluster: ClusterPort | None = None,
            decide: Decide | None = None,
        ) -> Webhook:
            registry = CollectorRegistry()
            metrics = WebhookMetrics(registry)
            tls = CertificateReloader(str(serving_files.cert), str(serving_files.key))
            audit = io.StringIO()
            options: dict[str, Any] = {} if decide is None else {"decide": decide}
            app = create_app(
                audit=AuditLog(stream=audit),
                metrics=metrics,
                cluster=cluster,
                tls_problem=tls.problem,
                **options,
            )
            server = stack.enter_context(run_server(app, tls.context))
            metrics_server = start_metrics_server(registry, "127.0.0.1", 0)
            stack.callback(metrics_server.close)
            client = stack.enter_context(
                httpx.Client(base_url=server.url, verify=ca.client_context(), timeout=10)
            )
            return Webhook(client, f"http://127.0.0.1:{metrics_server.port}/metrics", audit)

        yield start


@pytest.fixture
def webhook(start_webhook: StartWebhook) -> Webhook:
    """The webhook without cluster access."""
    return start_webhook()


def patched(pod: JSON, answer: JSON) -> JSON:
    assert answer["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(answer["patch"]))
    result: JSON = jsonpatch.apply_patch(copy.deepcopy(pod), ops)
    return result


def gpu_resources(pod: JSON) -> list[str]:
    found = []
    for field_name in ("containers", "initContainers"):
        for container in pod["spec"].get(field_name, []):
            for section in container.get("resources", {}).values():
                found += [name for name in section if name == keys.NVIDIA_GPU]
    return found


def test_gpu_pod_of_a_deployment_becomes_a_valid_fractional_pod(webhook: Webhook) -> None:
    pod = vllm_pod()

    answer = webhook.admit(pod, uid="b6e1c1d2-0c5a-4f7e-8a52-3f0f8f6d2a91")

    assert answer["allowed"] is True
    result = patched(pod, answer)
    kubernetes_validate.validate(result, KUBERNETES_VERSION, strict=True)
    assert gpu_resources(result) == []
    assert result["spec"]["schedulerName"] == keys.SCHEDULER_NAME
    annotations = result["metadata"]["annotations"]
    assert annotations[keys.DECISION] == "b6e1c1d2-0c5a-4f7e-8a52-3f0f8f6d2a91"
    for key in (keys.POLICY, keys.GPU_COMPUTE, keys.GPU_MEMORY, keys.ORIGINAL_RESOURCES):
        assert annotations[key]
    assert annotations["prometheus.io/scrape"] == "true"  # the user's annotations stay


def test_pod_without_gpu_is_admitted_unchanged(webhook: Webhook) -> None:
    answer = webhook.admit(cpu_pod())

    assert answer["allowed"] is True
    assert "patch" not in answer


def test_every_admission_writes_one_audit_line(webhook: Webhook) -> None:
    webhook.admit(vllm_pod(), uid="uid-gpu")
    webhook.admit(cpu_pod(), uid="uid-cpu")

    lines = webhook.audit_lines()
    assert [(line["audit"], line["uid"], line["outcome"]) for line in lines] == [
        (AUDIT_MARKER, "uid-gpu", "mutated"),
        (AUDIT_MARKER, "uid-cpu", "skipped"),
    ]
    assert lines[0]["capacity"]["action"] == "no-cluster"
    assert lines[0]["namespace"] == "ml"
    assert lines[0]["ownerKind"] == "Deployment"
    assert 0 < lines[0]["latencyMs"] < 60_000  # measured, in milliseconds


def test_dry_run_is_passed_to_the_capacity_check(start_webhook: StartWebhook) -> None:
    cluster = FakeCluster()
    webhook = start_webhook(cluster=cluster)

    answer = webhook.admit(vllm_pod(), dry_run=True)

    assert answer["allowed"] is True
    assert [dry_run for _, dry_run in cluster.calls] == [True]
    assert webhook.audit_lines()[0]["dryRun"] is True


def test_namespace_from_the_cluster_is_used_for_the_opt_in(start_webhook: StartWebhook) -> None:
    opted_out = namespace(labels={keys.OPTIMIZE: keys.OPTIMIZE_DISABLED})
    webhook = start_webhook(cluster=FakeCluster(namespaces={"ml": opted_out}))

    answer = webhook.admit(vllm_pod())

    assert "patch" not in answer
    assert webhook.audit_lines()[0]["reason"] == "opted-out"


def test_a_cached_namespace_behind_the_selectors_is_read_live(start_webhook: StartWebhook) -> None:
    """The API server sent the pod (its namespace is opted in now) but the replica's cache
    still has the namespace unlabelled: a replica whose watch is cut off, or a label just
    added. The cache must not let the pod through unchanged."""
    unlabelled = namespace(labels={})
    enabled = namespace(labels={keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    cluster = FakeCluster(namespaces={"ml": unlabelled}, live={"ml": enabled})
    webhook = start_webhook(cluster=cluster)

    answer = webhook.admit(vllm_pod())

    assert "patch" in answer
    assert webhook.audit_lines()[0]["reason"] == "mutated"
    assert cluster.reads == ["ml"]
    assert webhook.metric("gpupack_webhook_errors_total", kind="namespace_cache") == 1


def test_a_namespace_that_cannot_be_read_leaves_the_opt_in_to_the_selectors(
    start_webhook: StartWebhook, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut off from the API server, the replica cannot check its stale cache; the API
    server's selectors, which sent the pod, decide."""
    cluster = FakeCluster(
        namespaces={"ml": namespace(labels={})},
        live={"ml": ApiError(0, "ConnectionError", "GET /api/v1/namespaces/ml: timed out")},
    )
    webhook = start_webhook(cluster=cluster)

    answer = webhook.admit(vllm_pod())

    assert "patch" in answer
    assert webhook.audit_lines()[0]["reason"] == "mutated"
    assert "trusting the API server's selectors" in caplog.text


def test_a_namespace_lookup_that_fails_admits_the_pod_unchanged(
    start_webhook: StartWebhook,
) -> None:
    class Broken(FakeCluster):
        def namespace(self, name: str) -> JSON | None:
            raise RuntimeError("the cache is broken")

    webhook = start_webhook(cluster=Broken())

    answer = webhook.admit(vllm_pod())

    assert "patch" not in answer
    assert webhook.audit_lines()[0]["reason"] == "internal-error"


@pytest.mark.parametrize(
    ("namespace_labels", "pod_labels"),
    [
        pytest.param({keys.OPTIMIZE: keys.OPTIMIZE_ENABLED}, {}, id="namespace-opted-in"),
        pytest.param({}, {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED}, id="pod-opted-in"),
        pytest.param({}, {keys.OPTIMIZE: keys.OPTIMIZE_DISABLED}, id="pod-opted-out"),
    ],
)
def test_a_namespace_is_read_live_only_when_the_cache_alone_keeps_the_pod_out(
    start_webhook: StartWebhook, namespace_labels: dict[str, str], pod_labels: dict[str, str]
) -> None:
    cluster = FakeCluster(namespaces={"ml": namespace(labels=namespace_labels)})
    webhook = start_webhook(cluster=cluster)
    pod = vllm_pod()
    pod["metadata"].setdefault("labels", {}).update(pod_labels)

    webhook.admit(pod)

    assert cluster.reads == []


def test_replicas_seal_and_check_by_the_api_servers_clock_not_their_own(
    start_webhook: StartWebhook,
) -> None:
    """The API server's time is an hour from this machine's, as the nodes' clocks of two
    replicas may be from each other: a pod one replica sealed is left alone by the other
    on reinvocation, and its seal carries the API server's time."""
    server_time = time.time() - 3600
    sealing = start_webhook(cluster=FakeCluster(server_time=server_time))
    checking = start_webhook(cluster=FakeCluster(server_time=server_time + 30))
    pod = patched(vllm_pod(), sealing.admit(vllm_pod()))

    answer = checking.admit(pod, uid="req-2")

    assert seal.verify(process_key(), "ml", pod["metadata"]["annotations"]) == int(server_time)
    assert answer["allowed"] is True
    assert "patch" not in answer
    assert checking.audit_lines()[0]["reason"] == "already-mutated"


def test_policies_and_recommendations_come_from_the_cluster(start_webhook: StartWebhook) -> None:
    """vllm_pod is Deployment llm-server's, auto-detected as real-time."""
    spec = {**policy_spec(BUILTIN["real-time"]), "percentile": "high"}
    broken = {"metadata": {"name": "real-time", "namespace": "gpupack-system"}, "spec": spec}
    recommended = Recommendation(
        "ml", "Deployment", "llm-server", "real-time", 350, 5 * 2**30, 0.9, "", "p99"
    )
    cluster = FakeCluster(
        policies=effective_policies([broken]),
        recommendations={("ml", "Deployment", "llm-server"): recommended},
    )
    webhook = start_webhook(cluster=cluster)

    answer = webhook.admit(vllm_pod())
    webhook.admit(cpu_pod(), uid="req-2")

    pod = jsonpatch.apply_patch(vllm_pod(), json.loads(base64.b64decode(answer["patch"])))
    annotations = pod["metadata"]["annotations"]
    assert (annotations[keys.GPU_COMPUTE], annotations[keys.GPU_MEMORY]) == ("350m", "5Gi")
    (warning,) = answer["warnings"]
    assert warning.startswith("GPUPolicy real-time is invalid, the built-in real-time applies")
    line = webhook.audit_lines()[0]
    assert line["warnings"] == [warning]
    assert line["recommendation"]["name"] == "deployment-llm-server"
    assert line["allocationSource"].startswith("recommendation GPURecommendation ml/")
    assert webhook.metric("gpupack_webhook_recommendations_applied_total") == 1


def test_the_capacity_plan_is_counted_and_written_to_the_audit_line(
    start_webhook: StartWebhook,
) -> None:
    needed = CapacityOutcome("needed", "the pool lacks 1 GPU(s)", {"pool": "p", "missing": 1})
    webhook = start_webhook(cluster=FakeCluster(capacity=lambda demand, dry_run: needed))

    webhook.admit(vllm_pod())

    assert webhook.metric("gpupack_webhook_capacity_checks_total", action="needed") == 1
    capacity = webhook.audit_lines()[0]["capacity"]
    assert capacity == {"action": "needed", "pool": "p", "missing": 1, "detail": needed.detail}


def test_the_answer_does_not_wait_for_the_capacity_plan_or_the_audit_line(
    start_webhook: StartWebhook,
) -> None:
    """The plan is only for the audit line: the API server has its answer first."""
    answered = threading.Event()
    planned_after_the_answer: list[bool] = []

    def plan(demand: Demand, dry_run: bool) -> CapacityOutcome:
        planned_after_the_answer.append(answered.wait(timeout=5))
        return CapacityOutcome("sufficient")

    webhook = start_webhook(cluster=FakeCluster(capacity=plan))

    response = webhook.post(review(vllm_pod(), uid="req-1"))
    answered.set()

    assert response.json()["response"]["patch"]
    [line] = webhook.wait_for_audit(1)
    assert planned_after_the_answer == [True]
    assert line["capacity"]["action"] == "sufficient"
    assert webhook.metric("gpupack_webhook_capacity_checks_total", action="sufficient") == 1


def _raise(demand: Demand, dry_run: bool) -> CapacityOutcome:
    raise RuntimeError("apiserver unreachable")


def _api_timeout(demand: Demand, dry_run: bool) -> CapacityOutcome:
    raise TimeoutError("POST /api/v1/namespaces/gpupack-system/pods timed out")


@pytest.mark.parametrize(
    ("cluster", "detail"),
    [
        pytest.param(FakeCluster(capacity=_raise), "apiserver unreachable", id="fails"),
        pytest.param(FakeCluster(capacity=_api_timeout), "timed out", id="api-call-times-out"),
    ],
)
def test_capacity_trouble_still_admits_the_pod(
    start_webhook: StartWebhook, cluster: FakeCluster, detail: str
) -> None:
    webhook = start_webhook(cluster=cluster)

    answer = webhook.admit(vllm_pod())

    assert answer["allowed"] is True
    assert "patch" in answer
    capacity = webhook.audit_lines()[0]["capacity"]
    assert capacity["action"] == "error"
    assert detail in capacity["detail"]
    assert webhook.metric("gpupack_webhook_errors_total", kind="capacity") == 1


def test_a_bug_in_the_decision_admits_the_pod_unchanged(start_webhook: StartWebhook) -> None:
    def broken(request: AdmissionRequest, ctx: MutationContext) -> Decision:
        raise KeyError("spec")

    webhook = start_webhook(decide=broken)

    answer = webhook.admit(vllm_pod())

    assert answer["allowed"] is True
    assert "patch" not in answer
    assert webhook.audit_lines()[0]["reason"] == "internal-error"
    assert webhook.metric("gpupack_webhook_errors_total", kind="internal") == 1


def test_a_decision_that_cannot_be_encoded_admits_the_pod_unchanged(
    start_webhook: StartWebhook,
) -> None:
    def unencodable(request: AdmissionRequest, ctx: MutationContext) -> Decision:
        op = {"op": "add", "path": "/metadata/labels/x", "value": object()}
        return Decision(Outcome.MUTATED, Reason.MUTATED, "mutated", patch=(op,))

    webhook = start_webhook(decide=unencodable)

    answer = webhook.admit(vllm_pod())

    assert answer["allowed"] is True
    assert "patch" not in answer
    assert webhook.audit_lines()[0]["reason"] == "internal-error"


def test_invalid_policy_annotation_is_denied_with_a_message(webhook: Webhook) -> None:
    pod = vllm_pod()
    pod["metadata"]["annotations"][keys.POLICY] = "no-such-policy"

    answer = webhook.admit(pod)

    assert answer["allowed"] is False
    assert "no-such-policy" in answer["status"]["message"]


def _review_with(**request_changes: Any) -> JSON:
    doc = review(vllm_pod())
    doc["request"].update(request_changes)
    return doc


def _without(key: str) -> JSON:
    doc = review(vllm_pod())
    del doc["request"][key]
    return doc


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param(b'{"apiVersion": ', 400, "not valid JSON", id="malformed-json"),
        pytest.param(b"[]", 400, "JSON object", id="not-an-object"),
        pytest.param(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
            400,
            "request is missing",
            id="missing-request",
        ),
        pytest.param(_without("uid"), 400, "uid", id="missing-uid"),
        pytest.param(
            {**review(vllm_pod()), "apiVersion": "admission.k8s.io/v1beta1"},
            400,
            "apiVersion",
            id="wrong-api-version",
        ),
        pytest.param(
            {**review(vllm_pod()), "kind": "TokenReview"},
            400,
            "AdmissionReview",
            id="wrong-kind",
        ),
        pytest.param(
            _review_with(kind={"group": "apps", "version": "v1", "kind": "Deployment"}),
            400,
            "Pods",
            id="not-a-pod",
        ),
        pytest.param(b"x" * (MAX_BODY_BYTES + 1), 413, "limit", id="body-over-3MiB"),
    ],
)
def test_bad_input_gets_a_client_error_and_the_server_keeps_serving(
    webhook: Webhook, body: bytes | JSON, status: int, message: str
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()

    response = webhook.client.post(
        "/mutate", content=content, headers={"content-type": "application/json"}
    )

    assert response.status_code == status
    assert message in response.json()["error"]
    assert webhook.admit(vllm_pod())["allowed"] is True
    kind = "body_too_large" if status == 413 else "bad_request"
    assert webhook.metric("gpupack_webhook_errors_total", kind=kind) == 1


def test_oversized_chunked_body_is_cut_off_with_413(webhook: Webhook) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(4):
            yield b" " * 2**20

    response = webhook.client.post("/mutate", content=chunks())

    assert response.status_code == 413
    assert webhook.admit(vllm_pod())["allowed"] is True


def test_health_and_readiness(start_webhook: StartWebhook) -> None:
    cluster = FakeCluster(synced=False)
    webhook = start_webhook(cluster=cluster)

    assert webhook.client.get("/healthz").status_code == 200
    not_ready = webhook.client.get("/readyz")
    assert not_ready.status_code == 503
    assert "not synced" in not_ready.json()["reason"]
    cluster.synced = True
    assert webhook.client.get("/readyz").status_code == 200


def test_readiness_without_a_cluster(webhook: Webhook) -> None:
    assert webhook.client.get("/readyz").json() == {"ready": True}


def test_unknown_path_is_404_and_wrong_method_is_405(webhook: Webhook) -> None:
    assert webhook.client.get("/mutate").status_code == 405
    assert webhook.client.post("/healthz").status_code == 405
    assert webhook.client.post("/validate", json={}).status_code == 404


def test_metrics_port_shows_the_counters_moving(webhook: Webhook) -> None:
    mutated = {"outcome": "mutated", "reason": "mutated"}
    assert webhook.metric("gpupack_webhook_admissions_total", **mutated) == 0

    webhook.admit(vllm_pod())
    webhook.admit(vllm_pod())
    webhook.admit(cpu_pod())

    assert webhook.metric("gpupack_webhook_admissions_total", **mutated) == 2
    skipped = {"outcome": "skipped", "reason": "no-gpu"}
    assert webhook.metric("gpupack_webhook_admissions_total", **skipped) == 1
    assert webhook.metric("gpupack_webhook_admission_duration_seconds_count") == 3
    assert webhook.metric("gpupack_webhook_errors_total", kind="internal") == 0


def test_serving_starts_the_cluster_and_stops_it_after_the_server(
    serving_files: ServingFiles,
) -> None:
    cluster = FakeCluster()
    tls = CertificateReloader(str(serving_files.cert), str(serving_files.key))
    app = create_app(
        audit=AuditLog(stream=io.StringIO()), metrics=WebhookMetrics(CollectorRegistry())
    )
    server = uvicorn.Server(
        build_uvicorn_config(app, host="127.0.0.1", port=0, ssl_context=tls.context)
    )
    server.should_exit = True  # as if SIGTERM came right after the start

    asyncio.run(serve(server, cluster, [listening_socket("127.0.0.1", 0)]))

    assert server.started
    assert cluster.lifecycle == ["start", "stop"]


# The command itself, in a subprocess: option errors and a full start, admit, SIGTERM.


def test_serve_with_a_missing_certificate_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    missing = str(tmp_path / "tls.crt")
    result = subprocess.run(
        serve_command("--tls-cert-file", missing, "--tls-private-key-file", missing),
        capture_output=True,
        text=True,
        env=no_cluster_env(),
        timeout=60,
        check=False,
    )

    assert result.returncode == 2
    error = json.loads(result.stderr.strip().splitlines()[-1])
    assert error["level"] == "error"
    assert missing in error["message"]
    assert "does not exist" in error["message"]


def spawn_serve(*args: str) -> "subprocess.Popen[str]":
    """`gpupack-webhook serve ARGS` without a cluster, its stderr kept."""
    return subprocess.Popen(
        serve_command(*args),
        env=no_cluster_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_answer(
    client: httpx.Client, url: str, process: "subprocess.Popen[str]"
) -> httpx.Response:
    """GET `url` once the process listens (it needs a moment to import); fails if it exits
    or nothing answers there within 30 s."""
    for _ in range(600):
        try:
            return client.get(url)
        except httpx.ConnectError:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            time.sleep(0.05)
    raise AssertionError(f"nothing answered at {url}")


def test_serve_admits_pods_and_stops_cleanly_on_sigterm(
    tmp_path: Path, ca: CertificateAuthority, serving_files: ServingFiles
) -> None:
    port = free_port()
    audit_file = tmp_path / "audit.jsonl"
    args = ["--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0"]
    args += ["--tls-cert-file", str(serving_files.cert)]
    args += ["--tls-private-key-file", str(serving_files.key), "--audit-file", str(audit_file)]
    process = spawn_serve(*args)
    try:
        with httpx.Client(
            base_url=f"https://127.0.0.1:{port}", verify=ca.client_context(), timeout=10
        ) as client:
            first_answer(client, "/healthz", process)
            response = client.post("/mutate", json=review(vllm_pod(), uid="sub-1"))
            assert response.json()["response"]["uid"] == "sub-1"
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)

    assert process.returncode == 0, stderr
    assert json.loads(audit_file.read_text().splitlines()[0])["uid"] == "sub-1"
    messages = [json.loads(line)["message"] for line in stderr.splitlines()]
    assert "no cluster access: capacity not planned" in messages
    assert "stopped on SIGTERM" in messages


@pytest.mark.skipif(not IPV6, reason="this machine's kernel has no IPv6")
def test_serve_on_the_default_address_answers_ipv4_and_ipv6_clients(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    # The chart passes no --host. uvicorn's own listener on `::` is IPv6-only, so the
    # kubelet's probes and the API server on an IPv4 cluster were refused.
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(names=("127.0.0.1", "::1")).write(cert, key)
    port, metrics_port = free_port(), free_port()
    args = ["--port", str(port), "--metrics-port", str(metrics_port)]
    args += ["--tls-cert-file", str(cert), "--tls-private-key-file", str(key)]
    process = spawn_serve(*args)
    try:
        answers = {}
        for host in ("127.0.0.1", "[::1]"):
            with httpx.Client(verify=ca.client_context(), timeout=10) as client:
                url = f"https://{host}:{port}/healthz"
                answers[host] = first_answer(client, url, process).status_code
                metrics = httpx.get(f"http://{host}:{metrics_port}/metrics", timeout=10)
                assert metrics.status_code == 200
                assert b"gpupack_webhook_" in metrics.content
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)

    assert answers == {"127.0.0.1": 200, "[::1]": 200}


@pytest.mark.parametrize(
    ("declared", "status"),
    [
        pytest.param("²", 400, id="latin-1-superscript"),
        pytest.param("12a", 400, id="not-a-number"),
        pytest.param(str(MAX_BODY_BYTES + 1), 413, id="too-large"),
    ],
)
def test_content_length_is_checked_before_reading(declared: str, status: int) -> None:
    from starlette.requests import Request

    from webhook.app import read_body
    from webhook.review import ReviewError

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mutate",
        "headers": [(b"content-length", declared.encode("latin-1"))],
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    with pytest.raises(ReviewError) as info:
        asyncio.run(read_body(Request(scope, receive)))
    assert info.value.status == status


def test_an_admission_reports_its_own_work_and_the_cpu_time_it_took() -> None:
    """An admission's own work is two spans that never yield the event loop, from the
    body read to the answer and what follows the answer: their wall-clock time minus the
    loop thread's CPU time over them is time spent waiting for the GIL."""
    walls = iter([10.0, 10.5, 10.7, 10.72, 10.75])  # started, body read, answered, resumed, audited
    cpus = iter([3.0, 3.15, 3.16, 3.2])  # body read, answered, resumed, audited
    registry = CollectorRegistry()
    app = create_app(
        audit=AuditLog(stream=io.StringIO()),
        metrics=WebhookMetrics(registry),
        timer=lambda: next(walls),
        cpu_timer=lambda: next(cpus),
    )
    body = json.dumps(review(vllm_pod())).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mutate",
        "headers": [(b"content-length", str(len(body)).encode())],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    asyncio.run(app(scope, receive, send))

    assert sent[0]["status"] == 200
    work = registry.get_sample_value("gpupack_webhook_admission_work_seconds_total")
    cpu = registry.get_sample_value("gpupack_webhook_admission_work_cpu_seconds_total")
    duration = registry.get_sample_value("gpupack_webhook_admission_duration_seconds_sum")
    assert (work, cpu, duration) == pytest.approx((0.23, 0.19, 0.7))
