"""The scheduler's view of the cluster: informer events folded into the snapshot.

Informers (nodes; every non-terminal pod) report changed keys; the extender calls
`refresh` to fold them in: nodes become placement nodes, capacity pods become GPUs
(running or coming), bound pods become bookings (a fractional pod on the GPU its
annotations name; any other pod holds CPU, memory and a pod slot, which the
fragmentation scorer reads), and unbound pods that name gpupack-scheduler are
`pending` (the scorer's task mix and the pending-pods gauge count them). A relist
rebuilds everything.

Pods the extender reserved (`assumed`: a GPU chosen at filter, the bind to come) keep
their booking until the informer shows them bound, or the extender releases them.
"""

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, cast

from gpupack import keys
from gpupack.gpu_request import scan_gpus
from gpupack.objects import JSON, PodSpec, labels_of
from gpupack.shares import is_live
from scheduler.exclusion import SETTLING, starting
from scheduler.ledger import Booking, Gpu, Ledger, Request
from scheduler.translate import (
    DraGpus,
    NotOurs,
    assignment_of,
    capacity_gpu,
    dra_gpus,
    host_request,
    is_capacity,
    node_gpu_memory,
    node_of,
    pod_key,
    request_of,
)


class Store(Protocol):
    def get(self, key: str) -> JSON | None: ...

    def items(self) -> list[JSON]: ...


@dataclass(slots=True)
class Capacity:
    """A capacity pod as the loop sees it."""

    name: str
    pool: str
    pod: JSON
    gpu: str | None = None  # its GPU's id in the snapshot, None when not on a node yet


@dataclass(frozen=True, slots=True)
class Pending:
    """An unbound pod addressed to us, and what it asks for (parsed once per change of
    the pod, not once per housekeeping round)."""

    pod: JSON
    request: Request | NotOurs


