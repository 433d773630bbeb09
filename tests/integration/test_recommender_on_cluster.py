"""Rightsizing end to end on a real control plane: measured usage becomes a
GPURecommendation, the webhook gives the workload's next pods the smaller allocation,
and the scheduler packs them onto fewer GPUs.

Usage takes the path the exporter's metrics take in a cluster: the exporter's own
sampler, PID-to-pod mapping, collector and HTTP server run in this process, over a fake
NVML (doubles/nvml.py) whose processes belong, through a fake /proc, to
the test's pods; `gpupack-recommender` (a real process, with the chart's RBAC) scrapes
it. kwok nodes run no containers, so the fake processes stand in for them.
"""

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from doubles.nvml import GiB
from gpupack import keys
from gpupack.quantity import format_memory, parse_compute, parse_memory
from gpupack.recommendation import list_path, object_name
from hack.localcluster import (
    SYSTEM_NAMESPACE,
    Kube,
    LocalCluster,
    SimulatedGpuAssigner,
)
from tests.integration.fakenode import FakeNode
from tests.integration.workloads import deployment

pytestmark = pytest.mark.integration

JSON = dict[str, Any]
NODE = "gpu-a100-3"
ON_NODE = {"kubernetes.io/hostname": NODE}
GPUS = 8
POLICIES = f"/apis/gpupack.io/v1alpha1/namespaces/{SYSTEM_NAMESPACE}/gpupolicies"
# Headroom off: the test counts the GPUs rightsizing empties (all of them go).
SCHEDULER_ARGS = ["--grace-period=3", "--headroom-pods=0", "--retry-period=1"]
WINDOW = 60  # the test policies' history window: full confidence after a minute


@pytest.fixture(scope="module")
def fake_node(
    cluster: LocalCluster | None,
    gpu_assigner: SimulatedGpuAssigner | None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FakeNode]:
    if cluster is None:
        pytest.skip("feeds usage through an exporter over a fake NVML: needs the local cluster")
    node = FakeNode(cluster, NODE, GPUS, tmp_path_factory.mktemp("proc"))
    node.start()
    cluster.install_scheduler(extra_args=SCHEDULER_ARGS)
    cluster.install_recommender(
        extra_args=[
            f"--exporter-url={node.url}",
            "--interval=1",
            "--checkpoint-interval=2",
            "--rollout-cooldown=3600",
            "--lease-duration=4",
            "--renew-deadline=3",
            "--retry-period=1",
            "--log-level=debug",
        ]
    )
    yield node
    cluster.stop_recommender()
    cluster.stop_scheduler()
    node.stop()


def policy(name: str, *, initial_memory: str, update_mode: str) -> JSON:
    return {
        "apiVersion": "gpupack.io/v1alpha1",
        "kind": "GPUPolicy",
        "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
        "spec": {
            "description": "integration test: a one-minute history",
            "historyWindowSeconds": WINDOW,
            "percentile": 90,
            "computeHeadroom": 0.1,
            "memoryHeadroom": 0.1,
            "minCompute": "100m",
            "maxCompute": "1",
            "initialCompute": "1",
            "minMemory": "1Gi",
            "initialMemory": initial_memory,
            "sharing": "shared",
            "updateMode": update_mode,
        },
    }


@pytest.fixture
def make_policy(kube: Kube) -> Iterator[Callable[..., str]]:
    created: list[str] = []

    def make(name: str, **kw: Any) -> str:
        kube.apply(policy(name, **kw))
        created.append(name)
        return name

    yield make
    for name in created:
        kube.delete(f"{POLICIES}/{name}")


