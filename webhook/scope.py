"""Which pods the webhook takes over: the GPU request scan and the opt-in rules.

Pure functions over the pod (and the Namespace, when the webhook could read it). Each
returns either what it found or a (Reason, message) saying why the pod stays as it is.
"""

from dataclasses import dataclass

from gpupack import keys
from gpupack.codec import read_optimize
from gpupack.errors import ContractError
from gpupack.kube import JSON, Container, PodSpec, labels_of
from gpupack.quantity import parse_count
from webhook.decision import Reason

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


def gpu_out_of_scope(scan: GpuScan) -> tuple[Reason, str] | None:
    if scan.other:
        return Reason.OTHER_GPU_RESOURCE, (
            f"asks for {', '.join(scan.other)}; gpupack only shares whole {keys.NVIDIA_GPU} GPUs"
        )
    if scan.total == 0:
        return Reason.NO_GPU, f"no container asks for {keys.NVIDIA_GPU}"
    if scan.total > 1:
        return Reason.MULTIPLE_GPUS, (
            f"asks for {scan.total} GPUs in total; gpupack shares pods that ask for exactly one"
        )
    return None


def opt_in(pod_labels: dict[str, str], namespace: JSON | None) -> tuple[Reason, str] | None:
    """None when the pod is opted in; otherwise why not.

    The pod's own label wins over its namespace's. When the Namespace could not be read,
    the API server's selectors already sent only opted-in pods, so the pod is in.
    Raises ContractError for a label value other than enabled/disabled.
    """
    pod_choice = read_optimize(pod_labels)
    if pod_choice is False:
        return Reason.OPTED_OUT, f"the pod is labelled {keys.OPTIMIZE}={keys.OPTIMIZE_DISABLED}"
    if pod_choice is True or namespace is None:
        return None
    try:
        ns_choice = read_optimize(labels_of(namespace))
    except ContractError as exc:
        return Reason.NOT_OPTED_IN, f"the namespace's label is not usable: {exc}"
    if ns_choice is True:
        return None
    if ns_choice is False:
        return Reason.OPTED_OUT, (
            f"the namespace is labelled {keys.OPTIMIZE}={keys.OPTIMIZE_DISABLED}"
        )
    return Reason.NOT_OPTED_IN, (
        f"neither the pod nor its namespace is labelled {keys.OPTIMIZE}={keys.OPTIMIZE_ENABLED}"
    )


def scheduling_out_of_scope(spec: PodSpec) -> tuple[Reason, str] | None:
    node_name = spec.get("nodeName")
    if node_name:
        return Reason.NODE_NAME_SET, f"spec.nodeName is already set to {node_name!r}"
    scheduler = spec.get("schedulerName") or keys.DEFAULT_SCHEDULER
    if scheduler not in (keys.DEFAULT_SCHEDULER, keys.SCHEDULER_NAME):
        return Reason.OTHER_SCHEDULER, f"spec.schedulerName names another scheduler: {scheduler!r}"
    return None
