"""Capacity pods that must avoid existing nodes, and the real Karpenter deciding on them.

The cluster has GPU nodes of its own, full: two 8-GPU A100 nodes whose GPUs another
team's whole-GPU pods hold, and one 2-GPU L4 node with one GPU held and one free.
Karpenter's kwok provider may buy 2-GPU L4 and 8-GPU A100 nodes (NodePool `gpu`) and
8-GPU H100 nodes (NodePool `h100`, none at start). Karpenter runs before gpupack is
installed, and gpupack-scheduler runs with the chart's `--autoscaler=auto`: it finds
Karpenter's API and names avoided nodes by its `gpupack.io/node` label.

Each test asserts on what Karpenter itself decided (its NodeClaims, and its
`FailedScheduling` verdicts on gpupack's capacity pods), and that no capacity pod was
ignored for a restricted label, the failure these tests stand guard against: Karpenter
drops every pod whose required node affinity names `kubernetes.io/hostname`. The tests
share one cluster, run in order, and each leaves no bought node behind."""

import itertools
from collections.abc import Iterator
from typing import Any, Final

import pytest

from gpupack import keys
from hack.localcluster import LocalCluster, SimulatedGpuAssigner
from hack.localcluster.karpenter import (
    A100_X8,
    FULL_NODE_POOLS,
    H100_X8,
    IGNORED,
    L4_X2,
    Karpenter,
    hold_gpus,
)
from tests.integration.scheduling import FAST, FAST_LEASE, capacity_pods, create, wait_bound
from tests.integration.tools import cluster_of_its_own
from tests.integration.workloads import TOLERATE_GPUS, deployment

