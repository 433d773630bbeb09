"""gpupack's capacity pods meet a real autoscaler: Karpenter's kwok provider, in a cluster
that starts with no GPU node at all (hack/localcluster/karpenter.py).

A capacity pod is a GPU someone pays for: when it cannot be placed, the autoscaler buys
the node it needs, and the fractional pods it was made for then run on that GPU. While
its GPU hosts shares, Karpenter must not take the node away; once gpupack releases it,
the node goes. A pod no new node could help (its required pod affinity names a full
node) makes Karpenter buy nothing.

The tests share one cluster and run in order: each leaves no node behind."""

import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpupack import keys
from gpupack.capacity import CREATED_FOR
from hack.localcluster import Kube, LocalCluster, SimulatedGpuAssigner
from hack.localcluster.karpenter import IGNORED, Karpenter
from tests.integration.scheduling import (
    FAST,
    FAST_LEASE,
    capacity_pods,
    consolidating_policy,
    create,
    events,
    wait_bound,
)
from tests.integration.tools import cluster_of_its_own
from tests.integration.workloads import TOLERATE_GPUS, deployment, gpu_pod, in_pool

pytestmark = pytest.mark.integration
JSON = dict[str, Any]
HOSTNAME = "kubernetes.io/hostname"
CONSOLIDATING = "consolidate-karpenter"
# Karpenter batches pending pods for at most this long, then decides (seconds).
KARPENTER_BATCH = 10.0
# Karpenter publishes one DisruptionBlocked event per node every two minutes whatever its
# reason (events.defaultDedupeTimeout, keyed on the node's UID alone), and weighs every
# node, settled or not, every ten seconds: its first verdict on a node it just bought may
# be one of these passing reasons, which hides the next one for that long (seconds).
KARPENTER_DEDUPE = 120.0
SETTLING = (
    "isn't initialized",
    "is nominated for a pending pod",
    "does not have an associated node",
)


