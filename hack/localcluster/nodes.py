"""kwok's simulated GPU nodes: allocatable `nvidia.com/gpu`, the labels GPU Feature
Discovery writes (product, memory, count), realistic CPU and memory. A pool with `dra`
advertises no `nvidia.com/gpu`: its GPUs are devices in a ResourceSlice, as NVIDIA's DRA
driver publishes them (`resource_slice`, with the DeviceClass it installs)."""

import uuid
from dataclasses import dataclass
from typing import Final

from gpupack import keys
from hack.localcluster.client import JSON

KWOK_ANNOTATION: Final = "kwok.x-k8s.io/node"


@dataclass(frozen=True)
class NodePool:
    """`count` simulated GPU nodes named `<prefix>-<i>`."""

    prefix: str
    count: int
    gpus: int
    product: str
    gpu_memory_mib: int
    cpu: str
    memory: str
    pods: int = 110
    dra: bool = False  # GPUs as DRA devices (`resource_slice`), none in allocatable


DEFAULT_NODE_POOLS: Final = (
    NodePool("gpu-a100", 4, 8, "NVIDIA-A100-SXM4-80GB", 81920, "96", "1024Gi"),
    NodePool("gpu-l4", 4, 2, "NVIDIA-L4", 23034, "16", "64Gi"),
)
GPU_TAINT: Final = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NOT_READY_TAINTS: Final = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def schedulable(node: JSON) -> bool:
    """Ready, and the node-lifecycle controller has lifted the taints new nodes start with."""
    conditions = node.get("status", {}).get("conditions", [])
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    taints = {t["key"] for t in node.get("spec", {}).get("taints", [])}
    return ready and not taints.intersection(NOT_READY_TAINTS)


def node_manifest(pool: NodePool, index: int, *, taint: bool) -> JSON:
    name = f"{pool.prefix}-{index}"
    resources = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": str(pool.pods),
    }
    if not pool.dra:
        resources["nvidia.com/gpu"] = str(pool.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": pool.product,
                "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
                "nvidia.com/gpu.count": str(pool.gpus),
            },
        },
        "spec": {"taints": [GPU_TAINT]} if taint else {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def fake_uuid(node: str, index: int) -> str:
    """The stable UUID of a simulated GPU."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.gpupack.test"))


# NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu): its driver name, and the DeviceClass
# its chart installs, which from Kubernetes 1.37 (DRAExtendedResource, GA) also serves a
# pod asking `nvidia.com/gpu` a device through a ResourceClaim kube-scheduler makes.
NVIDIA_DEVICE_CLASS: Final = {
    "apiVersion": keys.DRA_API,
    "kind": "DeviceClass",
    "metadata": {"name": keys.DRA_DRIVER},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                }
            }
        ],
        "extendedResourceName": "nvidia.com/gpu",
    },
}


def resource_slice(pool: NodePool, index: int) -> JSON:
    """TEST INFRASTRUCTURE: the ResourceSlice NVIDIA's DRA kubelet plugin would publish for
    node `index` of `pool`: one device per GPU, named `gpu-<i>`, with the attributes and
    capacity the driver gives (type, uuid, productName, index; memory)."""
    name = f"{pool.prefix}-{index}"
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": keys.DRA_GPU_TYPE},
                "uuid": {"string": fake_uuid(name, i)},
                "productName": {"string": pool.product.replace("-", " ")},
                "index": {"int": i},
            },
            "capacity": {"memory": {"value": f"{pool.gpu_memory_mib}Mi"}},
        }
        for i in range(pool.gpus)
    ]
    return {
        "apiVersion": keys.DRA_API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-{keys.DRA_DRIVER}"},
        "spec": {
            "driver": keys.DRA_DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