def webhook_knows(kube: Kube, ns: str, policy_name: str) -> Callable[[], bool]:
    """The webhook's cache has the GPUPolicy: a dry-run pod naming it is admitted."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": ns, "annotations": {keys.POLICY: policy_name}},
        "spec": {
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        },
    }

    def check() -> bool:
        try:
            admitted = kube.create(f"/api/v1/namespaces/{ns}/pods", pod, dry_run=True)
        except Exception:
            return False
        return bool(admitted["metadata"].get("annotations", {}).get(keys.GPU_COMPUTE))

    return check


def running(kube: Kube, ns: str, app: str) -> list[JSON]:
    pods = kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"app={app}")["items"]
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and p["status"].get("phase") == "Running"
        and (p["metadata"].get("annotations") or {}).get(keys.GPU_UUID)
    ]


def gpus_used(pods: list[JSON]) -> set[str]:
    return {p["metadata"]["annotations"][keys.GPU_UUID] for p in pods}


def capacity_held(kube: Kube, ns: str, app: str) -> int:
    """Capacity pods (GPUs held) of the app's pool: they inherit its isolating toleration."""
    pods = kube.get(
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", labelSelector=f"{keys.ROLE}=capacity"
    )["items"]
    mark = f"{ns}-{app}"
    return sum(
        1
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(t.get("value") == mark for t in p["spec"].get("tolerations") or [])
    )


def recommendation(kube: Kube, ns: str, app: str) -> JSON | None:
    try:
        obj: JSON = kube.get(f"{list_path(ns)}/{object_name('Deployment', app)}")
    except Exception:
        return None
    return obj


def settle(kube: Kube, ns: str, app: str, count: int, timeout: float = 90) -> list[JSON]:
    """Exactly `count` Running, placed pods, none terminating."""

    def check() -> list[JSON] | None:
        pods = kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"app={app}")["items"]
        placed = running(kube, ns, app)
        return placed if len(pods) == count and len(placed) == count else None

    result: list[JSON] = kube.wait_for(f"{count} pods of {app} running", check, timeout=timeout)
    return result