@pytest.fixture(scope="module")
def autoscaled(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[tuple[LocalCluster, Karpenter]]:
    with cluster_of_its_own(tmp_path_factory, cluster, "karpenter", node_pools=()) as local:
        local.install_webhook()
        delete_policy = consolidating_policy(local.kube(), CONSOLIDATING, 10, evictions=3)
        karpenter = Karpenter(local).start()  # before gpupack: its --autoscaler=auto finds it
        local.install_scheduler(
            extra_args=FAST, sets=[*FAST_LEASE, "scheduler.consolidation.intervalSeconds=1"]
        )
        local.exporter_kubeconfig()  # the chart's RBAC for the node agents
        try:
            with SimulatedGpuAssigner(local.kube(), agent=local.node_agent):
                yield local, karpenter
        finally:
            karpenter.stop()
            delete_policy()


def test_a_capacity_pod_no_node_can_take_makes_karpenter_buy_a_gpu_node_the_share_runs_on(
    autoscaled: tuple[LocalCluster, Karpenter],
) -> None:
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    assert karpenter.nodes() == []
    ns = kube.create_namespace("it-karpenter", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    infer = deployment(ns, "infer", 1, memory="8Gi", tolerations=TOLERATE_GPUS)
    kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", infer)

    def running_share() -> dict[str, Any] | None:
        for pod in kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
            if pod["spec"].get("nodeName") and pod.get("status", {}).get("phase") == "Running":
                return dict(pod)
        return None

    pod = kube.wait_for("the share placed on a node Karpenter bought", running_share, timeout=120)
    bought = {n["metadata"]["name"]: n for n in karpenter.nodes()}
    # One node, for the capacity pod. The waiting share asks gpupack's extended resources
    # (gpu-compute-milli, gpu-memory), which no instance type offers: Karpenter logs that
    # it cannot help it and buys nothing for it.
    assert len(bought) == 1, sorted(bought)
    assert pod["spec"]["nodeName"] in bought
    node = bought[pod["spec"]["nodeName"]]
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    capacity = kube.get(
        f"/api/v1/namespaces/{cluster.namespace}/pods", labelSelector=f"{keys.ROLE}=capacity"
    )["items"]
    assert [c["spec"]["nodeName"] for c in capacity] == [pod["spec"]["nodeName"]]
    assert (
        pod["metadata"]["annotations"][keys.GPU_UUID]
        == (capacity[0]["metadata"]["annotations"][keys.GPU_UUID])
    )


def test_karpenter_never_disrupts_a_node_whose_capacity_pod_hosts_a_share(
    autoscaled: tuple[LocalCluster, Karpenter],
) -> None:
    """The node bought above is under-used (one GPU of eight), so Karpenter weighs
    consolidating it; the hosting capacity pod's karpenter.sh/do-not-disrupt blocks it,
    and Karpenter says so on the node."""
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    nodes, held = karpenter.nodes(), list(capacity_pods(kube).values())
    assert (len(nodes), len(held)) == (1, 1), karpenter.story(cluster.namespace)
    name, capacity = nodes[0]["metadata"]["name"], held[0]
    assert capacity["metadata"]["annotations"][keys.KARPENTER_DO_NOT_DISRUPT] == "true"

    def verdicts() -> list[str] | None:
        found = [
            e.get("message", "")
            for e in kube.get("/api/v1/events", fieldSelector=f"involvedObject.name={name}")[
                "items"
            ]
            if e.get("reason") == "DisruptionBlocked"
        ]
        return found or None

    def refused() -> list[str] | None:
        return [m for m in verdicts() or () if keys.KARPENTER_DO_NOT_DISRUPT in m] or None

    first = kube.wait_for("Karpenter to weigh the node", verdicts, timeout=120)
    if not refused():
        # Karpenter weighed the node while it was still settling; it says nothing more
        # about this node until its two-minute dedupe has passed, then names the pod.
        assert all(any(s in m for s in SETTLING) for m in first), first
        kube.wait_for(
            "Karpenter to refuse to disrupt the node", refused, timeout=KARPENTER_DEDUPE + 60
        )
    assert [n["metadata"]["name"] for n in karpenter.nodes()] == [name]
    [still] = capacity_pods(kube).values()
    assert still["metadata"]["uid"] == capacity["metadata"]["uid"]


def test_once_the_share_is_gone_gpupack_releases_its_gpu_and_karpenter_removes_the_node(
    autoscaled: tuple[LocalCluster, Karpenter],
) -> None:
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    [capacity] = capacity_pods(kube).values()
    workload = capacity["metadata"]["annotations"][CREATED_FOR]  # NS/Deployment/infer
    ns, _, name = workload.partition("/Deployment/")
    kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")

    kube.wait_for("the empty capacity pod released", lambda: not capacity_pods(kube), timeout=60)
    kube.wait_for("Karpenter to remove the empty node", lambda: not karpenter.nodes(), timeout=120)


def test_a_pod_that_must_sit_next_to_a_pod_on_a_full_node_makes_karpenter_buy_nothing(
    autoscaled: tuple[LocalCluster, Karpenter],
) -> None:
    """`near-db` must run on the node of `db` (required pod affinity on the hostname),
    whose eight GPUs are all held. A GPU on any other node, bought or not, would be
    wasted: its capacity pod carries that affinity, Karpenter finds no node that
    satisfies it and buys none, and the pod waits with gpupack's reason."""
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    ns = kube.create_namespace("it-karpenter-near", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    create(kube, deployment(ns, "db", 1, memory="8Gi", tolerations=TOLERATE_GPUS))
    kube.wait_for("db running on a bought node", lambda: _bound(kube, ns, "db"), timeout=120)
    [node] = karpenter.nodes()
    name = node["metadata"]["name"]
    whole = kube.create_namespace("it-karpenter-whole")  # not opted in: whole GPUs
    for index in range(7):
        filler = gpu_pod(f"filler-{index}")
        filler["spec"] |= {"nodeName": name, "tolerations": TOLERATE_GPUS}
        kube.create(f"/api/v1/namespaces/{whole}/pods", filler)
    near = deployment(ns, "near-db", 1, memory="8Gi", tolerations=TOLERATE_GPUS)
    term = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOSTNAME}
    near["spec"]["template"]["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    try:
        create(kube, near)

        def refused() -> JSON | None:
            for pod in kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=near-db")[
                "items"
            ]:
                for condition in pod.get("status", {}).get("conditions", []):
                    if condition["type"] == "PodScheduled" and "gpupack" in condition.get(
                        "message", ""
                    ):
                        return dict(pod)
            return None

        kube.wait_for("near-db refused by gpupack", refused, timeout=60)
        waiting = [c for c in capacity_pods(kube).values() if not c["spec"].get("nodeName")]
        assert len(waiting) == 1, sorted(c["metadata"]["name"] for c in waiting)  # bounded

        def weighed() -> list[JSON] | None:
            return [
                e
                for e in karpenter.refusals(cluster.namespace)
                if e["involvedObject"]["name"] == waiting[0]["metadata"]["name"]
            ] or None

        # Karpenter simulated the capacity pod and found nothing to buy for it (not a pod
        # it dropped unread, which would buy nothing too).
        verdicts = kube.wait_for("Karpenter's verdict on the capacity pod", weighed, timeout=60)
        assert all(IGNORED not in e["message"] for e in verdicts), verdicts
        time.sleep(KARPENTER_BATCH)  # a quiet window: Karpenter must buy nothing in it
        assert [n["metadata"]["name"] for n in karpenter.nodes()] == [name]
        assert len(karpenter.claims()) == 1  # the db node's: none bought for near-db
        assert not _bound(kube, ns, "near-db")
        affinity = waiting[0]["spec"]["affinity"]["podAffinity"]
        assert affinity["requiredDuringSchedulingIgnoredDuringExecution"] == [
            {**term, "namespaces": [ns]}
        ]
    finally:
        kube.delete(f"/api/v1/namespaces/{whole}")
        kube.delete(f"/api/v1/namespaces/{ns}")
    kube.wait_for("Karpenter to remove the node", lambda: not karpenter.nodes(), timeout=180)


def test_consolidation_empties_the_node_holding_fewest_gpus_and_karpenter_removes_it(
    autoscaled: tuple[LocalCluster, Karpenter],
) -> None:
    """Nine 600m pods need nine GPUs: Karpenter buys two eight-GPU nodes. Nine 300m pods
    of another Deployment fill the room beside them, one per GPU; then the 600m ones
    are scaled to zero. The pool holds nine GPUs where its shares need three: the
    policy allows consolidation, which empties the GPUs of the node holding fewest
    first, and once that node holds no capacity pod, Karpenter removes it."""
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    ns = kube.create_namespace("it-karpenter-churn", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    try:
        for name, replicas, share in (("big", 9, "600m"), ("small", 9, "300m")):
            made = deployment(ns, name, replicas, share, tolerations=TOLERATE_GPUS)
            create(kube, in_pool(made, f"{ns}-pool", CONSOLIDATING))
            wait_bound(kube, ns, name, replicas, timeout=180)
        bought = {n["metadata"]["name"] for n in karpenter.nodes()}
        assert len(bought) == 2, sorted(bought)
        kube.merge_patch(
            f"/apis/apps/v1/namespaces/{ns}/deployments/big", {"spec": {"replicas": 0}}
        )

        def one_node_left() -> set[str] | None:
            left = {n["metadata"]["name"] for n in karpenter.nodes()}
            return left if len(left) == 1 else None

        [kept] = kube.wait_for("Karpenter to remove the emptied node", one_node_left, timeout=240)
        assert kept in bought
        assert events(kube, ns, "GPUConsolidation"), "the shares were moved by consolidation"
        small = kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=small")["items"]
        assert {p["spec"].get("nodeName") for p in small if p["spec"].get("nodeName")} == {kept}
    finally:
        kube.delete(f"/api/v1/namespaces/{ns}")
    kube.wait_for("Karpenter to remove the last node", lambda: not karpenter.nodes(), timeout=180)


def _bound(kube: Kube, ns: str, app: str) -> bool:
    pods = kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"app={app}")["items"]
    return bool(pods) and all(p["spec"].get("nodeName") for p in pods)
