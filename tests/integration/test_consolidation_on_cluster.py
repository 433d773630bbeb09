"""Consolidation against a real control plane: a pool fragmented by scaling a Deployment
down is packed again and its capacity pods released; a PodDisruptionBudget that allows
no disruption and a Job's pod keep their GPUs; no workload is moved past its budget.

The scheduler runs with the chart's arguments and a consolidation round every second;
the policy `consolidate-it` (a GPUPolicy object, as an operator would write one) allows
consolidation with a budget of one eviction per workload per 10 seconds. Each test
fragments a pool of its own: a Deployment of large shares takes one GPU per pod, the
small shares fill the room left beside them, one per GPU, and the large ones are then
scaled to zero.
"""

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from gpupack import keys
from hack.localcluster import Kube, LocalCluster, SimulatedGpuAssigner
from tests.integration import workloads
from tests.integration.scheduling import (
    FAST,
    FAST_LEASE,
    capacity_pods,
    consolidating_policy,
    create,
    events,
    pods_of,
    scheduler_metric,
    wait_bound,
)
from tests.integration.workloads import deployment

pytestmark = pytest.mark.integration
JSON = dict[str, Any]
POLICY = "consolidate-it"
WINDOW = 10
HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture(scope="module")
def consolidating(
    cluster: LocalCluster | None, gpu_assigner: SimulatedGpuAssigner | None
) -> Iterator[LocalCluster]:
    if cluster is None:
        pytest.skip("runs the scheduler with test timings: needs the local cluster")
    kube = cluster.kube()
    delete_policy = consolidating_policy(kube, POLICY, WINDOW)
    cluster.install_scheduler(
        extra_args=FAST, sets=[*FAST_LEASE, "scheduler.consolidation.intervalSeconds=1"]
    )
    try:
        yield cluster
    finally:
        cluster.stop_scheduler()
        delete_policy()


def in_pool(obj: JSON, pool: str) -> JSON:
    return workloads.in_pool(obj, pool, POLICY)


def pool_capacity(kube: Kube, pods: list[JSON]) -> set[str]:
    """The capacity pods still there among those holding `pods`' GPUs."""
    holders = {p["metadata"]["annotations"][keys.CAPACITY_POD] for p in pods}
    return holders & set(capacity_pods(kube))


def fragment(kube: Kube, ns: str, small: list[JSON], big: int, share: str) -> list[JSON]:
    """`big` pods of `share` (one per GPU), then `small` workloads beside them, then the
    big ones gone: the small pods, one per GPU."""
    create(kube, in_pool(deployment(ns, "big", big, share), f"{ns}-pool"))
    wait_bound(kube, ns, "big", big, timeout=90)
    placed: list[JSON] = []
    for obj in small:
        path = "batch/v1/namespaces/{ns}/jobs" if obj["kind"] == "Job" else None
        if path is None:
            create(kube, obj)
        else:
            kube.create(f"/apis/{path.format(ns=ns)}", obj)
        app = obj["spec"]["template"]["metadata"]["labels"]["app"]
        count = obj["spec"].get("replicas", obj["spec"].get("parallelism", 1))
        placed += wait_bound(kube, ns, app, count, timeout=60)
    gpus = {p["metadata"]["annotations"][keys.GPU_UUID] for p in placed}
    assert len(gpus) == len(placed), "the small shares start one per GPU"
    kube.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/big", {"spec": {"replicas": 0}})
    kube.wait_for("the big pods gone", lambda: not pods_of(kube, ns, "big"), timeout=60)
    return placed


