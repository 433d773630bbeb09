"""kwok's simulated GPU nodes: allocatable `nvidia.com/gpu`, the labels GPU Feature
Discovery writes (product, memory, count), realistic CPU and memory."""

from dataclasses import dataclass
from typing import Final

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
        "nvidia.com/gpu": str(pool.gpus),
    }
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
