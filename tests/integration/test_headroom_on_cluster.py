"""Capacity that follows demand, against a real control plane: a GPU a departure empties is
given back after the chart's short grace period when the pool has room elsewhere, kept
while the pool needs it as room for its next pod (and used by that pod), and given back
at once on a node an autoscaler is removing, where kube-scheduler then places nothing.

The scheduler runs with the chart's grace period (15 s) and headroom (one pod); the
other timings are the tests' (`FAST`). Each test is a pool of its own (`in_pool`)."""

from collections.abc import Iterator
from typing import Any

import pytest

from gpupack import keys
from hack.localcluster import Kube, LocalCluster, SimulatedGpuAssigner
from tests.integration.scheduling import (
    FAST,
    capacity_pods,
    create,
    scheduler_metric,
    wait_bound,
)
from tests.integration.workloads import deployment, in_pool

pytestmark = pytest.mark.integration
JSON = dict[str, Any]
DISRUPTED = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
NODE = "gpu-a100-3"  # one of the session cluster's GPU nodes
ANYWHERE: list[JSON] = [{"operator": "Exists"}]  # every taint: only gpupack can refuse


@pytest.fixture(scope="module")
def chart_grace(
    cluster: LocalCluster | None, gpu_assigner: SimulatedGpuAssigner | None
) -> Iterator[LocalCluster]:
    if cluster is None:
        pytest.skip("runs the scheduler with test timings: needs the local cluster")
    chart = ("--grace-period", "--unused-grace-period", "--headroom-pods")
    fast = [a for a in FAST if not a.startswith(chart)]
    cluster.install_scheduler(extra_args=fast)
    try:
        yield cluster
    finally:
        cluster.stop_scheduler()


def holders(kube: Kube, pods: list[JSON]) -> set[str]:
    return {p["metadata"]["annotations"][keys.CAPACITY_POD] for p in pods}


def pool_of(kube: Kube, share: JSON) -> str:
    """The `gpupack.io/pool` of the capacity pod holding `share`'s GPU."""
    holder = capacity_pods(kube)[share["metadata"]["annotations"][keys.CAPACITY_POD]]
    return str(holder["metadata"]["labels"][keys.POOL])


def pool_capacity(kube: Kube, pool: str) -> set[str]:
    """The live capacity pods of pool `pool` (its `gpupack.io/pool`)."""
    return {
        name
        for name, pod in capacity_pods(kube).items()
        if pod["metadata"]["labels"].get(keys.POOL) == pool
        and not pod["metadata"].get("deletionTimestamp")
    }


def deleted(cluster: LocalCluster, reason: str) -> float:
    return (
        scheduler_metric(
            cluster, f'gpupack_scheduler_capacity_pods_deleted_total{{reason="{reason}"}}'
        )
        or 0.0
    )


def test_an_emptied_gpu_goes_when_the_pool_has_room_and_stays_while_it_needs_it(
    chart_grace: LocalCluster, opted_in_namespace: str
) -> None:
    kube, ns = chart_grace.kube(), opted_in_namespace
    group = f"{ns}-pool"
    create(kube, in_pool(deployment(ns, "steady", 1, "500m"), group))
    [steady] = wait_bound(kube, ns, "steady", 1)
    pool = pool_of(kube, steady)
    create(kube, in_pool(deployment(ns, "brief", 1, "600m"), group))
    [brief] = wait_bound(kube, ns, "brief", 1)
    [emptied] = holders(kube, [brief]) - holders(kube, [steady])

    # One more 500m pod fits beside `steady`: the GPU `brief` leaves is not needed.
    kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/brief")
    kube.wait_for(
        "the GPU the pool does not need given back",
        lambda: emptied not in pool_capacity(kube, pool),
        timeout=90,
    )
    assert pool_capacity(kube, pool) == holders(kube, [steady])

    # Now `big` (900m) runs on a GPU of its own beside it, and `filler` (600m) on another:
    # once `filler` leaves, one more 900m pod fits on no GPU the pool uses, so its GPU is
    # the pool's headroom; it stays, and the next `big` takes it.
    create(kube, in_pool(deployment(ns, "big", 1, "900m"), group))
    wait_bound(kube, ns, "big", 1)
    create(kube, in_pool(deployment(ns, "filler", 1, "600m"), group))
    [filler] = wait_bound(kube, ns, "filler", 1)
    [kept] = holders(kube, [filler]) - holders(kube, pods_of_pool(kube, ns, ("steady", "big")))
    kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/filler")
    kube.wait_for("filler gone", lambda: not pods_of_pool(kube, ns, ("filler",)), timeout=60)
    before = capacity_pods(kube)[kept]["metadata"]["uid"]
    kube.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/big", {"spec": {"replicas": 2}})
    pods = wait_bound(kube, ns, "big", 2)
    assert kept in holders(kube, pods)  # the GPU kept is the one the next pod took
    assert capacity_pods(kube)[kept]["metadata"]["uid"] == before