def test_a_pool_fragmented_by_a_scale_down_is_packed_again_within_the_budget(
    kube: Kube, opted_in_namespace: str, consolidating: LocalCluster
) -> None:
    ns = opted_in_namespace
    small = in_pool(deployment(ns, "small", 3, "300m"), f"{ns}-pool")
    placed = fragment(kube, ns, [small], big=3, share="600m")
    held = pool_capacity(kube, placed)
    assert len(held) == 3

    def packed() -> list[JSON] | None:
        pods = pods_of(kube, ns, "small")
        ready = [p for p in pods if p["spec"].get("nodeName")]
        gpus = {p["metadata"]["annotations"].get(keys.GPU_UUID) for p in ready}
        return ready if len(ready) == 3 and len(gpus) == 1 else None

    pods = kube.wait_for("the three small shares on one GPU", packed, timeout=120)
    kube.wait_for(
        "the two emptied capacity pods released",
        lambda: len(pool_capacity(kube, placed)) == 1,
        timeout=60,
    )
    assert pool_capacity(kube, pods) <= held
    moved = events(kube, ns, "GPUConsolidation")
    assert len(moved) == 2
    assert all("its controller recreates it" in e["note"] for e in moved)
    # One eviction of the workload per window: the second came a window after the first.
    times = sorted(datetime.fromisoformat(e["eventTime"].replace("Z", "+00:00")) for e in moved)
    assert (times[1] - times[0]).total_seconds() >= WINDOW - 1


