"""The webhook against a real API server: what the cluster stores is what we promise.

Each test isolates its pool with a toleration of its own (harmless: no node has that
taint), so capacity pods of one test never count for another.
"""

import contextlib
import copy
import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupack import keys
from gpupack.policy import BUILTIN, policy_spec
from gpupack.pool import pool_key
from gpupack.recommendation import Recommendation, recommendation_object
from hack.localcluster import (
    SYSTEM_NAMESPACE,
    ApiError,
    Kube,
    LocalCluster,
)

pytestmark = pytest.mark.integration

JSON = dict[str, Any]
VISIBLE_DEVICES = {
    "name": "NVIDIA_VISIBLE_DEVICES",
    "valueFrom": {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations['gpupack.io/gpu-uuid']"}
    },
}


def isolate(namespace: str) -> JSON:
    return {
        "key": "gpupack.test/isolate",
        "operator": "Equal",
        "value": namespace,
        "effect": "NoSchedule",
    }


def gpu_spec(namespace: str, gpus: int = 1, env: list[JSON] | None = None) -> JSON:
    gpu = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    container: JSON = {
        "name": "cuda",
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "command": ["sleep", "infinity"],
        "resources": {
            # The GPU in requests too: the API server would default it from limits, and
            # "stored as submitted" compares what was sent with what was stored.
            "requests": {"cpu": "100m", "memory": "128Mi", **gpu},
            "limits": {"cpu": "1", "memory": "1Gi", **gpu},
        },
    }
    if env is not None:
        container["env"] = env
    return {
        "containers": [container],
        "tolerations": [isolate(namespace)],
        "terminationGracePeriodSeconds": 0,
    }


def pod(
    namespace: str,
    name: str,
    *,
    labels: JSON | None = None,
    annotations: JSON | None = None,
    **spec: Any,
) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {**gpu_spec(namespace), **spec},
    }


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def wait_for_pods(kube: Kube, namespace: str, app: str, count: int, what: str) -> list[JSON]:
    """The `count` pods labelled app=`app` once the workload `what` has created them."""

    def created() -> list[JSON] | None:
        items: list[JSON] = kube.get(pods_path(namespace), labelSelector=f"app={app}")["items"]
        return items if len(items) == count else None

    pods: list[JSON] = kube.wait_for(f"{what}'s {count} pod(s)", created)
    return pods


def capacity_pods(kube: Kube, stored: JSON) -> list[JSON]:
    """The capacity pods of a stored pod's pool. The pool is keyed by the spec the webhook
    saw, after the API server's defaulting (DefaultTolerationSeconds adds tolerations)."""
    selector = f"gpupack.io/role=capacity,gpupack.io/pool={pool_key(stored['spec'])}"
    items: list[JSON] = kube.get(
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", labelSelector=selector
    )["items"]
    return items


