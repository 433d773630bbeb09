"""How many capacity pods a pool is missing, what to call them, and what they look like.

Pure and standard-library only: part of the contract, because the scheduler (which
creates capacity when a pod fits nowhere), the webhook (which plans at admission, for
its audit line) and `kubectl gpupack` reports must agree on names and packing. Each
turns its caches into `PlanGpu`s and `Allocation`s and asks `plan` how many GPUs the pool
lacks; the scheduler names them with `capacity_names` and builds them with
`capacity_pod`, placed where `Where` says.

Packing is first-fit-decreasing in two dimensions: compute (millis, 1000 per GPU) and
memory (bytes, checked only where the GPU's memory is known; the exporter writes it on
the capacity pod). An exclusive allocation (`real-time-mps`) shares a GPU only with
allocations of the same workload. The result depends only on the values, never on the
order they arrive in, so every replica computes the same answer.

Names are `gpupack-capacity-<pool>-<n>` with the lowest free n: two writers racing for
the same pool (a restarted extender and its predecessor's creates still in flight)
choose the same names, and the API server's AlreadyExists turns the second create into
a no-op instead of a duplicate GPU.
"""

import copy
import hashlib
import itertools
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpupack import keys, mps
from gpupack.objects import JSON, labels_of
from gpupack.pool import is_mps

FULL_GPU: Final = 1000  # compute millis in one GPU
NAME_PREFIX: Final = "gpupack-capacity"
CONTAINER_NAME: Final = "capacity"
DEFAULT_IMAGE: Final = "registry.k8s.io/pause:3.10"
GPUPACK_IMAGE: Final = "ghcr.io/gpupack/gpupack"  # MPS pools' capacity pods run gpupack's
CREATED_FOR: Final = f"{keys.DOMAIN}/created-for"  # which workload first asked for the GPU
# The requirements it was made with (`Where.key`): which waiting pods it is coming for.
PLACEMENT: Final = f"{keys.DOMAIN}/placement"
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
COMPONENT: Final = "app.kubernetes.io/component"
PAUSE_USER: Final = 65535  # the pause image's nobody user
SHARING: Final = f"{keys.DOMAIN}/sharing"  # label on an MPS pool's capacity pods: "mps"
HOSTNAME: Final = "kubernetes.io/hostname"
INHERITED: Final = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "priorityClassName",
    "runtimeClassName",
)


_UNBOUNDED: Final = 1 << 30


@dataclass(frozen=True, slots=True)
class Allocation:
    """One fractional pod's share: placed on a GPU, pending, or about to be admitted."""

    key: str  # unique: the decision id or the pod's namespace/name
    compute: int  # millis of one GPU
    memory: int  # bytes
    owner: str  # "namespace/Kind/name" of the workload
    exclusive: bool = False  # real-time-mps: shares a GPU only with the same owner


@dataclass(frozen=True, slots=True)
class PlanGpu:
    """A capacity pod: one whole GPU, running or pending, and what is already on it."""

    name: str
    memory: int | None = None  # bytes; None until the exporter reports the device
    running: bool = False
    allocations: tuple[Allocation, ...] = ()


@dataclass(frozen=True, slots=True)
class Bin:
    """A GPU in the packing: an existing capacity pod (`name`) or one to create (None)."""

    name: str | None
    memory: int | None
    allocations: tuple[Allocation, ...]

    @property
    def compute_used(self) -> int:
        return sum(a.compute for a in self.allocations)

    @property
    def memory_used(self) -> int:
        return sum(a.memory for a in self.allocations)


@dataclass(frozen=True, slots=True)
class Plan:
    bins: tuple[Bin, ...]
    oversized: tuple[str, ...] = ()  # keys of allocations larger than the assumed new GPU

    @property
    def missing(self) -> int:
        """How many capacity pods to create."""
        return sum(1 for b in self.bins if b.name is None)


