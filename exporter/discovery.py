"""Which GPU each capacity pod on this node holds: the annotations the exporter writes.

kubelet's pod-resources API says which device IDs it allocated to each pod. For a
capacity pod (label `gpupack.io/role=capacity` in gpupack's namespace) that is one
`nvidia.com/gpu` device; the NVIDIA device plugin names devices by UUID (`GPU-...`, or
`MIG-...` under the MIG "single" strategy), or by index when it runs with
`DEVICE_ID_STRATEGY=index`. This module turns those answers and NVML's device list into
the patches that put `gpupack.io/gpu-uuid` and `gpupack.io/gpu-memory` on each capacity
pod, and into problems a person can act on. Pure: the shell does the I/O.
"""

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from exporter.pods import PodInfo
from exporter.readings import Device
from gpupack import codec, keys
from gpupack.dra import current_slices
from gpupack.errors import ContractError
from gpupack.objects import JSON
from gpupack.quantity import format_memory

RESOURCE: Final = keys.NVIDIA_GPU


@dataclass(frozen=True, slots=True)
class Patch:
    namespace: str
    name: str
    resource_version: str  # the precondition: a pod changed or recreated since is a 409
    annotations: Mapping[str, str | None]  # None removes the annotation


@dataclass(frozen=True, slots=True)
class DiscoveryPlan:
    patches: tuple[Patch, ...]
    problems: tuple[str, ...]  # one line per capacity pod we could not annotate, and why


def device_uuid(device_id: str, devices: Mapping[str, Device]) -> str | None:
    """The UUID a device plugin ID names: the ID itself, or the GPU at that index."""
    try:
        return codec.read_gpu_uuid({keys.GPU_UUID: device_id})
    except ContractError:
        pass
    if device_id.isdigit():
        for device in devices.values():
            if device.index == int(device_id):
                return device.uuid
    return None


def claim_gpu_uuids(
    claim: JSON, requests: Collection[str], slices: Iterable[JSON]
) -> tuple[tuple[str, ...], str]:
    """The UUIDs of the GPUs a ResourceClaim's `requests` were allocated, from the devices'
    `uuid` attributes in the node's ResourceSlices (NVIDIA's DRA driver); or no UUIDs and
    why. A result is a device by driver, pool and name; kube-scheduler writes them."""
    results = [
        r
        for r in ((claim.get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results")
        or ()
        if r.get("request") in requests
    ]
    name = (claim.get("metadata") or {}).get("name", "")
    if not results:
        return (), f"ResourceClaim {name} has no allocation for {', '.join(sorted(requests))} yet"
    attributes: dict[tuple[str, str, str], JSON] = {}
    for obj in current_slices(slices):
        spec = obj.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name", ""))
        for device in spec.get("devices") or ():
            key = (str(spec.get("driver", "")), pool, str(device.get("name", "")))
            attributes[key] = device.get("attributes") or {}
    uuids = []
    for result in results:
        key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
        uuid = (attributes.get(key, {}).get("uuid") or {}).get("string")
        if not uuid:
            where = f"device {key[2]} of pool {key[1]} (driver {key[0]})"
            return (), f"ResourceClaim {name}: no ResourceSlice of this node gives {where} a uuid"
        uuids.append(str(uuid))
    return tuple(uuids), ""


def plan(
    capacity_pods: Sequence[PodInfo],
    allocated: Mapping[tuple[str, str], Sequence[str]],
    devices: Sequence[Device],
    unhealthy: Mapping[str, str] | None = None,
    unresolved: Mapping[tuple[str, str], str] | None = None,
) -> DiscoveryPlan:
    """Patches for the capacity pods whose annotations differ from what kubelet says.

    `allocated` maps (namespace, name) to the `nvidia.com/gpu` device IDs kubelet gave
    the pod. Annotations are rewritten when they differ: kubelet is the truth about
    which device a pod holds, but a GPU UUID NVML answers without (when it answers) is
    not written: only a GPU of this node is. With NVML down, a device gets its UUID and
    no memory: the scheduler then reads the
    node's GFD memory label, and the memory follows once NVML answers. `unhealthy` says
    why each unhealthy GPU is, by UUID: its capacity pod carries the reason in
    `gpupack.io/gpu-unhealthy` (the scheduler places no new pod there), removed once the
    GPU is healthy again. `unresolved` says why a pod given a GPU through DRA has no
    device IDs (`claim_gpu_uuids`).
    """
    unhealthy = unhealthy or {}
    unresolved = unresolved or {}
    by_uuid = {device.uuid: device for device in devices}
    patches: list[Patch] = []
    problems: list[str] = []
    for pod in capacity_pods:
        if not pod.capacity or pod.phase != "Running":
            continue
        ids = allocated.get((pod.namespace, pod.name))
        where = f"capacity pod {pod.namespace}/{pod.name}"
        if ids is None:
            why = unresolved.get((pod.namespace, pod.name))
            problems.append(f"{where}: {why or f'kubelet lists no {RESOURCE} device for it yet'}")
            continue
        if len(ids) != 1:
            problems.append(f"{where}: kubelet gave it {len(ids)} {RESOURCE} devices, not 1")
            continue
        uuid = device_uuid(ids[0], by_uuid)
        if uuid is None:
            problems.append(
                f"{where}: device ID {ids[0]!r} is neither a GPU/MIG UUID nor the index of a "
                "GPU NVML lists"
            )
            continue
        if by_uuid and uuid.startswith("GPU-") and uuid not in by_uuid:
            problems.append(
                f"{where}: kubelet names GPU {uuid}, which NVML on this node does not list; "
                "not written"
            )
            continue
        want: dict[str, str | None] = {keys.GPU_UUID: uuid}
        device = by_uuid.get(uuid)
        memory = device.memory_total if device is not None and device.memory_total > 0 else None
        if memory is not None:
            want[keys.GPU_MEMORY] = format_memory(memory)
        why = unhealthy.get(uuid, "")[:256]
        if why != pod.unhealthy:
            want[keys.GPU_UNHEALTHY] = why or None
        stale = pod.gpu_uuid != uuid or (memory is not None and pod.memory != memory)
        if stale or why != pod.unhealthy:
            patches.append(Patch(pod.namespace, pod.name, pod.resource_version, want))
    return DiscoveryPlan(tuple(patches), tuple(problems))
