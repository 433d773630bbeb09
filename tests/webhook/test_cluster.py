"""The Cluster the server uses: against the local HTTP stub of `tests/apistub.py` once
end to end, and otherwise against the in-memory fake."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gpupack import keys
from gpupack.objects import JSON
from gpupack.policy import BUILTIN, policy_spec
from gpupack.pool import pool_key, scheduling_metadata
from gpupack.recommendation import Recommendation, list_path, recommendation_object
from gpupack.runtime.api import ApiError, Backoff, retry
from hack.polling import eventually
from tests.apistub import ApiStub, write_kubeconfig
from tests.fakes import FakeKube, FakeWatch
from webhook.app import ClusterPort
from webhook.cluster import NAMESPACE_READ_TIMEOUT, Cluster, connect, policies_path
from webhook.decision import Demand
from webhook.policies import BUILTIN_POLICIES

WAIT = 10.0  # a deadline for background threads, never a measured duration
SPEC: JSON = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}
POOL = pool_key(SPEC)  # type: ignore[arg-type]


def demand(uid: str, compute: int = 300) -> Demand:
    return Demand(uid, POOL, scheduling_metadata(SPEC), compute, 2**30, "ml", "Job/train", False)  # type: ignore[arg-type]


# Finding the cluster (the order itself is gpupack.runtime.config's, tested there).


def test_no_kubeconfig_and_no_service_account_means_no_cluster(tmp_path: Path) -> None:
    assert connect(None, environ={}, home=tmp_path) is None


def test_an_explicit_kubeconfig_that_does_not_load_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"kubeconfig {tmp_path / 'missing'} "):
        connect(str(tmp_path / "missing"), environ={}, home=tmp_path)


def test_retry_backs_off_boundedly_and_never_retries_a_conflict() -> None:
    sleeps: list[float] = []
    failures = [ApiError(503, "ServiceUnavailable", "")] * 4

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "ok"

    backoff = Backoff(0.1, 0.25)
    assert retry(flaky, attempts=5, backoff=backoff, sleep=sleeps.append, draw=lambda: 0.0) == "ok"
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


def test_cluster_over_http_syncs_and_plans_capacity_without_writing(
    server: str, tmp_path: Path, stub: ApiStub
) -> None:
    cluster = connect(str(write_kubeconfig(tmp_path / "config", server)))
    assert cluster is not None
    cluster.start()
    try:
        eventually("cluster.synced", lambda: cluster.synced, WAIT, interval=0.01)
        assert (cluster.namespace("ml") or {})["metadata"]["labels"] == {keys.OPTIMIZE: "enabled"}
        assert cluster.namespace("unknown") is None
        stub.namespaces[0]["metadata"]["labels"] = {}  # changed on the server, not yet seen
        assert (cluster.read_namespace("ml") or {})["metadata"]["labels"] == {}
        assert cluster.read_namespace("unknown") is None

        outcome = cluster.plan_capacity(demand("uid-1"), dry_run=False)
    finally:
        cluster.stop()

    assert outcome.verdict == "needed"
    assert outcome.extra["missing"] == 1
    assert not stub.pods.get("gpupack-system")  # capacity is gpupack-scheduler's to create
    assert all(verb == "GET" for verb, _, _ in stub.requests)
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


def test_plan_capacity_counts_each_admission_for_the_next() -> None:
    kube = FakeKube()
    cluster = Cluster(kube)
    cluster.start()
    try:
        assert cluster.capacity_pods.wait_synced(WAIT)
        assert cluster.fractional_pods.wait_synced(WAIT)

        first = cluster.plan_capacity(demand("uid-1", compute=600), dry_run=False)
        dry = cluster.plan_capacity(demand("uid-2", compute=600), dry_run=True)
        second = cluster.plan_capacity(demand("uid-3", compute=600), dry_run=False)
        missing = [o.extra["missing"] for o in (first, dry, second)]
    finally:
        cluster.stop()

    # The dry run counts the first pod but is not counted by the second.
    assert missing == [1, 2, 2]
    assert kube.count("create") == 0


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

    def get(self, path: str, *, timeout: float | None = None) -> JSON:
        return self.core.get(path, timeout=timeout)

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
        eventually("cluster.synced", lambda: cluster.synced, WAIT, interval=0.01)
        assert cluster.policies.policies["batch"].initial_compute == 300
        assert recommended_compute(cluster) == 250

        kube.policies.put(gpupolicy("batch", initialCompute="200m"))
        eventually(
            "cluster.policies.policies['batch'].initial_compute == 200",
            lambda: cluster.policies.policies["batch"].initial_compute == 200,
            WAIT,
            interval=0.01,
        )
        kube.policies.put(gpupolicy("batch", percentile="high"))
        eventually(
            "'batch' in cluster.policies.invalid",
            lambda: "batch" in cluster.policies.invalid,
            WAIT,
            interval=0.01,
        )
        assert cluster.policies.policies["batch"] == BUILTIN["batch"]

        kube.recommendations.put(recommendation(400))
        eventually(
            "recommended_compute(cluster) == 400",
            lambda: recommended_compute(cluster) == 400,
            WAIT,
            interval=0.01,
        )
        kube.recommendations.delete("pods", "ml", "deployment-web")
        eventually(
            "recommended_compute(cluster) is None",
            lambda: recommended_compute(cluster) is None,
            WAIT,
            interval=0.01,
        )
    finally:
        cluster.stop()


def test_a_namespace_that_cannot_be_read_raises_within_the_bound() -> None:
    kube = RoutingKube()
    kube.core.fail("get", ApiError(0, "ConnectionError", "timed out"))
    cluster = Cluster(kube)
    with pytest.raises(ApiError):
        cluster.read_namespace("ml")
    (call,) = [c for c in kube.core.calls if c.verb == "get"]
    assert call.params == {"timeout": str(NAMESPACE_READ_TIMEOUT)}


def test_cluster_is_not_synced_while_a_gpupack_collection_cannot_be_listed() -> None:
    kube = RoutingKube()
    kube.policies.fail("list", ApiError(403, "Forbidden", "gpupolicies is forbidden"), times=1000)
    cluster = Cluster(kube)
    cluster.start()
    try:
        assert cluster.namespaces.wait_synced(WAIT)
        assert cluster.gpurecommendations.wait_synced(WAIT)
        eventually(
            "'forbidden' in cluster.gpupolicies.error",
            lambda: "forbidden" in cluster.gpupolicies.error,
            WAIT,
            interval=0.01,
        )
        assert not cluster.synced
    finally:
        cluster.stop()
