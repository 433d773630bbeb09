"""The pods on this node, as the exporter needs them: UID to name, containers and share.

A node-scoped pod watch (`spec.nodeName=<node>`) keeps the store current; `PodMap`
answers "which pod and container is this cgroup" and "what did gpupack allocate to this
pod" without scanning. Each pod is parsed once per resourceVersion. A pod gpupack does
not manage (no `gpupack.io/gpu-compute`) is still known by name, so its GPU use is
reported under its own name, and only the allocation series are missing.
"""

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Protocol

from gpupack import codec, keys
from gpupack.errors import ContractError
from gpupack.objects import JSON, annotations_of, labels_of
from gpupack.shares import gpu_memory, pod_allocation

UID_INDEX: Final = "uid"
_RUNTIMES: Final = ("containerd://", "cri-o://", "docker://", "crio://")


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    containers: Mapping[str, str]  # container ID (hex, no runtime prefix) -> container name
    managed: bool  # gpupack decided its share (it carries gpupack.io/gpu-compute)
    compute: int | None = None  # allocated millis of one GPU
    memory: int | None = None  # allocated GPU memory, bytes (capacity pod: the device's)
    gpu_uuid: str | None = None  # fractional pod: the GPU the scheduler assigned;
    #                              capacity pod: the GPU kubelet gave it (exporter-written)
    capacity: bool = False  # a capacity pod in gpupack's namespace
    phase: str = ""
    resource_version: str = ""  # the write precondition for annotating a capacity pod
    unhealthy: str = ""  # capacity pod: why its GPU is unhealthy (exporter-written)
    enforcement: str = ""  # fractional pod: its gpupack.io/enforcement
    # Capacity pod on a node whose GPUs are DRA devices: the ResourceClaim kube-scheduler
    # made for its `nvidia.com/gpu` (status.extendedResourceClaimStatus), and the claim's
    # requests that stand for it.
    claim: str = ""
    claim_requests: tuple[str, ...] = ()


def container_id(raw: str) -> str:
    """`containerd://abc` -> `abc`: the ID as it appears in cgroup paths."""
    for prefix in _RUNTIMES:
        if raw.startswith(prefix):
            return raw[len(prefix) :]
    return raw.rpartition("://")[2]


def pod_info(pod: JSON, system_namespace: str = keys.SYSTEM_NAMESPACE) -> PodInfo:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    containers: dict[str, str] = {}
    for field in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for entry in status.get(field) or ():
            raw = entry.get("containerID")
            if raw:
                containers[container_id(str(raw))] = str(entry.get("name", ""))
    annotations = annotations_of(pod)
    namespace = str(meta.get("namespace", ""))
    capacity = namespace == system_namespace and labels_of(pod).get(keys.ROLE) == keys.ROLE_CAPACITY
    try:
        uuid = codec.read_gpu_uuid(annotations)
    except ContractError:
        uuid = None
    allocation = None if capacity else pod_allocation(pod)
    memory = gpu_memory(pod) if capacity else (allocation.memory or None) if allocation else None
    claim, requests = extended_resource_claim(status) if capacity else ("", ())
    return PodInfo(
        uid=str(meta.get("uid", "")),
        namespace=namespace,
        name=str(meta.get("name", "")),
        containers=MappingProxyType(containers),
        managed=allocation is not None,
        compute=allocation.compute if allocation else None,
        memory=memory,
        gpu_uuid=uuid,
        capacity=capacity,
        phase=str(status.get("phase", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        unhealthy=annotations.get(keys.GPU_UNHEALTHY, "") if capacity else "",
        enforcement="" if capacity else annotations.get(keys.ENFORCEMENT, ""),
        claim=claim,
        claim_requests=requests,
    )


def extended_resource_claim(status: JSON) -> tuple[str, tuple[str, ...]]:
    """The ResourceClaim kube-scheduler made for a pod's `nvidia.com/gpu` where a
    DeviceClass maps it to DRA devices (Kubernetes 1.37, `DRAExtendedResource`), and the
    requests in it for `nvidia.com/gpu`; ("", ()) for a pod given devices otherwise."""
    found = status.get("extendedResourceClaimStatus") or {}
    requests = tuple(
        str(m.get("requestName", ""))
        for m in found.get("requestMappings") or ()
        if m.get("resourceName") == keys.NVIDIA_GPU and m.get("requestName")
    )
    name = str(found.get("resourceClaimName") or "")
    return (name, requests) if name and requests else ("", ())


def uid_index(pod: JSON) -> Iterable[str]:
    """The indexer `PodMap` looks pods up by (`UID_INDEX`)."""
    uid = (pod.get("metadata") or {}).get("uid")
    return (str(uid),) if uid else ()


class PodStore(Protocol):
    """The reads `PodMap` makes of the node's pod cache: an informer indexed by UID
    under `UID_INDEX` with `uid_index` (`exporter.agent.node_pods` builds it)."""

    @property
    def synced(self) -> bool: ...

    @property
    def error(self) -> str: ...

    def by_index(self, index: str, value: str) -> list[JSON]: ...

    def items(self) -> list[JSON]: ...


class PodMap:
    """Parsed views of an informer's pods, cached per resourceVersion."""

    def __init__(self, informer: PodStore, system_namespace: str = keys.SYSTEM_NAMESPACE) -> None:
        self._informer = informer
        self._namespace = system_namespace
        self._lock = threading.Lock()
        self._parsed: dict[str, tuple[str, PodInfo]] = {}  # uid -> (resourceVersion, info)

    @property
    def synced(self) -> bool:
        return self._informer.synced

    @property
    def error(self) -> str:
        """Why the pod watch is failing ("" while it keeps the map current)."""
        return self._informer.error

    def _info(self, pod: JSON) -> PodInfo:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        version = str(meta.get("resourceVersion", ""))
        with self._lock:
            cached = self._parsed.get(uid)
            if cached is not None and cached[0] == version:
                return cached[1]
        info = pod_info(pod, self._namespace)
        with self._lock:
            self._parsed[uid] = (version, info)
        return info

    def by_uid(self, uid: str) -> PodInfo | None:
        found = self._informer.by_index(UID_INDEX, uid)
        return self._info(found[0]) if found else None

    def all(self) -> list[PodInfo]:
        pods = [self._info(pod) for pod in self._informer.items()]
        live = {pod.uid for pod in pods}
        with self._lock:
            for uid in [uid for uid in self._parsed if uid not in live]:
                del self._parsed[uid]
        return pods
