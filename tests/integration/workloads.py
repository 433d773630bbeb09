"""Workload manifests the integration tests create."""

from typing import Any

from gpupack import keys

JSON = dict[str, Any]


def deployment(
    ns: str,
    name: str,
    replicas: int,
    compute: str | None = "300m",
    *,
    memory: str | None = None,
    policy: str = "batch",
    node_selector: dict[str, str] | None = None,
    tolerations: list[JSON] | None = None,
) -> JSON:
    """A Deployment of GPU pods in a pool of its own. `compute` (and `memory`) pin the
    allocation; None leaves it to the policy and the workload's recommendation.
    `tolerations` are added (a tainted GPU node's, say)."""
    annotations = {keys.POLICY: policy}
    if compute is not None:
        annotations[keys.GPU_COMPUTE] = compute
    if memory is not None:
        annotations[keys.GPU_MEMORY] = memory
    spec: JSON = {
        "containers": [
            {
                "name": "cuda",
                "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                "resources": {
                    "requests": {"cpu": "10m", "memory": "16Mi", "nvidia.com/gpu": "1"},
                    "limits": {"nvidia.com/gpu": "1"},
                },
            }
        ],
        # A pool of its own: no node has this taint, so the toleration only isolates.
        "tolerations": [
            {"key": "gpupack.test/isolate", "value": f"{ns}-{name}", "effect": "NoSchedule"},
            *(tolerations or []),
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": spec,
            },
        },
    }


def in_pool(obj: JSON, pool: str, policy: str | None = None) -> JSON:
    """`obj` (a Deployment or a Job from `deployment`) in the pool `pool`: the same
    isolating toleration as every other workload put there; with `policy`, pinned to it."""
    template = obj["spec"]["template"]
    template["spec"]["tolerations"][0]["value"] = pool
    if policy is not None:
        template["metadata"]["annotations"][keys.POLICY] = policy
    return obj


def gpu_pod(name: str, gpus: str = "1", annotations: dict[str, str] | None = None) -> JSON:
    """A bare Pod asking for `gpus` whole nvidia.com/gpu, gone at once when deleted."""
    container = {
        "name": "cuda",
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "resources": {"limits": {keys.NVIDIA_GPU: gpus}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
    }


# The taint GPU nodes often carry (hack/localcluster's `gpu_taint`, Karpenter's NodePool).
# A container's securityContext at Pod Security `restricted`.
RESTRICTED: JSON = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

TOLERATE_GPUS: list[JSON] = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
]