@dataclass(slots=True)
class _OpenBin:
    name: str | None
    memory: int | None
    allocations: list[Allocation] = field(default_factory=list)
    compute_used: int = 0
    memory_used: int = 0
    owners: set[str] = field(default_factory=set)
    exclusive_owner: str | None = None

    def fits(self, a: Allocation) -> bool:
        if self.compute_used + a.compute > FULL_GPU:
            return False
        if self.memory is not None and self.memory_used + a.memory > self.memory:
            return False
        if self.exclusive_owner is not None and self.exclusive_owner != a.owner:
            return False
        return not (a.exclusive and self.owners - {a.owner})

    def add(self, a: Allocation) -> None:
        self.add_run([a])

    def add_run(self, run: list[Allocation]) -> None:
        """Add allocations of one shape (`_shape`): the sums grow by one multiple, not
        one allocation at a time (a burst of a workload is hundreds of them)."""
        if not run:
            return
        first = run[0]
        self.allocations.extend(run)
        self.compute_used += first.compute * len(run)
        self.memory_used += first.memory * len(run)
        if first.exclusive:
            self.owners.add(first.owner)
            self.exclusive_owner = first.owner
        else:
            self.owners.update(a.owner for a in run)

    def room_for(self, a: Allocation) -> int:
        """How many more allocations shaped like `a` fit (the same answer `fits` gives
        one at a time)."""
        if self.exclusive_owner is not None and self.exclusive_owner != a.owner:
            return 0
        if a.exclusive and self.owners - {a.owner}:
            return 0
        count = (FULL_GPU - self.compute_used) // a.compute if a.compute > 0 else _UNBOUNDED
        if self.memory is not None and a.memory > 0:
            count = min(count, (self.memory - self.memory_used) // a.memory)
        return max(count, 0)

    def freeze(self) -> Bin:
        return Bin(self.name, self.memory, tuple(self.allocations))


def _decreasing(a: Allocation) -> tuple[int, int, str, str]:
    return (-a.compute, -a.memory, a.owner, a.key)


def _shape(a: Allocation) -> tuple[int, int, bool, str]:
    """Allocations that pack alike. The owner matters only to exclusive (MPS) ones; for
    the rest it matters only at GPUs an MPS workload holds (see `_fill`)."""
    return (a.compute, a.memory, a.exclusive, a.owner if a.exclusive else "")


def _fill(open_bin: _OpenBin, pending: list[Allocation]) -> list[Allocation]:
    """Put as many of `pending` (one shape, in order) on `open_bin` as fit, first ones
    first, the way first fit one at a time would; return the rest."""
    owner = open_bin.exclusive_owner
    if owner is None or pending[0].exclusive:
        room = open_bin.room_for(pending[0])
        open_bin.add_run(pending[:room])
        return pending[room:]
    # A GPU held by an MPS workload takes only that workload's pods.
    eligible = [i for i, a in enumerate(pending) if a.owner == owner]
    if not eligible:
        return pending
    taken = set(eligible[: open_bin.room_for(pending[eligible[0]])])
    open_bin.add_run([pending[index] for index in sorted(taken)])
    return [a for i, a in enumerate(pending) if i not in taken]


def plan(
    gpus: Sequence[PlanGpu], unplaced: Iterable[Allocation], *, new_gpu_memory: int | None
) -> Plan:
    """Pack `unplaced` onto `gpus` (first fit, largest first), opening new GPUs as needed.

    New GPUs are assumed to have `new_gpu_memory` bytes (None: unknown, check compute only).
    An allocation too large for that gets a new GPU of unknown memory to itself and is
    reported in `oversized`.
    """
    bins: list[_OpenBin] = []
    for gpu in sorted(gpus, key=lambda g: (not g.running, g.name)):
        open_bin = _OpenBin(gpu.name, gpu.memory)
        for allocation in gpu.allocations:
            open_bin.add(allocation)
        bins.append(open_bin)
    oversized: list[str] = []
    # First-fit decreasing, a run of equal shapes at a time: first fit of k identical
    # allocations fills each bin with as many as fit, in bin order. A burst of one
    # workload's pods is one run, so this is O(runs x bins + n), not O(n x bins).
    for _, run in itertools.groupby(sorted(unplaced, key=_decreasing), key=_shape):
        pending = list(run)
        for open_bin in bins:
            if not pending:
                break
            pending = _fill(open_bin, pending)
        while pending:
            target = _OpenBin(None, new_gpu_memory)
            if not target.fits(pending[0]):
                target = _OpenBin(None, None)
                oversized.append(pending[0].key)
            room = max(target.room_for(pending[0]), 1)
            target.add_run(pending[:room])
            pending = pending[room:]
            bins.append(target)
    return Plan(tuple(b.freeze() for b in bins), tuple(oversized))


@dataclass(frozen=True, slots=True)
class Shortfall:
    """What `plan` says a pool lacks, without its bins."""

    missing: int  # capacity pods to create
    oversized: tuple[str, ...] = ()  # as `Plan.oversized`


@dataclass(slots=True)
class _Group:
    """`count` GPUs in one state: the sums of what they hold, and their memory."""

    count: int
    used: int
    used_memory: int
    size: int | None

    def room(self, compute: int, memory: int) -> int:
        return _room(self.used, self.used_memory, self.size, compute, memory)

    def taking(self, count: int, pods: int, compute: int, memory: int) -> "_Group":
        return _Group(
            count, self.used + pods * compute, self.used_memory + pods * memory, self.size
        )


def shortfall(
    gpus: Sequence[PlanGpu], unplaced: Iterable[Allocation], *, new_gpu_memory: int | None
) -> Shortfall:
    """`plan(...)`'s `missing` and `oversized`, at the cost of the pool's distinct shapes
    and GPUs rather than of its allocations: the webhook asks it for every admission, of
    pools that can hold hundreds of waiting pods. GPUs to create are kept as groups of
    equal ones (first fit fills the first of a group before the next, so a group splits
    into at most three), never one by one. Where a real-time-mps allocation is involved
    (owners then matter) it asks `plan` itself. A property test holds it to `plan`."""
    unplaced = list(unplaced)
    packing = Packing.of(gpus, new_gpu_memory)
    if packing is None or any(a.exclusive for a in unplaced):
        result = plan(gpus, unplaced, new_gpu_memory=new_gpu_memory)
        return Shortfall(result.missing, result.oversized)
    packing.fit(unplaced)
    return Shortfall(packing.missing, tuple(packing.oversized))


@dataclass(slots=True)
class Packing:
    """A pool's GPUs as `shortfall` packs them: groups of equal GPUs, those held (first
    fit's order: running first, then by name) and those to create. `fit` packs more
    allocations onto them, first fit decreasing within its own allocations only: a
    packing fitted twice may take a GPU more than one packed once with both sets (the
    webhook's estimate between two full plans, `webhook.capacity`)."""

    held: list[_Group]
    created: list[_Group]
    new_gpu_memory: int | None
    oversized: list[str]

    @classmethod
    def of(cls, gpus: Sequence[PlanGpu], new_gpu_memory: int | None) -> "Packing | None":
        """The packing of `gpus` with nothing to fit yet; None where a GPU holds a
        real-time-mps allocation (owners matter then: only `plan` packs it)."""
        if any(a.exclusive for g in gpus for a in g.allocations):
            return None
        held = [
            _Group(
                1,
                sum(a.compute for a in g.allocations),
                sum(a.memory for a in g.allocations),
                g.memory,
            )
            for g in sorted(gpus, key=lambda g: (not g.running, g.name))
        ]
        return cls(held, [], new_gpu_memory, [])

    @property
    def missing(self) -> int:
        return sum(g.count for g in self.created)

    def copy(self) -> "Packing":
        """Another packing in the same state (groups are never changed, only replaced)."""
        return Packing(
            list(self.held), list(self.created), self.new_gpu_memory, list(self.oversized)
        )

    def fit(self, unplaced: Sequence[Allocation]) -> None:
        """Pack `unplaced` (none of them real-time-mps), largest shape first, onto the GPUs
        held, then those to create, then onto new ones."""
        created = self.created
        shapes = Counter((a.compute, a.memory) for a in unplaced)
        for (compute, memory), count in sorted(shapes.items(), key=lambda s: (-s[0][0], -s[0][1])):
            n = count
            for bins in (self.held, created):
                index = 0
                while n and index < len(bins):
                    group = bins[index]
                    room = group.room(compute, memory)
                    if not room:
                        index += 1
                        continue
                    full = min(group.count, n // room)
                    rest = n - full * room if full < group.count else 0
                    parts = [
                        group.taking(full, room, compute, memory),
                        group.taking(1 if rest else 0, rest, compute, memory),
                        group.taking(group.count - full - (1 if rest else 0), 0, compute, memory),
                    ]
                    parts = [p for p in parts if p.count]
                    bins[index : index + 1] = parts
                    index += len(parts)
                    n -= full * room + rest
            if not n:
                continue
            new_gpu_memory = self.new_gpu_memory
            too_large = _room(0, 0, new_gpu_memory, compute, memory) == 0  # for the assumed GPU
            size = None if too_large else new_gpu_memory
            room = max(_room(0, 0, size, compute, memory), 1)
            if too_large:  # each GPU created for them names its first
                run = sorted(
                    (a for a in unplaced if (a.compute, a.memory) == (compute, memory)),
                    key=_decreasing,
                )
                self.oversized += [a.key for a in run[count - n :: room]]
            empty = _Group(0, 0, 0, size)
            if n // room:
                created.append(empty.taking(n // room, room, compute, memory))
            if n % room:
                created.append(empty.taking(1, n % room, compute, memory))


def _room(used: int, used_memory: int, size: int | None, compute: int, memory: int) -> int:
    """How many allocations of (`compute`, `memory`) a GPU with these sums still takes:
    `_OpenBin.room_for` for allocations of no real-time-mps workload."""
    count = (FULL_GPU - used) // compute if compute > 0 else _UNBOUNDED
    if size is not None and memory > 0:
        count = min(count, (size - used_memory) // memory)
    return max(count, 0)


def default_mps_image(version: str) -> str:
    """gpupack's own image at `version`: what an MPS pool's capacity pods run."""
    return f"{GPUPACK_IMAGE}:{version}"


def capacity_name(pool: str, index: int) -> str:
    return f"{NAME_PREFIX}-{pool}-{index}"


def capacity_index(pool: str, name: str) -> int | None:
    """n for `gpupack-capacity-<pool>-<n>`, None for any other name."""
    match = re.fullmatch(rf"{re.escape(NAME_PREFIX)}-{re.escape(pool)}-(0|[1-9][0-9]*)", name)
    return int(match[1]) if match else None


def capacity_names(pool: str, used: Iterable[str], count: int) -> tuple[str, ...]:
    """`count` names for new capacity pods: the lowest indices not in `used`."""
    taken = {i for name in used if (i := capacity_index(pool, name)) is not None}
    names: list[str] = []
    index = 0
    while len(names) < count:
        if index not in taken:
            names.append(capacity_name(pool, index))
        index += 1
    return tuple(names)


STEER_WEIGHT: Final = 100  # towards a node the waiting pod may go to
PACK_WEIGHT: Final = 50  # towards a node that already holds capacity pods
MAX_NODES: Final = 1000  # node names in one term; more is a huge pod, not a better one


@dataclass(frozen=True, slots=True)
class Where:
    """Where a new capacity pod may go (required) and should go (preferred).

    - `avoid` (required): the existing nodes where the pods it is made for may not run, by
      any of their rules (kube-scheduler found them infeasible), or whose GPUs are too
      small for what they ask. A GPU there would be
      wasted, so the capacity pod may go to any other node, including one an autoscaler
      adds.
    - `near` (required): the pods' required pod-affinity terms, with their namespaces
      pinned: a pod that must sit next to another is helped only by a GPU next to it,
      and an autoscaler must not add a node for it that the pod could not use.
    - `steer` (preferred, weight 100): the nodes the pods may go to.
    - `packed` (preferred, weight 50): the nodes already holding capacity pods.

    `key` is what the requirements say, as a short stable digest, made once: waiting pods
    with equal keys can use the same new GPUs, others cannot. Empty for no requirement
    at all (the preferences do not change where a GPU may land).
    """

    steer: tuple[str, ...] = ()
    packed: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    near: tuple[JSON, ...] = ()
    key: str = field(default="", init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.avoid or self.near:
            text = json.dumps([sorted(self.avoid), list(self.near)], sort_keys=True)
            object.__setattr__(self, "key", hashlib.sha256(text.encode()).hexdigest()[:16])


ANYWHERE: Final = Where()  # no requirement, no preference


def holding_nodes(pods: Iterable[JSON]) -> list[str]:
    """The nodes these capacity pods are on, sorted: where a new GPU packs best."""
    return sorted(
        {str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")}
    )


def selects(selector: JSON | None, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) selects `labels`. A null
    selector selects nothing, an empty one everything (as pod affinity reads them)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or ()
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def affinity_to_others(pod: JSON) -> tuple[JSON, ...]:
    """The pod's required pod-affinity terms that a capacity pod carries (`Where.near`):
    the terms that do not select the pod itself (a pod that must sit with its own
    replicas may start anywhere when none runs yet, and `Where.avoid` already keeps its
    GPU on the nodes where they run), with `namespaces` pinned to the pod's own when the term
    names none (a capacity pod lives in another namespace). `matchLabelKeys` is merged
    into the selector by the API server when the pod is created, so it is dropped."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("podAffinity") or {}
    terms: list[JSON] = []
    for term in affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or ():
        scoped = term.get("namespaces") or term.get("namespaceSelector") is not None
        # A namespaceSelector may select the pod's own namespace: read as "it does", so a
        # term that could be the pod's own is never carried (carried, it could leave the
        # first replica's capacity pod nowhere to go).
        in_scope = namespace in term["namespaces"] if term.get("namespaces") else True
        if in_scope and selects(term.get("labelSelector"), labels):
            continue
        carried = {
            k: copy.deepcopy(v)
            for k, v in term.items()
            if k not in ("matchLabelKeys", "mismatchLabelKeys")
        }
        if not scoped:
            carried["namespaces"] = [namespace]
        terms.append(carried)
    return tuple(terms)


def _placement(where: Where) -> dict[str, str]:
    """The `PLACEMENT` annotation of a capacity pod made with `where`: none without
    requirements (read as the empty key)."""
    return {PLACEMENT: where.key} if where.key else {}


def placement_of(pod: JSON) -> str:
    """The placement key a capacity pod was made with ("" when none)."""
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(PLACEMENT, ""))


def _prefer(spec: JSON, steer: Sequence[str], packed: Sequence[str]) -> None:
    """Add the placement preferences to a capacity pod's spec (see `Where`), all as
    node affinity: kube-scheduler normalises each plugin's scores, so preferences in two
    plugins tie at their maxima, and an existing capacity pod's pod affinity would pull
    every new one towards its node, even where the waiting pod may not go. In one plugin
    the weights add: a node of `steer` (100) beats one merely in `packed` (50), and one in
    both (150) wins."""
    terms = [(STEER_WEIGHT, steer), (PACK_WEIGHT, packed)]
    preferred = [
        {
            "weight": weight,
            "preference": {
                "matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": sorted(nodes)}]
            },
        }
        for weight, nodes in terms
        if nodes and len(nodes) <= MAX_NODES
    ]
    if preferred:
        node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).extend(preferred)


def _require(
    spec: JSON, avoid: Sequence[str], near: Sequence[JSON], labels: Mapping[str, str] | None
) -> None:
    """Add the requirements of `Where` to a capacity pod's spec: `avoid` as a NotIn in
    every required node-selector term (terms are ORed, so each needs it), `near` as
    required pod affinity. The nodes are named by `kubernetes.io/hostname` when `labels`
    is None, else by their `gpupack.io/node` label, whose value `labels` gives for each
    (Karpenter ignores every pod that names the hostname in a required term). More
    than `MAX_NODES` names to avoid is left to the preferences (and to scale-down, which
    releases a GPU no waiting pod can use)."""
    if labels is None:
        key, values = HOSTNAME, sorted(avoid)
    else:  # a node with no label is gone: it takes no pod
        key, values = keys.NODE, sorted({labels[name] for name in avoid if name in labels})
    if values and len(avoid) <= MAX_NODES:
        expression = {"key": key, "operator": "NotIn", "values": values}
        node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.setdefault("nodeSelectorTerms", [])
        if not terms:
            terms.append({})
        for term in terms:
            term.setdefault("matchExpressions", []).append(copy.deepcopy(expression))
    if near:
        pod_affinity = spec.setdefault("affinity", {}).setdefault("podAffinity", {})
        pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).extend(
            copy.deepcopy(list(near))
        )


def capacity_pod(
    pool: str,
    scheduling: JSON,
    *,
    index: int,
    created_for: str,
    image: str = DEFAULT_IMAGE,
    mps_image: str | None = None,
    namespace: str = keys.SYSTEM_NAMESPACE,
    where: Where = ANYWHERE,
    node_labels: Mapping[str, str] | None = None,
) -> JSON:
    """The manifest of capacity pod `index` of `pool`: holds one GPU, does nothing else,
    or, for an MPS pool (`gpupack.pool.is_mps`), runs the GPU's MPS control daemon
    (`mps_daemon_container`, in `mps_image`, gpupack's own).

    It inherits the workload's scheduling metadata (nodeSelector, node affinity,
    tolerations, priorityClassName, runtimeClassName) so kube-scheduler puts it where the
    workload may run, and `where` narrows that to where the pods it is made for could
    then run (`Where`): required, it never lands (nor makes an autoscaler add a node)
    where those pods could not use it; preferred, it fills nodes that already hold GPUs.
    No owner reference: owners cannot cross namespaces.
    """
    one_gpu = {keys.NVIDIA_GPU: "1"}
    daemon = is_mps(scheduling)
    if daemon and not mps_image:
        raise ValueError("an MPS pool's capacity pod needs an image with gpupack-mps-daemon")
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": image,
        "resources": {
            "limits": dict(one_gpu),
            "requests": {**one_gpu, "cpu": "1m", "memory": "8Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": PAUSE_USER,
            "runAsGroup": PAUSE_USER,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    spec: JSON = {
        "schedulerName": keys.CAPACITY_SCHEDULER_NAME,
        "containers": [container],
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        **{k: copy.deepcopy(v) for k, v in scheduling.items() if k in INHERITED},
    }
    labels = {
        keys.ROLE: keys.ROLE_CAPACITY,
        keys.POOL: pool,
        MANAGED_BY: "gpupack",
        COMPONENT: "capacity",
    }
    if daemon:
        spec["containers"] = [mps_daemon_container(container, str(mps_image))]
        spec["volumes"] = [mps.volume()]
        labels[SHARING] = mps.SHARING_MPS
    _require(spec, where.avoid, where.near, node_labels)
    _prefer(spec, where.steer, where.packed)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": capacity_name(pool, index),
            "namespace": namespace,
            "labels": labels,
            "annotations": {CREATED_FOR: created_for, **_placement(where)},
        },
        "spec": spec,
    }


def runs_mps_daemon(pod: JSON) -> bool:
    """A capacity pod of an MPS pool (labelled so by `capacity_pod`): it runs its GPU's
    MPS control daemon and shares that GPU's MPS directory with the pods placed on it."""
    return labels_of(pod).get(SHARING) == mps.SHARING_MPS


DAEMON_USER: Final = 0
# What nvidia-cuda-mps-control needs beyond a plain process: it starts each MPS server
# as the user of the client that asked for it (setuid, setgid), and that server writes
# the shared pipe and log directories it does not own.
DAEMON_CAPABILITIES: Final = ("SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "FOWNER")


def mps_daemon_container(holder: JSON, image: str) -> JSON:
    """The capacity container of an MPS pool: it holds the GPU as the pause container does
    and runs `gpupack-mps-daemon`, which supervises the GPU's MPS control daemon.

    The NVIDIA container runtime mounts `nvidia-cuda-mps-control` into the container
    (driver capability `compute`). The daemon runs as root, because MPS starts each
    server as the user of its clients, with only the capabilities that needs; no
    privilege. Ready once the daemon answers on its pipe (`--check`)."""
    check = {"exec": {"command": [mps.DAEMON_COMMAND, "--check"]}}
    return {
        **holder,
        "image": image,
        "command": [mps.DAEMON_COMMAND],
        "env": [
            {"name": keys.ENV_DRIVER_CAPABILITIES, "value": mps.DAEMON_DRIVER_CAPABILITIES},
            *mps.environment(),
        ],
        "volumeMounts": mps.volume_mounts(),
        "resources": {
            "limits": {keys.NVIDIA_GPU: "1"},
            "requests": {keys.NVIDIA_GPU: "1", "cpu": "10m", "memory": "64Mi"},
        },
        "readinessProbe": {**check, "periodSeconds": 10, "timeoutSeconds": 5},
        "livenessProbe": {
            **check,
            "initialDelaySeconds": 30,
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": {
            "runAsUser": DAEMON_USER,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": list(DAEMON_CAPABILITIES)},
        },
    }