def delete_capacity(kube: Kube, stored: JSON | None) -> None:
    for item in capacity_pods(kube, stored) if stored else []:
        kube.delete(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{item['metadata']['name']}")


def has_gpu_request(stored: JSON) -> bool:
    return any(
        keys.NVIDIA_GPU in (c.get("resources", {}).get(section) or {})
        for c in stored["spec"]["containers"]
        for section in ("limits", "requests")
    )


def assert_mutated(stored: JSON, compute: str | None = None) -> None:
    annotations = stored["metadata"].get("annotations") or {}
    assert not has_gpu_request(stored)
    assert stored["spec"]["schedulerName"] == keys.SCHEDULER_NAME
    for key in (
        keys.POLICY,
        keys.GPU_COMPUTE,
        keys.GPU_MEMORY,
        keys.ORIGINAL_RESOURCES,
        keys.DECISION,
    ):
        assert key in annotations, key
    if compute is not None:
        assert annotations[keys.GPU_COMPUTE] == compute
    env = stored["spec"]["containers"][0]["env"]
    assert VISIBLE_DEVICES in env
    assert {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"} in env


NO_DEVICES = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def assert_as_submitted(stored: JSON, submitted: JSON) -> None:
    """Nothing of gpupack's sharing on the pod; a container the kubelet gives no GPU has
    only NVIDIA_VISIBLE_DEVICES=void added (no image chooses its GPUs: docs/security.md)."""
    annotations = stored["metadata"].get("annotations") or {}
    assert not [k for k in annotations if k.startswith("gpupack.io/")]
    assert stored["spec"]["schedulerName"] == "default-scheduler"
    assert stored["metadata"].get("labels", {}) == submitted["metadata"].get("labels", {})
    for got, sent in zip(
        stored["spec"]["containers"], submitted["spec"]["containers"], strict=True
    ):
        assert got["resources"] == sent["resources"]
        given_a_gpu = "nvidia.com/gpu" in (sent["resources"].get("limits") or {})
        expected = sent.get("env") if given_a_gpu else [*(sent.get("env") or []), NO_DEVICES]
        assert got.get("env") == expected


@pytest.mark.smoke
def test_deployment_pods_are_stored_mutated_and_their_capacity_planned_not_created(
    kube: Kube, opted_in_namespace: str, cluster: LocalCluster | None
) -> None:
    """The webhook plans the pool at each admission (each counts the ones before it) and
    creates nothing: capacity pods are gpupack-scheduler's to create, and none runs in
    this module."""
    ns = opted_in_namespace
    spec = gpu_spec(ns)
    template = {
        "metadata": {
            "labels": {"app": "llm"},
            "annotations": {keys.GPU_COMPUTE: "300m", keys.POLICY: "batch"},
        },
        "spec": spec,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": ns},
        "spec": {"replicas": 9, "selector": {"matchLabels": {"app": "llm"}}, "template": template},
    }
    kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)
    first: JSON | None = None
    try:
        pods = wait_for_pods(kube, ns, "llm", 9, "the ReplicaSet")
        first = pods[0]
        for stored in pods:
            assert_mutated(stored, compute="300m")
            assert stored["metadata"]["annotations"][keys.POLICY] == "batch"
            assert stored["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        if cluster is not None:
            lines = [
                audit_entry(cluster, p["metadata"]["annotations"][keys.DECISION]) or {}
                for p in pods
            ]
            plans = [line["capacity"] for line in lines]
            assert {p["action"] for p in plans} == {"needed"}
            assert max(p["missing"] for p in plans) == 3  # 9 x 300m: three GPUs, not nine
            assert {p["pool"] for p in plans} == {pool_key(first["spec"])}
        assert capacity_pods(kube, first) == []
    finally:
        kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/llm")
        delete_capacity(kube, first)


@pytest.mark.parametrize(
    ("case", "opted_in"),
    [
        pytest.param("no-gpu", True, id="pod-without-gpu"),
        pytest.param("opted-out", True, id="pod-opted-out"),
        pytest.param("gpu", False, id="namespace-not-opted-in"),
    ],
)
def test_pods_out_of_scope_are_stored_as_submitted(
    kube: Kube, opted_in_namespace: str, plain_namespace: str, case: str, opted_in: bool
) -> None:
    ns = opted_in_namespace if opted_in else plain_namespace
    labels = {"gpupack.io/optimize": "disabled"} if case == "opted-out" else {"app": "x"}
    submitted = pod(
        ns,
        f"p-{case}",
        labels=labels,
        **gpu_spec(ns, gpus=0 if case == "no-gpu" else 1, env=[{"name": "A", "value": "1"}]),
    )
    stored = kube.create(pods_path(ns), submitted)
    assert_as_submitted(stored, submitted)
    assert_as_submitted(kube.get(f"{pods_path(ns)}/p-{case}"), submitted)
    assert capacity_pods(kube, stored) == []


def test_workload_opt_in_label_is_mutated_in_a_namespace_that_is_not(
    kube: Kube, plain_namespace: str
) -> None:
    ns = plain_namespace
    stored = kube.create(
        pods_path(ns), pod(ns, "opted-in-pod", labels={"gpupack.io/optimize": "enabled"})
    )
    assert_mutated(stored)
    delete_capacity(kube, stored)


def kubectl() -> str | None:
    bin_dir = os.environ.get("GPUPACK_BIN_DIR", "")
    candidate = Path(bin_dir, "kubectl")
    return str(candidate) if bin_dir and candidate.is_file() else shutil.which("kubectl")


def test_server_side_dry_run_returns_the_mutated_pod_and_creates_no_capacity(
    kube: Kube, cluster: LocalCluster | None, opted_in_namespace: str
) -> None:
    ns = opted_in_namespace
    submitted = pod(ns, "dry")
    binary = kubectl()
    assert binary is not None, "kubectl is built with the other binaries (hack/lib/binaries.sh)"
    kubeconfig = os.environ.get("GPUPACK_TEST_KUBECONFIG") or str(cluster.kubeconfig)  # type: ignore[union-attr]
    result = subprocess.run(
        [
            binary,
            f"--kubeconfig={kubeconfig}",
            "create",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
        ],
        input=json.dumps(submitted),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    dry = json.loads(result.stdout)
    assert_mutated(dry)
    assert kube.get(pods_path(ns))["items"] == []
    assert capacity_pods(kube, dry) == []


def test_user_supplied_assignment_annotations_are_stripped(
    kube: Kube, opted_in_namespace: str
) -> None:
    ns = opted_in_namespace
    forged = {
        keys.GPU_UUID: "GPU-4c2f8f3e-1b2a-4d3c-9e8f-0a1b2c3d4e5f",
        keys.CAPACITY_POD: "someone-elses-gpu",
    }
    stored = kube.create(pods_path(ns), pod(ns, "forger", annotations={**forged, "team": "a"}))
    assert_mutated(stored)
    annotations = stored["metadata"]["annotations"]
    assert keys.GPU_UUID not in annotations
    assert keys.CAPACITY_POD not in annotations
    assert annotations["team"] == "a"
    delete_capacity(kube, stored)


def test_with_the_webhook_down_pods_are_admitted_unchanged(
    kube: Kube, local_cluster: LocalCluster, opted_in_namespace: str
) -> None:
    """failurePolicy: Ignore (the default): an outage never blocks workloads."""
    ns = opted_in_namespace
    submitted = pod(ns, "during-outage")
    local_cluster.stop_webhook()
    try:
        stored = kube.create(pods_path(ns), copy.deepcopy(submitted))
        assert_as_submitted(stored, submitted)
        assert has_gpu_request(stored)
    finally:
        local_cluster.reinstall_webhook()
    after = kube.create(pods_path(ns), pod(ns, "after-outage"))
    assert_mutated(after)
    delete_capacity(kube, after)


# GPUPolicy objects and GPURecommendations (what the recommender writes).

POLICIES = f"/apis/gpupack.io/v1alpha1/namespaces/{SYSTEM_NAMESPACE}/gpupolicies"


def audit_entry(cluster: LocalCluster | None, uid: str) -> JSON | None:
    """The webhook's audit line for admission `uid`; None without the local cluster."""
    if cluster is None:
        return None
    log = cluster.audit_log

    def find() -> JSON | None:
        for text in log.read_text().splitlines():
            if f'"{uid}"' in text:
                line: JSON = json.loads(text)
                if line.get("uid") == uid:
                    return line
        return None

    entry: JSON = cluster.kube().wait_for(f"the audit line of {uid}", find, timeout=10)
    return entry


@contextlib.contextmanager
def gpupolicy(kube: Kube, name: str, **spec: Any) -> Iterator[JSON]:
    """A GPUPolicy object for the test's duration: a built-in's spec (or real-time's, for
    another name) with `spec` overriding fields; what was there before is put back."""
    path = f"{POLICIES}/{name}"
    try:
        before: JSON | None = kube.get(path)
    except ApiError as exc:
        if exc.status != 404:
            raise
        before = None
    fields = {**policy_spec(BUILTIN.get(name, BUILTIN["real-time"])), **spec}
    obj = {
        "apiVersion": "gpupack.io/v1alpha1",
        "kind": "GPUPolicy",
        "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
        "spec": fields,
    }
    try:
        yield kube.apply(obj)
    finally:
        if before is None:
            kube.delete(path)
        else:
            meta = {
                k: before["metadata"][k]
                for k in ("name", "namespace", "labels")
                if k in before["metadata"]
            }
            kube.apply({**before, "metadata": meta})


def probe(namespace: str, annotations: JSON, **metadata: Any) -> JSON:
    """A dry-run pod: how a test asks what the webhook would do, leaving nothing behind."""
    obj = pod(namespace, "probe", annotations=annotations)
    obj["metadata"].update(metadata)
    return obj


def admitted_compute(kube: Kube, obj: JSON) -> str | None:
    """The gpu-compute annotation the webhook gives `obj` in a dry run; None if denied."""
    try:
        dry = kube.create(pods_path(obj["metadata"]["namespace"]), obj, dry_run=True)
    except ApiError:
        return None
    value: str | None = (dry["metadata"].get("annotations") or {}).get(keys.GPU_COMPUTE)
    return value


def test_a_gpupolicy_object_overrides_the_builtins_initial_allocation(
    kube: Kube, cluster: LocalCluster | None, opted_in_namespace: str
) -> None:
    ns = opted_in_namespace
    annotations = {keys.POLICY: "build"}
    with gpupolicy(kube, "build", initialCompute="300m", initialMemory="3Gi"):
        kube.wait_for(
            "the webhook to see the GPUPolicy",
            lambda: admitted_compute(kube, probe(ns, annotations)) == "300m",
        )
        stored = kube.create(pods_path(ns), pod(ns, "from-gpupolicy", annotations=annotations))
        try:
            assert_mutated(stored, compute="300m")
            assert stored["metadata"]["annotations"][keys.GPU_MEMORY] == "3Gi"
            line = audit_entry(cluster, stored["metadata"]["annotations"][keys.DECISION])
            if line is not None:
                assert (line["policy"], line["policyOrigin"]) == ("build", "GPUPolicy")
                assert (line["compute"], line["memory"]) == ("300m", "3Gi")
                assert line["allocationSource"] == "policy-initial"
        finally:
            delete_capacity(kube, stored)
    kube.wait_for(
        "the webhook to see the built-in again",
        lambda: admitted_compute(kube, probe(ns, annotations)) == "200m",
    )


def test_an_invalid_operator_policy_falls_back_with_a_warning_instead_of_denying(
    kube: Kube, cluster: LocalCluster | None, opted_in_namespace: str
) -> None:
    ns = opted_in_namespace
    annotations = {keys.POLICY: "it-broken"}
    # Valid for the CRD's schema, not for gpupack: the minimum above the initial compute.
    with gpupolicy(kube, "it-broken", minCompute="900m", initialCompute="300m"):
        kube.wait_for(  # unknown policies are denied; an invalid one is admitted
            "the webhook to see the invalid GPUPolicy",
            lambda: admitted_compute(kube, probe(ns, annotations)),
        )
        stored = kube.create(pods_path(ns), pod(ns, "broken-policy", annotations=annotations))
        try:
            assert_mutated(stored, compute="400m")  # a bare pod: near-real-time, built-in
            assert stored["metadata"]["annotations"][keys.POLICY] == "near-real-time"
            line = audit_entry(cluster, stored["metadata"]["annotations"][keys.DECISION])
            if line is not None:
                (warning,) = line["warnings"]
                assert warning.startswith("GPUPolicy it-broken is invalid, the auto-detected")
        finally:
            delete_capacity(kube, stored)


def test_the_workloads_recommendation_sets_its_new_pods_allocation(
    kube: Kube, cluster: LocalCluster | None, opted_in_namespace: str
) -> None:
    ns = opted_in_namespace
    recommended = Recommendation(
        namespace=ns,
        kind="Deployment",
        workload="web",
        policy="near-real-time",
        compute=150,
        memory=2 * 2**30,
        confidence=0.75,
        last_change="2026-11-20T08:00:00Z",
        reason="integration test",
    )
    kube.apply(recommendation_object(recommended, {"samples": 900}))
    template_hash = "5d8f7c9b6"
    like_the_deployments = probe(
        ns,
        {},
        labels={"app": "web", "pod-template-hash": template_hash},
        ownerReferences=[
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"web-{template_hash}",
                "uid": "00000000-0000-4000-8000-000000000000",
                "controller": True,
            }
        ],
    )
    kube.wait_for(
        "the webhook to see the GPURecommendation",
        lambda: admitted_compute(kube, like_the_deployments) == "150m",
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": gpu_spec(ns)},
        },
    }
    kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)
    stored: JSON | None = None
    try:
        stored = wait_for_pods(kube, ns, "web", 1, "the Deployment")[0]
        assert_mutated(stored, compute="150m")
        assert stored["metadata"]["annotations"][keys.GPU_MEMORY] == "2Gi"
        line = audit_entry(cluster, stored["metadata"]["annotations"][keys.DECISION])
        if line is not None:
            assert line["allocationSource"] == (
                f"recommendation GPURecommendation {ns}/deployment-web (confidence 0.75)"
            )
            assert line["recommendation"] == {
                "name": "deployment-web",
                "compute": "150m",
                "memory": "2Gi",
                "confidence": 0.75,
                "lastChange": "2026-11-20T08:00:00Z",
            }
    finally:
        kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/web")
        delete_capacity(kube, stored)


