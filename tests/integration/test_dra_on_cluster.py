"""GPU nodes managed by NVIDIA's DRA driver, on the newest Kubernetes (1.37: DRA's
extended-resource mapping, `DRAExtendedResource`, is GA).

The nodes advertise no `nvidia.com/gpu`: their GPUs are devices in ResourceSlices, which
the harness publishes as the driver's kubelet plugin would, with the DeviceClass the
driver installs (`extendedResourceName: nvidia.com/gpu`). Capacity pods still ask
`nvidia.com/gpu: 1`; kube-scheduler satisfies it with a ResourceClaim it makes and
allocates, and the node agent (the exporter's own discovery, run here per node over a
fake NVML) reads the GPU from that claim and the slice. Every decision asserted on is the
other system's: kube-scheduler's claim and allocation, the device's `uuid` in the slice.
"""

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from doubles.nvml import A100
from gpupack import keys
from hack.localcluster import Kube, LocalCluster, NodePool
from hack.localcluster.nodes import fake_uuid
from tests.integration.fakenode import FakeNode
from tests.integration.scheduling import (
    FAST,
    FAST_LEASE,
    JSON,
    assert_consistent,
    capacity_pods,
    create,
    wait_bound,
)
from tests.integration.tools import cluster_of_its_own
from tests.integration.workloads import deployment

pytestmark = [pytest.mark.integration, pytest.mark.smoke]

DRA_NODES = (NodePool("gpu-dra", 2, 4, "NVIDIA-A100-SXM4-80GB", 81920, "64", "512Gi", dra=True),)
NEWEST_FEATURE = (1, 37)  # DRAExtendedResource GA


def release() -> tuple[int, int]:
    """The Kubernetes release of the binaries this run uses."""
    binary = Path(os.environ.get("GPUPACK_BIN_DIR", ""), "kube-apiserver")
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    found = re.search(r"v(\d+)\.(\d+)\.", out.stdout)
    assert found, out.stdout
    return int(found[1]), int(found[2])


@pytest.fixture(scope="module")
def dra(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[LocalCluster]:
    if release() < NEWEST_FEATURE:
        pytest.skip(
            "DRA's extended-resource mapping is GA from Kubernetes 1.37: hack/test runs this "
            "module on the newest release of KUBERNETES_SMOKE_VERSIONS"
        )
    with cluster_of_its_own(tmp_path_factory, cluster, "dra", node_pools=DRA_NODES) as local:
        local.install_webhook()
        # karpenter: gpupack labels every GPU node it counts (`gpupack.io/node`), which
        # shows the DRA nodes are counted (the label is what Karpenter's exclusions name).
        local.install_scheduler(
            extra_args=FAST, sets=[*FAST_LEASE, "scheduler.autoscaler=karpenter"]
        )
        proc = tmp_path_factory.mktemp("proc")
        nodes = [
            FakeNode(local, f"gpu-dra-{i}", 4, proc / str(i), A100, dra=True) for i in range(2)
        ]
        for node in nodes:
            node.start()
        try:
            yield local
        finally:
            for node in nodes:
                node.stop()
            local.stop_scheduler()


def slice_uuids(kube: Kube) -> dict[tuple[str, str, str], str]:
    """(driver, pool, device) -> the device's `uuid` attribute, from every ResourceSlice."""
    found = {}
    for obj in kube.get("/apis/resource.k8s.io/v1/resourceslices")["items"]:
        spec = obj["spec"]
        for device in spec["devices"]:
            key = (spec["driver"], spec["pool"]["name"], device["name"])
            found[key] = device["attributes"]["uuid"]["string"]
    return found


def test_shares_land_on_gpus_kube_scheduler_gave_capacity_pods_through_resource_claims(
    dra: LocalCluster,
) -> None:
    kube = dra.kube()
    ns = kube.create_namespace("it-dra", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    create(kube, deployment(ns, "llm", 6, "300m", memory="8Gi"))

    pods = wait_bound(kube, ns, "llm", 6, timeout=120)

    by_gpu = assert_consistent(kube, pods)  # each share on its capacity pod's GPU and node
    assert sorted(len(v) for v in by_gpu.values()) == [3, 3]
    capacity = capacity_pods(kube)
    uuids = slice_uuids(kube)
    for name in {p["metadata"]["annotations"][keys.CAPACITY_POD] for p in pods}:
        holder = capacity[name]
        assert "nvidia.com/gpu" not in holder["status"].get("allocatable", {})
        # kube-scheduler's decision: the claim it made for the pod's nvidia.com/gpu ...
        status = holder["status"]["extendedResourceClaimStatus"]
        [mapping] = status["requestMappings"]
        assert mapping["resourceName"] == "nvidia.com/gpu"
        claim: JSON = kube.get(
            f"/apis/resource.k8s.io/v1/namespaces/{keys.SYSTEM_NAMESPACE}/resourceclaims/"
            f"{status['resourceClaimName']}"
        )
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["request"] == mapping["requestName"]
        assert result["pool"] == holder["spec"]["nodeName"]
        # ... and the driver's slice: the GPU the agent named is that device's
        device = (result["driver"], result["pool"], result["device"])
        assert holder["metadata"]["annotations"][keys.GPU_UUID] == uuids[device]
        assert uuids[device] in {fake_uuid(result["pool"], i) for i in range(4)}
    for pod in pods:  # the share's container is pointed at its GPU as on any node
        [container] = pod["spec"]["containers"]
        visible = {e["name"]: e for e in container.get("env", [])}[keys.ENV_VISIBLE_DEVICES]
        assert keys.GPU_UUID in visible["valueFrom"]["fieldRef"]["fieldPath"]


def test_nodes_whose_gpus_are_dra_devices_are_counted_as_gpu_nodes(dra: LocalCluster) -> None:
    """They advertise no `nvidia.com/gpu`: counted from their ResourceSlices, each gets the
    `gpupack.io/node` label the extender writes on every GPU node it knows."""
    kube = dra.kube()

    def labelled() -> list[str] | None:
        nodes = kube.get("/api/v1/nodes", labelSelector="type=kwok")["items"]
        assert all("nvidia.com/gpu" not in n["status"]["allocatable"] for n in nodes)
        names = [n["metadata"]["name"] for n in nodes if keys.NODE in n["metadata"]["labels"]]
        return sorted(names) if len(names) == len(nodes) else None

    assert kube.wait_for("every DRA GPU node labelled", labelled, timeout=30) == [
        "gpu-dra-0",
        "gpu-dra-1",
    ]
