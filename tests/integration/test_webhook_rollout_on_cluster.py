"""A rolling update of the webhook during a burst of pod creations loses no admission.

The webhook is registered by its Service, as the chart registers it, and the API server
calls the Service's endpoints (`--enable-aggregator-routing`: no kube-proxy here).
The rollout is the Deployment's, step by step: a new replica starts and becomes an
endpoint; the old one starts terminating, which at once removes it from the endpoints
and sends it SIGTERM; it drains for the chart's `webhook.shutdownDelaySeconds`
(`--shutdown-delay`) and exits. The API server keeps reusing the connections it has to
the old replica meanwhile, whatever the endpoints say. Meanwhile pods are created without pause; with `failurePolicy: Ignore` a pod
whose admission failed would be created unchanged, so every pod must come back
rewritten.

A cluster of its own: it registers the webhook by Service.
"""

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from gpupack import keys
from hack.localcluster import WEBHOOK_NAME, ApiError, Kube, LocalCluster
from hack.localcluster.processes import routable_address
from tests.integration.partition import Partition
from tests.integration.tools import REPO, webhook_cluster_of_its_own
from tests.integration.workloads import gpu_pod

pytestmark = pytest.mark.integration
SHARE = {keys.GPU_COMPUTE: "250m"}  # a pinned share: each pod is decided the same way


def shutdown_delay() -> float:
    """The chart's `webhook.shutdownDelaySeconds`: how long a stopping replica drains."""
    values = yaml.safe_load((REPO / "charts" / "gpupack" / "values.yaml").read_text())
    return float(values["webhook"]["shutdownDelaySeconds"])


@dataclass
class Burst:
    """Pods created back to back from `threads` threads until stopped."""

    kubeconfig: Path
    namespace: str
    rewritten: int = 0
    escaped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, worker: int) -> None:
        kube = Kube.from_kubeconfig(self.kubeconfig)
        index = 0
        try:
            while not self._stop.is_set():
                name = f"burst-{worker}-{index}"
                index += 1
                try:
                    pod = kube.create(
                        f"/api/v1/namespaces/{self.namespace}/pods",
                        gpu_pod(name, annotations=SHARE),
                    )
                except ApiError as error:
                    with self._lock:
                        self.failed.append(f"{name}: {error}")
                    continue
                annotations = pod["metadata"].get("annotations") or {}
                with self._lock:
                    if keys.DECISION in annotations:
                        self.rewritten += 1
                    else:
                        self.escaped.append(name)
        finally:
            kube.close()

    def stop(self) -> None:
        self._stop.set()


def audited(cluster: LocalCluster, name: str) -> int:
    path = cluster.workdir / "logs" / f"{name}.audit.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(scope="module")
