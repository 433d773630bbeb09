"""Karpenter's kwok provider: a real autoscaler for the local cluster, started on demand.

It watches Pending pods the way Karpenter does in a cloud, and "buys" nodes from a list
of instance types: its Node objects carry the `kwok.x-k8s.io/node: fake` annotation, so
the cluster's kwok adopts them (Ready, pods Running) as it does the GPU nodes it was
started with. It also consolidates: it evicts pods from under-used nodes and removes
empty ones. That is what gpupack's capacity pods meet in a cluster with Karpenter.

The binary (`karpenter-kwok`, built by hack/lib/binaries.sh from
`sigs.k8s.io/karpenter/kwok`) runs as a local process with the cluster's admin identity;
its CRDs come from the same module (`crds/` beside the binary). Karpenter's nodes carry
the `karpenter.sh/termination` finalizer, which only the running controller removes:
`stop()` deletes its NodeClaims and waits for their nodes before it stops the process.
"""

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from gpupack import keys
from hack.localcluster.client import ApiError, Kube
from hack.localcluster.host import Host
from hack.localcluster.nodes import GPU_TAINT, NodePool
from hack.localcluster.processes import Process, free_port

NODEPOOL: Final = "gpu"
NODECLASS: Final = "default"
ZONE: Final = "test-zone-a"
IGNORED: Final = "is not allowed"  # Karpenter's word for a pod it drops unsimulated


@dataclass(frozen=True, slots=True)
class GpuInstanceType:
    """An instance type Karpenter may buy: `gpus` NVIDIA GPUs of `product`, labelled as
    GPU Feature Discovery labels nodes (gpupack reads the memory from them)."""

    name: str
    gpus: int
    product: str
    gpu_memory_mib: int
    cpu: str
    memory: str
    price: float

    def as_json(self) -> dict[str, Any]:
        labels = {
            "nvidia.com/gpu.product": self.product,
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
            "nvidia.com/gpu.present": "true",
        }
        requirements = [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
            *({"key": k, "operator": "In", "values": [v]} for k, v in labels.items()),
        ]
        return {
            "name": self.name,
            "offerings": [{"Price": self.price, "Available": True, "Requirements": requirements}],
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": {
                "cpu": self.cpu,
                "memory": self.memory,
                "ephemeral-storage": "100Gi",
                "pods": "110",
                "nvidia.com/gpu": str(self.gpus),
            },
        }


A100_X8: Final = GpuInstanceType(
    "gpu-a100x8", 8, "NVIDIA-A100-SXM4-80GB", 81920, "96", "1024Gi", 32.0
)
L4_X2: Final = GpuInstanceType("gpu-l4x2", 2, "NVIDIA-L4", 23034, "16", "64Gi", 1.5)
H100_X8: Final = GpuInstanceType(
    "gpu-h100x8", 8, "NVIDIA-H100-80GB-HBM3", 81559, "192", "2048Gi", 98.0
)


# A cluster whose own GPU nodes are full, beside Karpenter (the exclusion tests and
# benchmark): two 8-GPU A100 nodes and one 2-GPU L4 node, and how many GPUs of each
# another team's whole-GPU pods hold (`hold_gpus`): all but one of the L4 node's.
FULL_NODE_POOLS: Final = (
    NodePool("gpu-a100", 2, 8, "NVIDIA-A100-SXM4-80GB", 81920, "96", "1024Gi"),
    NodePool("gpu-l4", 1, 2, "NVIDIA-L4", 23034, "16", "64Gi"),
)
HELD_GPUS: Final = (("gpu-a100-0", 8), ("gpu-a100-1", 8), ("gpu-l4-0", 1))


def hold_gpus(kube: "Kube", held: Sequence[tuple[str, int]] = HELD_GPUS) -> str:
    """Another team's bare pods (a namespace not opted in), each holding one whole GPU of
    a node: `held` is node -> how many. Returns the namespace."""
    namespace: str = kube.create_namespace("other-team")
    for node, count in held:
        for gpu in range(count):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"hold-{node}-{gpu}"},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            }
            kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    return namespace


