"""The integration tier: a real control plane with simulated GPU nodes.

By default the whole session shares one local cluster (hack/localcluster/: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, kwok) with the webhook running
as a local process. With GPUPACK_TEST_KUBECONFIG set, the same tests run against that
cluster instead, which must already have gpupack installed (the kind path, docs/kind.md);
tests that stop or restart gpupack's processes need the local cluster and say so.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.localcluster import (
    Kube,
    LocalCluster,
    SimulatedGpuAssigner,
)
from tests.integration.scheduling import FAST, FAST_LEASE

EXTERNAL = os.environ.get("GPUPACK_TEST_KUBECONFIG")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster | None]:
    if EXTERNAL:
        yield None
        return
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as local:
        local.install_webhook()  # with the configuration the chart renders
        yield local


@pytest.fixture
def local_cluster(cluster: LocalCluster | None) -> LocalCluster:
    if cluster is None:
        pytest.skip("stops and starts gpupack's processes: needs the local cluster")
    return cluster


@pytest.fixture(scope="session")
def kube(cluster: LocalCluster | None) -> Kube:
    return Kube.from_kubeconfig(Path(EXTERNAL)) if EXTERNAL else cluster.kube()  # type: ignore[union-attr]


@pytest.fixture(scope="session")
def gpu_assigner(kube: Kube, cluster: LocalCluster | None) -> Iterator[SimulatedGpuAssigner | None]:
    if cluster is None:  # a real or kind cluster has its own node agent
        yield None
        return
    cluster.exporter_kubeconfig()  # the chart's RBAC for the node agents
    with SimulatedGpuAssigner(kube, agent=cluster.node_agent) as assigner:
        yield assigner


def _namespace(kube: Kube, labels: dict[str, str]) -> Iterator[str]:
    name = kube.create_namespace("it", labels)
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def opted_in_namespace(kube: Kube) -> Iterator[str]:
    yield from _namespace(kube, {"gpupack.io/optimize": "enabled"})


@pytest.fixture
def plain_namespace(kube: Kube) -> Iterator[str]:
    yield from _namespace(kube, {})


@pytest.fixture(scope="module")
def scheduler(
    cluster: LocalCluster | None, gpu_assigner: SimulatedGpuAssigner | None
) -> Iterator[LocalCluster]:
    if cluster is None:
        pytest.skip("runs the scheduler with test timings and kills it: needs the local cluster")
    local_cluster = cluster
    local_cluster.install_scheduler(extra_args=FAST, sets=FAST_LEASE)
    yield local_cluster
    local_cluster.stop_scheduler()