def pods_of_pool(kube: Kube, ns: str, apps: tuple[str, ...]) -> list[JSON]:
    items = kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    return [
        p
        for p in items
        if p["metadata"].get("labels", {}).get("app") in apps
        and p["spec"].get("nodeName")
        and not p["metadata"].get("deletionTimestamp")
    ]


def test_a_node_an_autoscaler_removes_gives_its_empty_gpus_back_and_takes_no_new_share(
    chart_grace: LocalCluster, opted_in_namespace: str
) -> None:
    """`big` (900m) and `filler` (400m), pinned to one node, run on two GPUs; `filler`
    leaves and its GPU is kept as the pool's headroom. Then the node is tainted
    `karpenter.sh/disrupted`, as Karpenter does once it decides to remove a node: the kept
    GPU is given back at once, and `late`, a new pod of the pool (which, like the others,
    tolerates every taint), is refused that node's GPUs by gpupack, in kube-scheduler's
    own words."""
    kube, ns = chart_grace.kube(), opted_in_namespace
    group, node = f"{ns}-pool", NODE
    pinned: dict[str, Any] = {
        "node_selector": {"kubernetes.io/hostname": node},
        "tolerations": ANYWHERE,
    }
    create(kube, in_pool(deployment(ns, "big", 1, "900m", **pinned), group))
    [big] = wait_bound(kube, ns, "big", 1)
    pool = pool_of(kube, big)
    create(kube, in_pool(deployment(ns, "filler", 1, "400m", **pinned), group))
    [filler] = wait_bound(kube, ns, "filler", 1)
    [kept] = holders(kube, [filler]) - holders(kube, [big])
    kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/filler")
    kube.wait_for("filler gone", lambda: not pods_of_pool(kube, ns, ("filler",)), timeout=60)
    assert kept in pool_capacity(kube, pool)  # the pool's headroom

    before = deleted(chart_grace, "node-removed")
    taints = kube.get(f"/api/v1/nodes/{node}")["spec"].get("taints") or []
    kube.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"taints": [*taints, DISRUPTED]}})
    try:
        kube.wait_for(
            "the kept GPU given back at once",
            lambda: kept not in pool_capacity(kube, pool),
            timeout=30,
        )
        # Counted once the extender's DELETE has returned, a moment after the API server
        # applied it (what the wait above saw).
        kube.wait_for(
            "the deletion counted as node-removed",
            lambda: deleted(chart_grace, "node-removed") == before + 1,
            timeout=10,
        )
        create(kube, in_pool(deployment(ns, "late", 1, "100m", **pinned), group))

        def refused() -> str | None:
            for pod in kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=late")["items"]:
                for condition in pod.get("status", {}).get("conditions", []):
                    message = condition.get("message", "")
                    if condition["type"] == "PodScheduled" and "autoscaler is removing" in message:
                        return str(message)
            return None

        kube.wait_for("kube-scheduler to say gpupack refused the node", refused, timeout=60)
        assert not pods_of_pool(kube, ns, ("late",))  # not bound
    finally:
        current = kube.get(f"/api/v1/nodes/{node}")["spec"].get("taints") or []
        kept_taints = [t for t in current if t.get("key") != DISRUPTED["key"]]
        kube.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"taints": kept_taints}})