@dataclass
class Karpenter:
    """Karpenter for `cluster`: one NodePool `gpu` of `instance_types` (and one more per
    entry of `more_pools`, name -> its types), tainted as GPU nodes are, at most
    `gpu_limit` GPUs each, consolidating after `consolidate_after`."""

    cluster: Host
    instance_types: Sequence[GpuInstanceType] = (A100_X8,)
    gpu_limit: int = 64
    consolidate_after: str = "10s"
    more_pools: Mapping[str, Sequence[GpuInstanceType]] = field(default_factory=dict)
    process: Process | None = field(default=None, repr=False)

    @property
    def pools(self) -> dict[str, Sequence[GpuInstanceType]]:
        return {NODEPOOL: self.instance_types, **self.more_pools}

    @property
    def folder(self) -> Path:
        return self.cluster.workdir / "karpenter"

    def start(self) -> "Karpenter":
        admin = self.cluster.kube()
        crds = Path(self.cluster.binary("karpenter-kwok")).resolve().parent / "crds"
        names = []
        for path in sorted(crds.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            admin.apply(crd)
            names.append(crd["metadata"]["name"])
        admin.wait_for(
            "Karpenter's CRDs to be established", lambda: self._established(names), timeout=60
        )
        admin.apply(
            {
                "apiVersion": "karpenter.kwok.sh/v1alpha1",
                "kind": "KWOKNodeClass",
                "metadata": {"name": NODECLASS},
            }
        )
        for name, instance_types in self.pools.items():
            admin.apply(self._nodepool(name, instance_types))
        self.folder.mkdir(parents=True, exist_ok=True)
        types = self.folder / "instance-types.json"
        every = {t.name: t for pool in self.pools.values() for t in pool}
        types.write_text(json.dumps([t.as_json() for t in every.values()], indent=1))
        kubeconfig = self.cluster.user_kubeconfig("karpenter", ["system:masters"])
        env = {
            "KUBECONFIG": str(kubeconfig),
            "DISABLE_LEADER_ELECTION": "true",
            "METRICS_PORT": str(free_port()),
            "HEALTH_PROBE_PORT": str(free_port()),
            "INSTANCE_TYPES_FILE_PATH": str(types),
            "LOG_LEVEL": "info",
            "PATH": "/usr/bin:/bin",
        }
        self.process = self.cluster.launch(
            "karpenter", [self.cluster.binary("karpenter-kwok")], env
        )
        self.cluster.write_state()
        return self

    def _established(self, names: Sequence[str]) -> bool:
        admin = self.cluster.kube()
        for name in names:
            crd = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    def _nodepool(self, name: str, instance_types: Sequence[GpuInstanceType]) -> dict[str, Any]:
        return {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": name},
            "spec": {
                "template": {
                    "spec": {
                        "nodeClassRef": {
                            "group": "karpenter.kwok.sh",
                            "kind": "KWOKNodeClass",
                            "name": NODECLASS,
                        },
                        "requirements": [
                            {
                                "key": "node.kubernetes.io/instance-type",
                                "operator": "In",
                                "values": [t.name for t in instance_types],
                            }
                        ],
                        "taints": [GPU_TAINT],
                        "expireAfter": "Never",
                    }
                },
                "limits": {"nvidia.com/gpu": str(self.gpu_limit)},
                "disruption": {
                    "consolidationPolicy": "WhenEmptyOrUnderutilized",
                    "consolidateAfter": self.consolidate_after,
                },
            },
        }

    def nodes(self) -> list[dict[str, Any]]:
        """The nodes Karpenter made, in any of its NodePools."""
        found: list[dict[str, Any]] = self.cluster.kube().get(
            "/api/v1/nodes", labelSelector=f"karpenter.sh/nodepool in ({','.join(self.pools)})"
        )["items"]
        return found

    def claims(self) -> list[dict[str, Any]]:
        """Every NodeClaim Karpenter made (each a node it decided to buy), launched or not."""
        found: list[dict[str, Any]] = self.cluster.kube().get("/apis/karpenter.sh/v1/nodeclaims")[
            "items"
        ]
        return found

    def story(self, namespace: str) -> str:
        """What Karpenter bought and for which capacity pods, in order, for a failed
        assertion to say: each NodeClaim (made when, its node, the pods' requests it sums),
        each capacity pod in `namespace` (made when, its node, the nodes it must avoid),
        and Karpenter's verdicts on them."""
        kube = self.cluster.kube()
        lines = []
        for claim in sorted(self.claims(), key=lambda c: c["metadata"]["creationTimestamp"]):
            requests = (claim.get("spec") or {}).get("resources", {}).get("requests")
            node = (claim.get("status") or {}).get("nodeName")
            lines.append(
                f"claim {claim['metadata']['name']} at "
                f"{claim['metadata']['creationTimestamp']} node={node} requests={requests}"
            )
        pods = kube.get(
            f"/api/v1/namespaces/{namespace}/pods",
            labelSelector=f"{keys.ROLE}={keys.ROLE_CAPACITY}",
        )["items"]
        for pod in sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"]):
            affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
            required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
            avoid = [
                (e["key"], e.get("values"))
                for term in required.get("nodeSelectorTerms") or []
                for e in term.get("matchExpressions") or []
                if e.get("operator") == "NotIn"
            ]
            lines.append(
                f"capacity {pod['metadata']['name']} at {pod['metadata']['creationTimestamp']} "
                f"node={pod['spec'].get('nodeName')} avoid={avoid}"
            )
        for event in self.refusals(namespace):
            lines.append(f"karpenter on {event['involvedObject']['name']}: {event['message']}")
        return "\n".join(lines)

    def refusals(self, namespace: str) -> list[dict[str, Any]]:
        """Karpenter's own verdicts on pending pods of `namespace` it could not help: its
        `FailedScheduling` Events ("Failed to schedule pod, <why>"), kube-scheduler's
        left out. A pod it ignores for a restricted label is here too, with that why."""
        found: list[dict[str, Any]] = self.cluster.kube().get(
            f"/api/v1/namespaces/{namespace}/events", fieldSelector="reason=FailedScheduling"
        )["items"]
        return [e for e in found if str(e.get("message", "")).startswith("Failed to schedule pod")]

    def ignored(self, namespace: str) -> list[dict[str, Any]]:
        """The `refusals` of pods Karpenter dropped without simulating them: a restricted
        label in a required node affinity ("... is not allowed")."""
        return [e for e in self.refusals(namespace) if IGNORED in e["message"]]

    def stop(self) -> None:
        """Delete what Karpenter bought while it still runs (its finalizers), then stop it."""
        admin = self.cluster.kube()
        if self.process is not None and self.process.alive():
            claims = "/apis/karpenter.sh/v1/nodeclaims"
            try:
                for claim in admin.get(claims)["items"]:
                    admin.delete(f"{claims}/{claim['metadata']['name']}")
                deadline = time.monotonic() + 60
                while self.nodes() and time.monotonic() < deadline:
                    time.sleep(0.5)
            except ApiError:
                pass
        if self.process is not None:
            self.process.stop()
            self.cluster.processes.pop(self.process.name, None)
            self.process = None
