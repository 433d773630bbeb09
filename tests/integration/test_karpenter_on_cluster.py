"""gpupack's capacity pods meet a real autoscaler: Karpenter's kwok provider, in a cluster
that starts with no GPU node at all (hack/localcluster/karpenter.py). The first of the
autoscaler stories of issue 28; the rest (no disruption of hosting capacity pods,
consolidation after release, pod-affinity cases) build on this harness.

A capacity pod is a GPU someone pays for: when it cannot be placed, the autoscaler buys
the node it needs, and the fractional pods it was made for then run on that GPU."""

from collections.abc import Iterator
from typing import Any

import pytest

from gpupack import keys
from hack.localcluster import Kube, LocalCluster, SimulatedGpuAssigner
from hack.localcluster.karpenter import Karpenter
from tests.integration.scheduling import FAST, FAST_LEASE
from tests.integration.tools import cluster_of_its_own
from tests.integration.workloads import TOLERATE_GPUS, deployment

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def autoscaled(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[tuple[LocalCluster, Karpenter]]:
    with cluster_of_its_own(tmp_path_factory, cluster, "karpenter", node_pools=()) as local:
        local.install_webhook()
        local.install_scheduler(extra_args=FAST, sets=FAST_LEASE)
        karpenter = Karpenter(local).start()
        writer = Kube.from_kubeconfig(local.exporter_kubeconfig())  # with the chart's RBAC
        try:
            with SimulatedGpuAssigner(local.kube(), writer=writer):
                yield local, karpenter
        finally:
            karpenter.stop()


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