@dataclass(slots=True)
class Dirty:
    """Keys changed since the last refresh; thread-safe, filled by informer threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    nodes: set[str] = field(default_factory=set)
    pods: set[str] = field(default_factory=set)
    slices: set[str] = field(default_factory=set)  # ResourceSlices (GPUs of DRA nodes)
    relist: bool = True

    def node(self, key: str) -> None:
        with self.lock:
            if key:
                self.nodes.add(key)
            else:
                self.relist = True

    def pod(self, key: str) -> None:
        with self.lock:
            if key:
                self.pods.add(key)
            else:
                self.relist = True

    def slice(self, key: str) -> None:
        with self.lock:
            if key:
                self.slices.add(key)
            else:
                self.relist = True

    def take(self) -> tuple[set[str], set[str], set[str], bool]:
        with self.lock:
            taken = self.nodes, self.pods, self.slices, self.relist
            self.nodes, self.pods, self.slices, self.relist = set(), set(), set(), False
        return taken


class Cache:
    def __init__(
        self,
        nodes: Store,
        pods: Store,
        dirty: Dirty,
        scheduler_name: str = keys.SCHEDULER_NAME,
        namespace: str = keys.SYSTEM_NAMESPACE,
        key: bytes | None = None,
        slices: Store | None = None,
    ) -> None:
        self._namespace = namespace
        # ResourceSlices, where the cluster serves DRA: a node whose GPUs are DRA devices
        # advertises no `nvidia.com/gpu` (`dra_gpus`).
        self._slices = slices
        self._slice_node: dict[str, str] = {}  # slice name -> its node
        self._node_slices: dict[str, set[str]] = {}  # node -> its slices' names
        self._dra: dict[str, DraGpus] = {}  # node -> its GPUs in the slices
        # The decision key: pods to place must carry the webhook's seal made with it.
        self._key = key
        self._nodes = nodes
        self._pods = pods
        self._scheduler_name = scheduler_name
        self.dirty = dirty
        self.ledger = Ledger(check_hosts=False)
        self.pending: dict[str, Pending] = {}  # unbound pods addressed to us
        self.capacity: dict[str, Capacity] = {}  # by capacity pod name
        self.assumed: set[str] = set()
        # Capacity pods that are going (deleting, finished) but still exist: their names
        # are taken on the API server until they are gone.
        self.leaving: set[str] = set()
        # Nodes that offer whole GPUs (`nvidia.com/gpu` allocatable, or GPUs as DRA devices
        # in ResourceSlices), where a capacity pod could land, and their per-GPU memory
        # (GPU Feature Discovery's label, else the devices' `memory`; 0: unknown).
        # Kept with the node events, read on every refused filter.
        self.gpu_nodes: dict[str, int] = {}
        # Counts changes to the set of GPU nodes: where a new GPU may have to stay off.
        self.gpu_nodes_changed = 0
        self._on_node: dict[str, set[str]] = {}  # node -> pod keys waiting for that node
        # Nodes seen to begin taking pods since the first list (added without a starting
        # taint, or its last one lifted), and when, by `refresh`'s clock; and the nodes
        # still starting (`scheduler.exclusion.starting`). Read by `settling`.
        self.began: dict[str, float] = {}
        self._starting: set[str] = set()

    # Folding events in.

    def refresh(self, now: float = -math.inf) -> bool:
        """Apply what changed; True when anything did. `now` is when, by the caller's
        clock: a node that begins taking pods is noted then (`settling`)."""
        nodes, pods, slices, relist = self.dirty.take()
        if relist:
            self._rebuild()
            return True
        for key in sorted(slices):
            for name in self._apply_slice(key):
                node = self._nodes.get(name)
                if node is not None:
                    self._note_gpus(node)
        for name in sorted(nodes):
            self._apply_node(name, now)
        for key in sorted(pods):
            self._apply_pod(key, self._pods.get(key))
        return bool(nodes or pods or slices)

    def _apply_slice(self, key: str) -> set[str]:
        """Fold ResourceSlice `key` in; the nodes whose DRA GPUs it may have changed."""
        store = self._slices
        if store is None:  # no slice informer: no slice events either
            return set()
        touched = set()
        old = self._slice_node.pop(key, None)
        if old is not None:
            touched.add(old)
            self._node_slices[old].discard(key)
        obj = store.get(key)
        node = str(((obj or {}).get("spec") or {}).get("nodeName") or "")
        if node:
            self._slice_node[key] = node
            self._node_slices.setdefault(node, set()).add(key)
            touched.add(node)
        for name in touched:
            names = self._node_slices.get(name) or set()
            found = dra_gpus(store.get(k) for k in names)
            if found.count:
                self._dra[name] = found
            else:
                self._dra.pop(name, None)
            if not names:
                self._node_slices.pop(name, None)
        return touched

    def _rebuild(self) -> None:
        assumed = {k: self.ledger.bookings[k] for k in self.assumed if k in self.ledger.bookings}
        self.ledger = Ledger(check_hosts=False)
        self.pending.clear()
        self.capacity.clear()
        self.leaving.clear()
        self.gpu_nodes.clear()
        self.gpu_nodes_changed += 1
        self._on_node.clear()
        self._starting.clear()
        self._slice_node.clear()
        self._node_slices.clear()
        self._dra.clear()
        for obj in self._slices.items() if self._slices is not None else ():
            self._apply_slice(str(obj["metadata"]["name"]))
        for obj in self._nodes.items():
            self.ledger.add_node(node_of(obj))
            self._note_gpus(obj)
            if starting(obj):
                self._starting.add(str(obj["metadata"]["name"]))
        pods = self._pods.items()
        # GPUs before the pods on them.
        for pod in sorted(pods, key=lambda p: not is_capacity(p, self._namespace)):
            self._apply_pod(pod_key(pod), pod)
        for key, booking in assumed.items():
            if key not in self.ledger.bookings and booking.node in self.ledger.nodes:
                self.ledger.assume(booking.request, booking.node, booking.named)
            elif key not in self.ledger.bookings:
                self.assumed.discard(key)

    def _apply_node(self, name: str, now: float) -> None:
        obj = self._nodes.get(name)
        if obj is None:
            self.ledger.remove_node(name)
            if self.gpu_nodes.pop(name, None) is not None:
                self.gpu_nodes_changed += 1
            self.began.pop(name, None)
            self._starting.discard(name)
            return
        old = self.ledger.nodes.get(name)
        returned = old is None
        node = node_of(obj)
        self.ledger.add_node(node)
        self._note_gpus(obj)
        if starting(obj):
            self._starting.add(name)
            self.began.pop(name, None)
        elif returned or name in self._starting:
            self._starting.discard(name)
            self.began[name] = now
        # A node deleted and made again: its capacity pods' GPUs come back. One an
        # autoscaler began or stopped removing: its GPUs take new pods no more, or again.
        if old is None or old.removing != node.removing:
            held = [c.name for c in self.capacity.values() if _node_name(c.pod) == name]
            for key in (f"{self._namespace}/{n}" for n in held):
                self._apply_pod(key, self._pods.get(key))
        for key in sorted(self._on_node.pop(name, set())):
            self._apply_pod(key, self._pods.get(key))

    def _note_gpus(self, node: JSON) -> None:
        name = str(node["metadata"]["name"])
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        dra = self._dra.get(name)
        if str(allocatable.get(keys.NVIDIA_GPU, "0")) not in ("", "0") or dra is not None:
            if name not in self.gpu_nodes:
                self.gpu_nodes_changed += 1
            memory = node_gpu_memory(labels_of(node))
            self.gpu_nodes[name] = memory or (dra.memory if dra is not None else 0)
        elif self.gpu_nodes.pop(name, None) is not None:
            self.gpu_nodes_changed += 1

    def settling(self, name: str, now: float | None) -> bool:
        """Whether node `name` is starting (`scheduler.exclusion.starting`), or, when
        `now` is given, `just_began` then."""
        return name in self._starting or (now is not None and self.just_began(name, now))

    def just_began(self, name: str, now: float) -> bool:
        """Whether node `name` began taking pods less than `SETTLING` seconds before
        `now`: a verdict kube-scheduler reached then may be about the node as it was
        before, so it says nothing about the pod yet."""
        began = self.began.get(name)
        if began is None:
            return False
        if now - began < SETTLING:
            return True
        del self.began[name]  # settled for good
        return False

    def node(self, name: str) -> JSON | None:
        """The Node object as the informer has it."""
        return self._nodes.get(name)

    def node_label(self, name: str) -> str | None:
        """The node's `gpupack.io/node` label (`scheduler.exclusion`), None without one."""
        node = self._nodes.get(name)
        return labels_of(node).get(keys.NODE) if node is not None else None

    def _apply_pod(self, key: str, pod: JSON | None) -> None:
        live = pod is not None and is_live(pod)
        namespace, _, name = key.partition("/")
        was_capacity = namespace == self._namespace and (
            name in self.capacity or name in self.leaving
        )
        if (pod is not None and is_capacity(pod, self._namespace)) or was_capacity:
            self._apply_capacity(pod if live else None, key)
        if not live or pod is None:
            self.pending.pop(key, None)
            self.assumed.discard(key)
            self.ledger.forget(key)
            return
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            ours = spec.get("schedulerName") == self._scheduler_name
            if ours and not spec.get("schedulingGates") and key not in self.assumed:
                self.pending[key] = Pending(pod, self.request(pod))
            else:
                self.pending.pop(key, None)  # gated pods wait, as kube-scheduler's do
            return
        self.pending.pop(key, None)
        self.assumed.discard(key)
        self._book(key, pod, str(node))

    def _book(self, key: str, pod: JSON, node: str) -> None:
        if node not in self.ledger.nodes:
            self.ledger.forget(key)
            self._on_node.setdefault(node, set()).add(key)
            return
        request: Request = host_request(pod)
        gpus: tuple[str, ...] = ()
        assignment = (
            assignment_of(pod) if pod["spec"].get("schedulerName") == self._scheduler_name else None
        )
        if assignment is not None:
            wanted = request_of(pod)
            if isinstance(wanted, Request):
                request = wanted
                gpus = (assignment[0],)
        old = self.ledger.bookings.get(key)
        wanted_booking = (node, request, sorted(gpus))  # booked or over on each GPU
        if old is not None and (old.node, old.request, sorted(old.named)) == wanted_booking:
            return
        self.ledger.forget(key)
        self.ledger.assume(request, node, gpus)

    def _apply_capacity(self, pod: JSON | None, key: str) -> None:
        name = key.split("/", 1)[1]
        if pod is None and self._pods.get(key) is not None:
            self.leaving.add(name)
        else:
            self.leaving.discard(name)
        old = self.capacity.pop(name, None)
        if pod is None:
            if old is not None and old.gpu is not None:
                self._drop_gpu(old.gpu, name)
            return
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = self.ledger.nodes.get(str(node_name)) if node_name else None
        gpu = capacity_gpu(pod, node) if node is not None else None
        pool = (pod["metadata"].get("labels") or {}).get(keys.POOL, "")
        entry = Capacity(name, pool, pod, gpu.uuid if gpu is not None else None)
        self.capacity[name] = entry
        if old is not None and old.gpu is not None and old.gpu != entry.gpu:
            self._drop_gpu(old.gpu, name)
        if gpu is not None:
            current = self.ledger.gpus.get(gpu.uuid)
            if current is None or _gpu_changed(current, gpu):
                self.ledger.add_gpu(gpu)

    def _drop_gpu(self, uuid: str, holder: str) -> None:
        """Forget a GPU its capacity pod no longer holds, unless another capacity pod
        holds it now (a replacement on the same device: the GPU's id is the device's, and
        the old pod's deletion can come after the new pod took it)."""
        gpu = self.ledger.gpus.get(uuid)
        if gpu is not None and gpu.holder == holder:
            self.ledger.remove_gpu(uuid)

    # Reading.

    def pod(self, key: str) -> JSON | None:
        return self._pods.get(key)

    def request(self, pod: JSON) -> Request | NotOurs:
        """What a pod to place asks for, or why it will not be placed (its seal included)."""
        return request_of(pod, self._key)

    def coming(self, pool: str) -> list[Capacity]:
        """Capacity pods of `pool` that are not a usable GPU yet."""
        return [
            c
            for c in self.capacity.values()
            if c.pool == pool and (c.gpu is None or self._coming(c.gpu))
        ]

    def _coming(self, uuid: str) -> bool:
        gpu = self.ledger.gpus.get(uuid)  # None: its node is gone, nothing is coming
        return gpu is not None and gpu.coming

    def free_gpus(self) -> tuple[dict[str, int], frozenset[str]]:
        """Whole GPUs nobody holds on each node that offers `nvidia.com/gpu` (allocatable
        less what its pods ask, capacity pods and others, running or going), and the
        nodes where pods other than capacity pods hold GPUs. Consolidation reads it
        (`scheduler.consolidation`, moving a node's GPUs to nodes already paid for)."""
        used: dict[str, int] = {}
        foreign: set[str] = set()
        for pod in self._pods.items():
            node = _node_name(pod)
            phase = (pod.get("status") or {}).get("phase")
            if not node or phase in ("Succeeded", "Failed"):
                continue
            count = scan_gpus(cast(PodSpec, pod.get("spec") or {})).total
            if count:
                used[node] = used.get(node, 0) + count
                if not is_capacity(pod, self._namespace):
                    foreign.add(node)
        free: dict[str, int] = {}
        for name in self.gpu_nodes:
            allocatable = ((self._nodes.get(name) or {}).get("status") or {}).get("allocatable")
            try:
                count = int(str((allocatable or {}).get(keys.NVIDIA_GPU, "0")))
            except ValueError:
                count = 0
            free[name] = max(0, count - used.get(name, 0))
        return free, frozenset(foreign)

    def orphans(self) -> Iterable[Booking]:
        """Bound pods whose GPU no capacity pod holds any more."""
        return (
            b
            for b in self.ledger.bookings.values()
            if any(uuid not in self.ledger.gpus for uuid in b.named)
        )


def _node_name(pod: JSON) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _gpu_changed(old: Gpu, new: Gpu) -> bool:
    def seen(g: Gpu) -> tuple[object, ...]:
        return (
            g.node,
            g.memory,
            g.model,
            g.pool,
            g.holder,
            g.coming,
            g.healthy,
            g.draining,
            g.removing,
        )

    return seen(old) != seen(new)