def rollout_cluster(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[LocalCluster]:
    yield from webhook_cluster_of_its_own(tmp_path_factory, cluster, "rollout")


def test_a_rolling_update_during_a_burst_loses_no_admission(
    rollout_cluster: LocalCluster,
) -> None:
    cluster = rollout_cluster
    kube = cluster.kube()
    address = routable_address()
    delay = [f"--shutdown-delay={shutdown_delay()}"]
    old, old_port = cluster.start_webhook_replica("webhook-old", address, delay)
    cluster.route_webhook([(address, old_port)])
    cluster.stop_webhook()  # the loopback process install_webhook started: not an endpoint
    ns = kube.create_namespace("it-rollout", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})

    def routed() -> bool:
        kube.create(
            f"/api/v1/namespaces/{ns}/pods",
            gpu_pod(f"probe-{time.monotonic_ns()}", annotations=SHARE),
        )
        return audited(cluster, "webhook-old") > 0

    kube.wait_for("the Service's endpoint to admit pods", routed, timeout=60)

    burst = Burst(cluster.kubeconfig, ns)
    threads = [threading.Thread(target=burst.run, args=(i,), daemon=True) for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        # The new replica is ready and becomes an endpoint beside the old one.
        new, new_port = cluster.start_webhook_replica("webhook-new", address, delay)
        cluster.route_webhook([(address, old_port), (address, new_port)])
        time.sleep(1)  # (the API server picks which of the two endpoints to call)
        # The old one starts terminating: out of the endpoints and SIGTERM together.
        cluster.route_webhook([(address, new_port)])
        old.stop(grace=shutdown_delay() + 30)
        time.sleep(2)
    finally:
        burst.stop()
        for thread in threads:
            thread.join(timeout=30)

    new.stop()  # the API server keeps its connections to a running replica: stop it
    assert burst.failed == []
    assert burst.escaped == [], f"{len(burst.escaped)} of {burst.rewritten} pods escaped"
    assert audited(cluster, "webhook-old") > 0
    assert audited(cluster, "webhook-new") > 0
    assert burst.rewritten > 50


def test_a_replica_cut_off_from_the_api_server_lets_no_pod_escape(
    rollout_cluster: LocalCluster, tmp_path: Path
) -> None:
    """One replica loses the API server (its watches hang, its caches go stale) while it
    keeps receiving admissions. Meanwhile a team labels its namespace: the cut replica's
    cache still says the namespace is not opted in, and took the pod for not opted in
    (admitted unchanged, a whole GPU). Its pods, those of namespaces opted in before, and
    those of a namespace made during the cut must all come back rewritten."""
    cluster = rollout_cluster
    kube = cluster.kube()
    address = routable_address()
    api = urlsplit(cluster.server)
    late = kube.create_namespace("it-late")  # unlabelled: both replicas' caches list it so
    opted = kube.create_namespace("it-opted", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    with Partition((api.hostname or "127.0.0.1", api.port or 443)) as link, ExitStack() as stop:
        original = cluster.service_account_kubeconfig(WEBHOOK_NAME)
        cut, cut_port = cluster.start_webhook_replica(
            "webhook-cut", address, kubeconfig=link.kubeconfig(original, tmp_path / "cut.yaml")
        )
        stop.callback(cut.stop)
        ok, ok_port = cluster.start_webhook_replica("webhook-ok", address)
        stop.callback(ok.stop)
        link.cut()
        kube.merge_patch(
            f"/api/v1/namespaces/{late}", {"metadata": {"labels": {keys.OPTIMIZE: "enabled"}}}
        )
        made = kube.create_namespace("it-made", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
        cluster.route_webhook([(address, cut_port)])  # the cut replica alone, first

        def routed() -> bool:
            kube.create(
                f"/api/v1/namespaces/{opted}/pods",
                gpu_pod(f"probe-{time.monotonic_ns()}", annotations=SHARE),
            )
            return audited(cluster, "webhook-cut") > 0

        try:
            kube.wait_for("the cut replica to admit pods", routed, timeout=60)
        except Exception as error:
            raise AssertionError(f"{error}\n{cut.tail(60)}") from error
        seconds: dict[str, float] = {}
        escaped = []
        for ns in (late, opted, made):
            for index in range(3):
                started = time.monotonic()
                pod = kube.create(
                    f"/api/v1/namespaces/{ns}/pods", gpu_pod(f"cut-{index}", annotations=SHARE)
                )
                seconds[ns] = max(seconds.get(ns, 0.0), time.monotonic() - started)
                if keys.DECISION not in (pod["metadata"].get("annotations") or {}):
                    escaped.append(f"{ns}/cut-{index}")
        assert escaped == [], f"admitted unchanged by the cut replica: {escaped}"
        assert cut.alive(), cut.tail(40)
        assert "trusting the API server's selectors" in cut.tail(200)

        # Both replicas serve; the cut one heals and the pods go on being rewritten.
        cluster.route_webhook([(address, cut_port), (address, ok_port)])
        link.heal()
        for index in range(6):
            pod = kube.create(
                f"/api/v1/namespaces/{late}/pods", gpu_pod(f"healed-{index}", annotations=SHARE)
            )
            assert keys.DECISION in (pod["metadata"].get("annotations") or {}), pod["metadata"]
        print(
            "cut replica: slowest admission per namespace "
            + ", ".join(f"{ns.split('-')[1]} {s:.2f} s" for ns, s in seconds.items())
        )
