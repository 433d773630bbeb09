"""What a pod asks of GPUs: every `nvidia.com/gpu` entry, in containers and init
containers, and any other GPU-like resource (MIG profiles, other vendors).

The contract between the webhook, which rewrites a pod that asks for exactly one
`nvidia.com/gpu`, and the scheduler, which notices such a pod that was never rewritten
(it escaped gpupack): both read requests with this one scan, so they agree on which
pods gpupack would take, and which pods escaped it (in an opted-in scope, asking for
one GPU, never rewritten).
"""

from collections.abc import Collection
from dataclasses import dataclass

from gpupack import keys
from gpupack.codec import read_optimize
from gpupack.errors import ContractError
from gpupack.objects import JSON, Container, PodSpec, labels_of
from gpupack.quantity import parse_count

CONTAINER_FIELDS = ("containers", "initContainers")


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """Where `nvidia.com/gpu` appears: spec field, container index, and the count asked."""

    field: str  # "containers" or "initContainers"
    index: int
    name: str
    count: int  # max(limits, requests) for this container
    where: tuple[str, ...]  # "limits" and/or "requests"


@dataclass(frozen=True, slots=True)
class GpuScan:
    slots: tuple[GpuSlot, ...]
    total: int
    other: tuple[str, ...]  # other GPU-like resources (MIG profiles, AMD, ...)


def _is_other_gpu(resource: str) -> bool:
    if resource == keys.NVIDIA_GPU:
        return False
    return resource.startswith(keys.NVIDIA_PREFIX) or resource.startswith(keys.OTHER_GPU_PREFIXES)


def _gpu_count(value: object, field: str, index: int, section: str) -> int:
    return parse_count(value, f"{field}[{index}].resources.{section}[{keys.NVIDIA_GPU}]")


def _container_slot(
    field: str, index: int, container: Container
) -> tuple[GpuSlot | None, set[str]]:
    resources = container.get("resources")
    if not resources:
        return None, set()
    count = 0
    where: list[str] = []
    other: set[str] = set()
    for section in ("limits", "requests"):
        values = resources.get(section)
        if not values or not isinstance(values, dict):
            continue
        for name in values:
            if "/" in name and _is_other_gpu(name):
                other.add(name)
        if keys.NVIDIA_GPU in values:
            where.append(section)
            count = max(count, _gpu_count(values[keys.NVIDIA_GPU], field, index, section))
    if not where:
        return None, other
    name = str(container.get("name", ""))
    return GpuSlot(field, index, name, count, tuple(where)), other


def scan_gpus(spec: PodSpec) -> GpuScan:
    """Find every `nvidia.com/gpu` entry (init containers and sidecars included).

    Raises ContractError when a count is not a whole number.
    """
    slots: list[GpuSlot] = []
    other: set[str] = set()
    for field in CONTAINER_FIELDS:
        containers: list[Container] = spec.get(field) or []  # type: ignore[assignment]
        for index, container in enumerate(containers):
            slot, found = _container_slot(field, index, container)
            other |= found
            if slot is not None:
                slots.append(slot)
    return GpuScan(tuple(slots), sum(slot.count for slot in slots), tuple(sorted(other)))


def shareable(scan: GpuScan) -> bool:
    """Whether gpupack would share this pod's GPU: exactly one `nvidia.com/gpu` in all,
    and no other GPU-like resource."""
    return scan.total == 1 and not scan.other


def opted_in(pod: JSON, namespace: JSON | None) -> bool:
    """The webhook's scope: the pod's own label wins over its namespace's."""
    try:
        choice = read_optimize(labels_of(pod))
        if choice is not None:
            return choice
        return namespace is not None and read_optimize(labels_of(namespace)) is True
    except ContractError:
        return False  # the webhook skips an unusable label too


def escaped(pod: JSON, namespace: JSON | None, excluded: Collection[str]) -> bool:
    """Whether `pod` (with its Namespace, None when not opted in or unknown) escaped."""
    meta = pod.get("metadata") or {}
    if meta.get("namespace") in excluded:
        return False
    spec: PodSpec = pod.get("spec") or {}
    if (spec.get("schedulerName") or keys.DEFAULT_SCHEDULER) != keys.DEFAULT_SCHEDULER:
        return False
    try:
        if not shareable(scan_gpus(spec)):
            return False
    except ContractError:
        return False
    return opted_in(pod, namespace)