def restart(kube: Kube, ns: str, app: str) -> None:
    """`kubectl rollout restart`: the workload's next pods."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {
        "spec": {
            "template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}}
        }
    }
    kube.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/{app}", body)


def test_a_workload_using_a_quarter_gpu_is_rightsized_onto_fewer_gpus_and_keeps_its_history(
    fake_node: FakeNode,
    local_cluster: LocalCluster,
    kube: Kube,
    opted_in_namespace: str,
    make_policy: Callable[..., str],
) -> None:
    ns, app = opted_in_namespace, "infer"
    name = make_policy("it-rightsize", initial_memory="12Gi", update_mode="Initial")
    kube.wait_for("the webhook to see the GPUPolicy", webhook_knows(kube, ns, name), timeout=30)
    fake_node.usage[app] = (0.25, int(2.5 * GiB))
    kube.create(
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        deployment(ns, app, 3, None, policy=name, node_selector=ON_NODE),
    )

    before = settle(kube, ns, app, 3)
    assert {p["metadata"]["annotations"][keys.GPU_COMPUTE] for p in before} == {"1"}
    assert len(gpus_used(before)) == 3
    kube.wait_for("3 GPUs held", lambda: capacity_held(kube, ns, app) == 3, timeout=30)

    # History accumulates; a restarted recommender picks it up from the checkpoint.
    first = kube.wait_for(
        "a recommendation with some history",
        lambda: (r := recommendation(kube, ns, app)) and r["status"]["samples"] >= 15 and r,
        timeout=60,
    )
    local_cluster.stop_recommender()
    saved = recommendation(kube, ns, app)
    assert saved is not None
    assert saved["status"]["samples"] >= first["status"]["samples"]
    local_cluster.install_recommender(
        extra_args=[
            f"--exporter-url={fake_node.url}",
            "--interval=1",
            "--checkpoint-interval=2",
            "--lease-duration=4",
            "--renew-deadline=3",
            "--retry-period=1",
        ]
    )
    resumed = kube.wait_for(
        "the restarted recommender to add to the saved history",
        lambda: (
            (r := recommendation(kube, ns, app))
            and r["status"]["samples"] > saved["status"]["samples"]
            and r
        ),
        timeout=60,
    )
    assert resumed["status"]["firstSample"] == first["status"]["firstSample"]

    # A full window of a quarter GPU: 0.25 (bucket 0.26) x 1.1 = 290m; 2.5Gi x 1.1 -> 3Gi.
    final = kube.wait_for(
        "a full-confidence recommendation",
        lambda: (
            (r := recommendation(kube, ns, app))
            and r["status"]["confidence"] >= 1.0
            and parse_memory(r["status"]["memory"], "memory") <= 3 * GiB
            and r
        ),
        timeout=WINDOW + 60,
    )
    status = final["status"]
    assert status["policy"] == name
    compute, memory = parse_compute(status["compute"], "c"), parse_memory(status["memory"], "m")
    assert 250 < compute <= 300, status
    assert int(2.5 * GiB) < memory <= 3 * GiB, status
    assert status["running"] == {"pods": 3, "compute": "1", "memory": "12Gi"}

    restart(kube, ns, app)
    kube.wait_for(
        "the old pods to be replaced",
        lambda: (
            (pods := running(kube, ns, app))
            and len(pods) == 3
            and all(p["metadata"]["annotations"][keys.GPU_COMPUTE] != "1" for p in pods)
        ),
        timeout=90,
    )
    after = settle(kube, ns, app, 3)
    assert {p["metadata"]["annotations"][keys.GPU_COMPUTE] for p in after} == {status["compute"]}
    assert {p["metadata"]["annotations"][keys.GPU_MEMORY] for p in after} == {format_memory(memory)}
    assert len(gpus_used(after)) == 1  # 3 x 290m on one GPU
    kube.wait_for(
        "the empty GPUs to be released", lambda: capacity_held(kube, ns, app) == 1, timeout=60
    )
    audit = local_cluster.audit_log.read_text()
    assert f"GPURecommendation {ns}/{object_name('Deployment', app)}" in audit
    print(
        f"{ns}/{app}: 3 pods at 1 / 12Gi on {len(gpus_used(before))} GPUs; recommendation "
        f"{status['compute']} / {status['memory']}; 3 pods on {len(gpus_used(after))} GPU"
    )


def test_memory_near_its_allocation_restarts_an_auto_workload_with_more_memory(
    fake_node: FakeNode,
    kube: Kube,
    opted_in_namespace: str,
    make_policy: Callable[..., str],
) -> None:
    ns, app = opted_in_namespace, "grow"
    name = make_policy("it-auto", initial_memory="4Gi", update_mode="Auto")
    kube.wait_for("the webhook to see the GPUPolicy", webhook_knows(kube, ns, name), timeout=30)
    fake_node.usage[app] = (0.5, int(3.8 * GiB))  # 95 % of 4Gi
    kube.create(
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        deployment(ns, app, 1, None, policy=name, node_selector=ON_NODE),
    )
    before = settle(kube, ns, app, 1)
    assert before[0]["metadata"]["annotations"][keys.GPU_MEMORY] == "4Gi"

    rec = kube.wait_for(
        "a recommendation raised for memory pressure",
        lambda: (r := recommendation(kube, ns, app)) and r["status"].get("lastRollout") and r,
        timeout=60,
    )
    raised = parse_memory(rec["status"]["memory"], "memory")
    assert raised >= int(4 * GiB * 1.2), rec["status"]
    assert "memory at" in rec["status"]["reason"]
    assert rec["status"]["rolloutMessage"].startswith("restarted at")
    kube.wait_for(
        "the workload's pod to be replaced with more memory",
        lambda: (
            (pods := running(kube, ns, app))
            and len(pods) == 1
            and parse_memory(pods[0]["metadata"]["annotations"][keys.GPU_MEMORY], "m") == raised
        ),
        timeout=90,
    )
    deployment_now = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{app}")
    template = deployment_now["spec"]["template"]["metadata"]["annotations"]
    assert keys.RESTARTED_AT in template


def test_an_invalid_gpupolicy_gets_a_status_saying_why(kube: Kube, fake_node: FakeNode) -> None:
    bad = policy("it-invalid", initial_memory="12Gi", update_mode="Initial")
    bad["spec"]["minCompute"] = "2"  # more than one GPU: schema-valid, semantically wrong
    kube.apply(bad)
    try:
        status = kube.wait_for(
            "the recommender to mark the policy invalid",
            lambda: kube.get(f"{POLICIES}/it-invalid").get("status"),
            timeout=30,
        )
        assert status["valid"] == "False"
        assert "spec.minCompute" in status["message"]
    finally:
        kube.delete(f"{POLICIES}/it-invalid")