def plan_lookups(cluster: LocalCluster) -> dict[str, float]:
    """The webhook's gpupack_webhook_plan_cache_lookups_total, by result."""
    url = f"http://127.0.0.1:{cluster.webhook_metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gpupack_webhook_plan_cache_lookups_total"
    }


def test_the_pods_of_one_replicaset_share_one_plan(
    kube: Kube, opted_in_namespace: str, local_cluster: LocalCluster
) -> None:
    # The API server gives each pod its own service-account token volume and managed
    # fields before the webhook sees it; the plan must be reused all the same.
    ns = opted_in_namespace
    template = {"metadata": {"labels": {"app": "shared"}}, "spec": gpu_spec(ns)}
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "shared", "namespace": ns},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "shared"}},
            "template": template,
        },
    }
    before = plan_lookups(local_cluster)
    kube.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", replicaset)
    first: JSON | None = None
    try:
        pods = wait_for_pods(kube, ns, "shared", 4, "the ReplicaSet")
        first = pods[0]
        volumes = {v["name"] for p in pods for v in p["spec"]["volumes"]}
        tokens = {name for name in volumes if name.startswith("kube-api-access-")}
        assert len(tokens) == 4  # each pod's token volume has a name of its own
        assert volumes - tokens == {"gpupack-cuda"}  # the memory shim's, stamped on each
        for stored in pods:
            assert_mutated(stored)
        decisions = {p["metadata"]["annotations"][keys.DECISION] for p in pods}
        assert len(decisions) == 4  # one stamp each
        after = plan_lookups(local_cluster)
        assert after.get("miss", 0) - before.get("miss", 0) == 1
        assert after.get("hit", 0) - before.get("hit", 0) >= 3  # a retried create: one more
    finally:
        kube.delete(f"/apis/apps/v1/namespaces/{ns}/replicasets/shared")
        delete_capacity(kube, first)


