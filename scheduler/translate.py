"""Kubernetes objects as placement values: nodes, capacity pods as GPUs, pods as requests.

Pure translation, no I/O. The GPU ledger is rebuilt from these alone: a Running capacity
pod with `gpupack.io/gpu-uuid` is a GPU (its memory from the exporter's annotation,
else the node's GFD memory label; unhealthy while the exporter says so with
`gpupack.io/gpu-unhealthy`; draining while consolidation empties it, with
`gpupack.io/draining`); a fractional pod bound to a node with
`gpupack.io/gpu-uuid` holds its share there; every other pod on a node holds its CPU,
memory and a pod slot. So a restarted scheduler books exactly what the annotations say.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, cast

from gpupack import codec, keys, seal
from gpupack.dra import current_slices
from gpupack.errors import ContractError
from gpupack.objects import JSON, PodSpec, annotations_of, labels_of
from gpupack.quantity import parse_bytes, parse_count, parse_millicores
from gpupack.shares import gpu_memory, is_live, pod_allocation, pool_of
from scheduler.ledger import Gpu, Node, Request
from scheduler.mps_health import daemon_ready

MiB: Final = 2**20
COMING_PREFIX: Final = "coming:"  # the GPU id of a capacity pod that has no UUID yet


def pod_key(pod: JSON) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def node_of(obj: JSON) -> Node:
    """A Node object as a placement node (usage is kept by the snapshot)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allocatable = status.get("allocatable") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    try:
        cpu = parse_millicores(allocatable.get("cpu", "0"), "allocatable.cpu")
        memory = parse_bytes(allocatable.get("memory", "0"), "allocatable.memory")
        pods = parse_count(allocatable.get("pods", "110"), "allocatable.pods")
    except ContractError:
        cpu, memory, pods = 0, 0, 0  # an unreadable node takes nothing
    return Node(
        name=str(meta.get("name", "")),
        cpu=cpu,
        memory=memory,
        max_pods=pods,
        labels=dict(meta.get("labels") or {}),
        ready=conditions.get("Ready") == "True",
        schedulable=not spec.get("unschedulable"),
        removing=any(
            t.get("key") in keys.AUTOSCALER_REMOVAL_TAINTS for t in spec.get("taints") or ()
        ),
    )


def node_gpu_memory(labels: Mapping[str, str]) -> int:
    """Per-GPU memory from GPU Feature Discovery's label, 0 when absent or unreadable."""
    value = labels.get(keys.GFD_MEMORY_MIB, "")
    return int(value) * MiB if value.isascii() and value.isdigit() else 0


@dataclass(frozen=True, slots=True)
class DraGpus:
    """A node's whole GPUs as DRA devices: how many, and the least memory of one (bytes;
    0: not said)."""

    count: int = 0
    memory: int = 0


def dra_gpus(slices: Iterable[JSON | None]) -> DraGpus:
    """The whole GPUs NVIDIA's DRA driver lists in a node's ResourceSlices (`keys.DRA_DRIVER`
    devices of type `keys.DRA_GPU_TYPE`, in each pool's newest generation; MIG devices
    and other drivers' are not whole GPUs). A device whose memory does not parse counts,
    with its memory unknown."""
    count, memories = 0, []
    for obj in current_slices(slices):
        spec = obj.get("spec") or {}
        for device in spec.get("devices") or ():
            attributes = device.get("attributes") or {}
            if (attributes.get("type") or {}).get("string") != keys.DRA_GPU_TYPE:
                continue
            count += 1
            value = ((device.get("capacity") or {}).get("memory") or {}).get("value")
            try:
                memories.append(parse_bytes(str(value), "capacity.memory") if value else 0)
            except ContractError:
                memories.append(0)
    known = [m for m in memories if m]
    return DraGpus(count, min(known) if known and len(known) == len(memories) else 0)


def is_capacity(pod: JSON, namespace: str = keys.SYSTEM_NAMESPACE) -> bool:
    """A capacity pod: the role label, in gpupack's namespace only (a label anyone can
    set elsewhere must not conjure a GPU)."""
    meta = pod.get("metadata") or {}
    return (
        meta.get("namespace") == namespace and labels_of(pod).get(keys.ROLE) == keys.ROLE_CAPACITY
    )


def capacity_gpu(pod: JSON, node: Node | None) -> Gpu | None:
    """The GPU a live capacity pod holds or will hold; None when it is not on a node yet
    (then it counts only as coming capacity of its pool)."""
    spec = pod.get("spec") or {}
    node_name = spec.get("nodeName")
    if not node_name or not is_live(pod):
        return None
    meta = pod.get("metadata") or {}
    annotations = annotations_of(pod)
    try:
        uuid = codec.read_gpu_uuid(annotations)
    except ContractError:
        uuid = None
    running = (pod.get("status") or {}).get("phase") == "Running" and uuid is not None
    labels = node.labels if node is not None else {}
    return Gpu(
        uuid=uuid if uuid is not None else COMING_PREFIX + str(meta.get("name", "")),
        node=str(node_name),
        memory=gpu_memory(pod) or node_gpu_memory(labels),
        model=labels.get(keys.GFD_PRODUCT, ""),
        pool=labels_of(pod).get(keys.POOL, ""),
        holder=str(meta.get("name", "")),
        coming=not running,
        # Unhealthy: the exporter says so, or its MPS daemon does not answer.
        healthy=not annotations.get(keys.GPU_UNHEALTHY) and daemon_ready(pod),
        draining=bool(annotations.get(keys.DRAINING)),
        removing=node is not None and node.removing,
    )