def test_a_pod_its_budget_protects_and_a_jobs_pod_keep_their_gpus(
    kube: Kube, opted_in_namespace: str, consolidating: LocalCluster
) -> None:
    ns = opted_in_namespace
    guarded = in_pool(deployment(ns, "guarded", 1, "200m"), f"{ns}-pool")
    job_template = in_pool(deployment(ns, "job", 1, "200m"), f"{ns}-pool")["spec"]["template"]
    job_template["spec"]["restartPolicy"] = "Never"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "job", "namespace": ns},
        "spec": {"parallelism": 1, "completions": 1, "template": job_template},
    }
    kube.create(
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded", "namespace": ns},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    placed = fragment(kube, ns, [guarded, job], big=2, share="800m")
    names = {p["metadata"]["name"] for p in placed}
    refused = 'gpupack_scheduler_consolidation_evictions_total{result="refused"}'

    kube.wait_for(
        "consolidation trying to move the guarded pod, and its PodDisruptionBudget refusing",
        lambda: (scheduler_metric(consolidating, refused) or 0) >= 1,
        timeout=60,
    )
    time.sleep(2 * WINDOW)  # two more budget windows of one-second rounds

    now = {p["metadata"]["name"] for p in pods_of(kube, ns, "guarded") + pods_of(kube, ns, "job")}
    assert now == names, "neither pod was evicted"
    assert len(pool_capacity(kube, placed)) == 2
    assert events(kube, ns, "GPUConsolidation") == []
    blocked = events(kube, ns, "GPUConsolidationBlocked")
    assert blocked, "the refusal is told on the pod"
    assert {e["regarding"]["name"] for e in blocked} == {
        p["metadata"]["name"] for p in pods_of(kube, ns, "guarded")
    }


def test_a_deployment_that_shrinks_loses_the_pods_on_its_emptiest_gpu_which_then_goes(
    kube: Kube, opted_in_namespace: str, consolidating: LocalCluster
) -> None:
    """A 700m pod of another workload holds GPU A; of four 300m web pods, one fills A and
    three share GPU B. The scheduler keeps each web pod's pod-deletion-cost at its GPU's
    fill (A 1000, B 900), so when web shrinks to one, the ReplicaSet deletes B's three
    and B's capacity pod goes: no eviction, no GPU thinned. (Both are batch pods, which
    consolidation may move, but the pool needs both GPUs until the scale-down.)"""
    ns = opted_in_namespace
    pool = f"{ns}-pool"
    create(kube, workloads.in_pool(deployment(ns, "filler", 1, "700m"), pool))
    (filler,) = wait_bound(kube, ns, "filler", 1, timeout=90)
    create(kube, workloads.in_pool(deployment(ns, "web", 4, "300m"), pool))
    web = wait_bound(kube, ns, "web", 4, timeout=90)
    a = filler["metadata"]["annotations"][keys.GPU_UUID]
    beside = [p for p in web if p["metadata"]["annotations"][keys.GPU_UUID] == a]
    assert len(beside) == 1, "one web pod fills the room beside the filler"

    def costed() -> dict[str, str] | None:
        pods = pods_of(kube, ns, "web")
        found = {
            p["metadata"]["name"]: p["metadata"]["annotations"].get(keys.POD_DELETION_COST, "")
            for p in pods
        }
        return found if sorted(found.values()) == ["1000", "900", "900", "900"] else None

    costs = kube.wait_for("each web pod's cost at its GPU's fill", costed, timeout=60)
    assert costs[beside[0]["metadata"]["name"]] == "1000"
    b_holder = {p["metadata"]["annotations"][keys.CAPACITY_POD] for p in web} - {
        filler["metadata"]["annotations"][keys.CAPACITY_POD]
    }

    kube.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/web", {"spec": {"replicas": 1}})

    kube.wait_for("web down to one pod", lambda: len(pods_of(kube, ns, "web")) == 1, timeout=60)
    (left,) = pods_of(kube, ns, "web")
    assert left["metadata"]["name"] == beside[0]["metadata"]["name"]
    kube.wait_for(
        "GPU B's capacity pod released",
        lambda: not (b_holder & set(capacity_pods(kube))),
        timeout=60,
    )
    assert events(kube, ns, "GPUConsolidation") == []


def test_a_node_kept_by_one_gpu_is_emptied_onto_a_whole_gpu_of_a_node_the_pool_uses(
    kube: Kube, opted_in_namespace: str, consolidating: LocalCluster
) -> None:
    """Relocation. `big` (three 900m pods) holds three GPUs of one node, A; with A cordoned,
    `lone` (900m, the same pool) gets a GPU on B. The pool needs its four GPUs, so no GPU
    can be emptied onto another, but A has whole GPUs nobody holds: `lone` moves to a new
    GPU there, and B holds nothing of the pool any more (an autoscaler could remove it)."""
    ns = opted_in_namespace
    nodes = ["gpu-a100-2", "gpu-a100-3"]
    term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": nodes}]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }

    def on_two_nodes(name: str, replicas: int) -> JSON:
        made = in_pool(deployment(ns, name, replicas, "900m"), f"{ns}-pool")
        made["spec"]["template"]["spec"]["affinity"] = affinity
        return made

    create(kube, on_two_nodes("big", 1))
    wait_bound(kube, ns, "big", 1, timeout=90)
    kube.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/big", {"spec": {"replicas": 3}})
    big = wait_bound(kube, ns, "big", 3, timeout=90)
    (a,) = {p["spec"]["nodeName"] for p in big}  # the capacity profile packs one node
    holder = capacity_pods(kube)[big[0]["metadata"]["annotations"][keys.CAPACITY_POD]]
    pool = holder["metadata"]["labels"][keys.POOL]
    (b,) = set(nodes) - {a}
    kube.merge_patch(f"/api/v1/nodes/{a}", {"spec": {"unschedulable": True}})
    try:
        create(kube, on_two_nodes("lone", 1))
        (lone,) = wait_bound(kube, ns, "lone", 1, timeout=90)
        assert lone["spec"]["nodeName"] == b
    finally:
        kube.merge_patch(f"/api/v1/nodes/{a}", {"spec": {"unschedulable": None}})

    def moved() -> JSON | None:
        pods = [p for p in pods_of(kube, ns, "lone") if p["spec"].get("nodeName")]
        return pods[0] if pods and pods[0]["spec"]["nodeName"] == a else None

    kube.wait_for("lone moved onto node A", moved, timeout=120)

    def on_b() -> list[str]:
        return [
            name
            for name, c in capacity_pods(kube).items()
            if c["spec"].get("nodeName") == b and c["metadata"]["labels"].get(keys.POOL) == pool
        ]

    kube.wait_for("node B holding none of the pool's GPUs", lambda: not on_b(), timeout=60)
    (event,) = events(kube, ns, "GPUConsolidation")
    assert f"node {b} holds only 1 GPU(s)" in event["note"]
    assert f"a new GPU on node {a}" in event["note"]