def webhook_calls(kube: Kube) -> float:
    """How many times the API server has called gpupack's namespaces webhook for a pod
    creation, by its own metric (`apiserver_admission_webhook_admission_duration_seconds`)."""
    text = kube.text("GET", "/metrics", content_type="text/plain")
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "apiserver_admission_webhook_admission_duration_seconds_count"
        and sample.labels.get("name") == "namespaces.gpupack.io"
        and sample.labels.get("operation") == "CREATE"
    )


def test_a_rewritten_pod_costs_one_webhook_call_where_the_api_server_adds_tolerations(
    kube: Kube, opted_in_namespace: str, local_cluster: LocalCluster
) -> None:
    """The local API server runs ExtendedResourceToleration, as managed clusters do: it
    tolerates every extended resource a pod asks, and runs again after a webhook changed
    the pod. The webhook writes the tolerations of the shares it charges itself, so that
    second run finds nothing to add and the API server does not call the webhook again:
    one call per pod, by the API server's count, and each toleration stored once."""
    ns = opted_in_namespace
    charged = [
        {"key": resource, "operator": "Exists", "effect": "NoSchedule"}
        for resource in (keys.RESOURCE_COMPUTE, keys.RESOURCE_MEMORY)
    ]
    mine = {"key": keys.RESOURCE_MEMORY, "operator": "Exists", "effect": "NoSchedule"}
    names = ("once-a", "once-b", "once-c")
    before = webhook_calls(kube)
    stored = []
    try:
        for name in names:
            obj = pod(ns, name)
            if name == "once-c":  # one of them already tolerates a charged share
                obj["spec"]["tolerations"].append(mine)
            stored.append(kube.create(pods_path(ns), obj))
        calls = webhook_calls(kube) - before
        for item in stored:
            assert_mutated(item)
            tolerations = item["spec"]["tolerations"]
            for toleration in [*charged, isolate(ns)]:
                assert tolerations.count(toleration) == 1, tolerations
            gpu = {"key": keys.NVIDIA_GPU, "operator": "Exists", "effect": "NoSchedule"}
            assert gpu in tolerations, tolerations  # the plugin's, before the webhook
        assert calls == len(names), f"{calls} webhook calls for {len(names)} pods"
        for item in stored:
            line = audit_entry(local_cluster, item["metadata"]["annotations"][keys.DECISION])
            assert line is not None
            assert line["reason"] == "mutated", line
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                kube.delete(f"{pods_path(ns)}/{name}")
        delete_capacity(kube, stored[0] if stored else None)