def host_requests(spec: JSON) -> tuple[int, int]:
    """(millicores, bytes) the pod requests of its node, counted as kube-scheduler counts
    them (component-helpers' PodRequests): the containers' sum plus every native sidecar
    (an init container with `restartPolicy: Always` runs beside them), or, if larger, the
    peak of the init phase (each ordinary init container plus the sidecars started before
    it); pod-level requests (`spec.resources`) replace the containers' where set; plus
    the pod overhead."""

    def requests(container: JSON) -> tuple[int, int]:
        wanted = (container.get("resources") or {}).get("requests") or {}
        try:
            return (
                parse_millicores(wanted.get("cpu", 0), "cpu"),
                parse_bytes(wanted.get("memory", 0), "memory"),
            )
        except ContractError:
            return 0, 0

    containers = [requests(c) for c in cast(list[JSON], spec.get("containers") or [])]
    cpu, memory = sum(c for c, _ in containers), sum(m for _, m in containers)
    sidecar_cpu = sidecar_memory = init_cpu = init_memory = 0
    for init in cast(list[JSON], spec.get("initContainers") or []):
        c, m = requests(init)
        if init.get("restartPolicy") == "Always":
            cpu, memory = cpu + c, memory + m
            sidecar_cpu, sidecar_memory = sidecar_cpu + c, sidecar_memory + m
            c, m = sidecar_cpu, sidecar_memory
        else:
            c, m = c + sidecar_cpu, m + sidecar_memory
        init_cpu, init_memory = max(init_cpu, c), max(init_memory, m)
    cpu, memory = max(cpu, init_cpu), max(memory, init_memory)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    if pod_level:
        level_cpu, level_memory = requests({"resources": {"requests": pod_level}})
        cpu = level_cpu if "cpu" in pod_level else cpu
        memory = level_memory if "memory" in pod_level else memory
    overhead_cpu, overhead_memory = requests({"resources": {"requests": spec.get("overhead")}})
    return cpu + overhead_cpu, memory + overhead_memory


@dataclass(frozen=True, slots=True)
class NotOurs:
    """Why a pod addressed to the scheduler will not be placed (the user can fix it)."""

    reason: str
    message: str


def request_of(pod: JSON, key: bytes | None = None) -> Request | NotOurs:
    """What a fractional pod asks for, or why it cannot be placed.

    Only pods the webhook admitted are placed: with the decision `key`, the pod's seal
    must verify for its namespace and annotations (`gpupack.seal`); without one (pods
    already bound, whose booking is what runs), its `gpupack.io/decision` must be there.
    A pod that names gpupack-scheduler itself did not go through policy, and may carry
    forged shares.
    """
    annotations = annotations_of(pod)
    admit = (
        f"create it in a namespace labelled {keys.OPTIMIZE}={keys.OPTIMIZE_ENABLED}, "
        "or label the pod so"
    )
    if not annotations.get(keys.DECISION):
        return NotOurs(
            "NotAdmitted",
            f"the pod names {keys.SCHEDULER_NAME} but was not admitted by the gpupack webhook "
            f"(no {keys.DECISION} annotation); {admit}",
        )
    if key is not None:
        namespace = str((pod.get("metadata") or {}).get("namespace", ""))
        try:
            seal.verify(key, namespace, annotations)
        except seal.SealError as error:
            return NotOurs(
                "NotAdmitted",
                f"the pod names {keys.SCHEDULER_NAME} but its admission by the gpupack "
                f"webhook cannot be proven ({error}); {admit}",
            )
    allocation = pod_allocation(pod)
    if allocation is None:
        return NotOurs(
            "InvalidShare",
            f"{keys.GPU_COMPUTE} is missing or unreadable; expected a quantity such as 300m",
        )
    spec = cast(PodSpec, pod.get("spec") or {})
    cpu, memory = host_requests(cast(JSON, spec))
    return Request(
        key=pod_key(pod),
        cpu=cpu,
        memory=memory,
        compute=allocation.compute,
        gpu_memory=allocation.memory,
        gpus=1,
        pool=pool_of(pod),  # the webhook's capacity planning keys it the same way
        owner=allocation.owner,
        exclusive=allocation.exclusive,
    )


def host_request(pod: JSON) -> Request:
    """Any other pod on a node: it holds CPU, memory and a pod slot, no GPU share."""
    cpu, memory = host_requests(pod.get("spec") or {})
    return Request(key=pod_key(pod), cpu=cpu, memory=memory, gpus=0)


def assignment_of(pod: JSON) -> tuple[str, str] | None:
    """(GPU UUID, capacity pod) the scheduler wrote on a bound pod, None when absent."""
    annotations = annotations_of(pod)
    try:
        uuid = codec.read_gpu_uuid(annotations)
    except ContractError:
        return None
    holder = annotations.get(keys.CAPACITY_POD)
    if uuid is None or not holder:
        return None
    return uuid, holder
