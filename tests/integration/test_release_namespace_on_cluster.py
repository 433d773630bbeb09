"""gpupack released into a namespace other than `gpupack-system`: every component takes
its namespace from the chart, so a pod in an opted-in namespace is rewritten, its GPU is
held by a capacity pod in the release namespace, and it is placed there; nothing looks
for `gpupack-system`, which does not exist in this cluster.

A cluster of its own: the chart's cluster-scoped objects (the webhook configuration,
the admission policies) name the release namespace.
"""

from collections.abc import Iterator

import pytest

from gpupack import keys
from hack.localcluster import ApiError, LocalCluster, SimulatedGpuAssigner
from tests.integration.scheduling import FAST, FAST_LEASE, create, wait_bound
from tests.integration.tools import cluster_of_its_own
from tests.integration.workloads import deployment

pytestmark = pytest.mark.integration
RELEASE_NAMESPACE = "gpu-sharing"


@pytest.fixture(scope="module")
def released(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[LocalCluster]:
    with cluster_of_its_own(
        tmp_path_factory, cluster, "released", namespace=RELEASE_NAMESPACE
    ) as local:
        local.install_webhook()
        local.install_scheduler(extra_args=FAST, sets=FAST_LEASE)
        local.exporter_kubeconfig()  # the chart's RBAC for the node agents
        with SimulatedGpuAssigner(
            local.kube(), agent=local.node_agent, namespace=RELEASE_NAMESPACE
        ):
            yield local


def test_a_pod_is_rewritten_held_and_placed_from_another_release_namespace(
    released: LocalCluster,
) -> None:
    kube = released.kube()
    ns = kube.create_namespace("it", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    create(kube, deployment(ns, "elsewhere", 2, "300m"))

    pods = wait_bound(kube, ns, "elsewhere", 2)

    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert pod["spec"]["schedulerName"] == keys.SCHEDULER_NAME
        assert keys.SEAL in annotations
        holder = annotations[keys.CAPACITY_POD]
        capacity = kube.get(f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods/{holder}")
        assert capacity["metadata"]["annotations"][keys.GPU_UUID] == annotations[keys.GPU_UUID]
        assert capacity["metadata"]["labels"].get(keys.HOSTING) == "true"
    namespaces = {n["metadata"]["name"] for n in kube.get("/api/v1/namespaces")["items"]}
    assert "gpupack-system" not in namespaces
    # The admission policies guard the release namespace's capacity pods.
    held = pods[0]["metadata"]["annotations"][keys.CAPACITY_POD]
    with pytest.raises(ApiError) as refused:
        kube.request("DELETE", f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods/{held}")
    assert refused.value.status == 403
    assert "holds the GPU" in refused.value.body