pytestmark = pytest.mark.integration
JSON = dict[str, Any]
HOSTNAME: Final = "kubernetes.io/hostname"
INSTANCE_TYPE: Final = "node.kubernetes.io/instance-type"
L4: Final = {keys.GFD_PRODUCT: "NVIDIA-L4"}
H100: Final = {keys.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3"}


@pytest.fixture(scope="module")
def autoscaled(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[tuple[LocalCluster, Karpenter]]:
    with cluster_of_its_own(
        tmp_path_factory, cluster, "karpenter-exclusions", node_pools=FULL_NODE_POOLS
    ) as local:
        hold_gpus(local.kube())
        local.install_webhook()
        karpenter = Karpenter(
            local, instance_types=(L4_X2, A100_X8), more_pools={"h100": (H100_X8,)}
        ).start()
        local.install_scheduler(extra_args=FAST, sets=FAST_LEASE)
        local.exporter_kubeconfig()  # the chart's RBAC for the node agents
        try:
            with SimulatedGpuAssigner(local.kube(), agent=local.node_agent):
                yield local, karpenter
        finally:
            karpenter.stop()


def required_keys(pod: JSON) -> set[str]:
    node = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    terms = (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms"
    ) or []
    return {e["key"] for term in terms for e in term.get("matchExpressions") or []}


@pytest.fixture
def namespace(autoscaled: tuple[LocalCluster, Karpenter]) -> Iterator[str]:
    """An opted-in namespace, deleted after the test; then every bought node must go."""
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    name = kube.create_namespace(f"it-excl-{next(_SERIAL)}", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    try:
        yield name
    finally:
        kube.delete(f"/api/v1/namespaces/{name}")
        kube.wait_for("the capacity released", lambda: not capacity_pods(kube), timeout=120)
        kube.wait_for(
            "Karpenter to remove the nodes it bought", lambda: not karpenter.nodes(), timeout=240
        )
        kube.wait_for("its NodeClaims gone", lambda: not karpenter.claims(), timeout=60)


_SERIAL: Final = itertools.count()


def test_pods_pinned_to_l4_while_a100_nodes_exist_make_karpenter_buy_the_fewest_l4_nodes(
    autoscaled: tuple[LocalCluster, Karpenter], namespace: str
) -> None:
    """10 pods of 500m pinned to L4 GPUs need 5 GPUs; the existing L4 node has one free
    GPU (2 pods), so 4 more GPUs are needed: two 2-GPU L4 nodes. The A100 nodes are
    infeasible for the pods by their node selector, which the capacity pods inherit, so
    they name no node at all."""
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    create(
        kube,
        deployment(namespace, "l4", 10, "500m", node_selector=L4, tolerations=TOLERATE_GPUS),
    )

    pods = wait_bound(kube, namespace, "l4", 10, timeout=240)

    assert len(karpenter.claims()) == 2, karpenter.story(cluster.namespace)
    types = [n["metadata"]["labels"][INSTANCE_TYPE] for n in karpenter.nodes()]
    assert types == ["gpu-l4x2"] * 2
    bought = {n["metadata"]["name"] for n in karpenter.nodes()}
    assert {p["spec"]["nodeName"] for p in pods} == bought | {"gpu-l4-0"}
    assert karpenter.ignored(cluster.namespace) == []
    assert all(HOSTNAME not in required_keys(c) for c in capacity_pods(kube).values())


def test_a_replica_whose_anti_affinity_excludes_every_full_node_makes_karpenter_buy_one(
    autoscaled: tuple[LocalCluster, Karpenter], namespace: str
) -> None:
    """Three L4 replicas that must each have a node of their own (required pod
    anti-affinity on the hostname). The first takes the existing L4 node's free GPU;
    for the others every existing node is infeasible, by their node selector or by the
    replica already there. Their capacity pods name gpu-l4-0 by gpupack's node label,
    and Karpenter buys a node for each of them."""
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    solo = deployment(namespace, "solo", 3, "500m", node_selector=L4, tolerations=TOLERATE_GPUS)
    term = {"labelSelector": {"matchLabels": {"app": "solo"}}, "topologyKey": HOSTNAME}
    solo["spec"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    create(kube, solo)

    pods = wait_bound(kube, namespace, "solo", 3, timeout=240)

    nodes = [p["spec"]["nodeName"] for p in pods]
    assert len(set(nodes)) == 3, nodes
    bought = {n["metadata"]["name"] for n in karpenter.nodes()}
    assert set(nodes) == bought | {"gpu-l4-0"}
    assert len(karpenter.claims()) == 2, karpenter.story(cluster.namespace)
    assert karpenter.ignored(cluster.namespace) == []
    l4_node = kube.get("/api/v1/nodes/gpu-l4-0")
    assert l4_node["metadata"]["labels"][keys.NODE] == "gpu-l4-0"  # written by the scheduler
    named = [c for c in capacity_pods(kube).values() if keys.NODE in required_keys(c)]
    assert named, "no capacity pod named a node by gpupack's label"
    assert all(HOSTNAME not in required_keys(c) for c in capacity_pods(kube).values())


def test_a_gpu_type_scaled_to_zero_is_bought_while_nodes_of_other_types_exist(
    autoscaled: tuple[LocalCluster, Karpenter], namespace: str
) -> None:
    """No node is feasible for pods pinned to H100 GPUs, so kube-scheduler never asks
    the extender; housekeeping asks capacity for them, off every existing GPU node. The
    existing nodes are all excluded by the pinning the capacity pod inherits: Karpenter
    buys an H100 node from its `h100` NodePool."""
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    create(
        kube,
        deployment(namespace, "h100", 4, "250m", node_selector=H100, tolerations=TOLERATE_GPUS),
    )

    pods = wait_bound(kube, namespace, "h100", 4, timeout=240)

    [claim] = karpenter.claims()
    assert claim["metadata"]["labels"]["karpenter.sh/nodepool"] == "h100"
    [node] = karpenter.nodes()
    assert {p["spec"]["nodeName"] for p in pods} == {node["metadata"]["name"]}
    assert karpenter.ignored(cluster.namespace) == []


def test_a_pod_bound_to_a_pod_on_a_full_node_is_weighed_by_karpenter_which_buys_nothing(
    autoscaled: tuple[LocalCluster, Karpenter], namespace: str
) -> None:
    """`db` takes the L4 node's free GPU, which fills the node. `near-db` must run beside
    it (required pod affinity on the hostname) and does not fit its GPU: its capacity
    pod carries the affinity and names the A100 nodes by gpupack's label. Karpenter
    simulates it and finds no node it could buy that satisfies it: it buys nothing, and
    says why on the capacity pod (not that it ignores it)."""
    cluster, karpenter = autoscaled
    kube = cluster.kube()
    create(
        kube, deployment(namespace, "db", 1, "500m", node_selector=L4, tolerations=TOLERATE_GPUS)
    )
    wait_bound(kube, namespace, "db", 1, timeout=120)
    near = deployment(namespace, "near-db", 1, "600m", tolerations=TOLERATE_GPUS)
    term = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOSTNAME}
    near["spec"]["template"]["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    create(kube, near)

    def weighed() -> list[JSON] | None:
        waiting = [c for c in capacity_pods(kube).values() if not c["spec"].get("nodeName")]
        names = {c["metadata"]["name"] for c in waiting}
        verdicts = [
            e for e in karpenter.refusals(cluster.namespace) if e["involvedObject"]["name"] in names
        ]
        return verdicts or None

    verdicts = kube.wait_for("Karpenter's verdict on near-db's capacity pod", weighed, timeout=120)

    assert karpenter.claims() == []
    assert all(IGNORED not in e["message"] for e in verdicts), verdicts
    [waiting] = [c for c in capacity_pods(kube).values() if not c["spec"].get("nodeName")]
    assert keys.NODE in required_keys(waiting)
    assert karpenter.ignored(cluster.namespace) == []
