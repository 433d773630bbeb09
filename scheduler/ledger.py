"""The state placement reads: nodes, the GPUs on them, and what each pod holds.

Pure. The GPU ledger: every GPU is a bin of `compute` millis (1000) and `memory` bytes,
held by one capacity pod of one pool. A GPU whose capacity pod is not running yet is
`coming`: counted when deciding whether to ask for more capacity, never placed on.

`assume` books a placement on the nodes and GPUs and `forget` undoes it exactly, so the
shell can assume a pod before its Binding is written and forget it if the write fails
(kube-scheduler's assume cache).

The ledger never over-books: a GPU's bookings never exceed its compute and memory,
whatever the objects it is rebuilt from say (two pods bound to one GPU by a race, a GPU
that came back smaller). A pod whose share does not fit on a GPU it runs on is booked on
its node but not on that GPU (`Booking.over`), first come first booked; the GPU counts
it in `over` and takes no new pods while it does, and the pod is booked for real as soon
as room frees. Every change bumps the node's `version` and clears its
memo, so placement can cache per-node answers between changes.

Placement's speed caches over this ledger (numbered node states and request shapes,
shared answers, bounds) live beside it in `scheduler.memo`, which attaches itself on
first use (`memo_of`) and listens to the nodes' changes (`listen`): the ledger knows
nothing of them.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import count
from typing import Final

FULL_GPU: Final = 1000
UNKNOWN: Final = -1  # a node's state before it is numbered, or while it is not indexed


@dataclass(frozen=True, slots=True)
class Request:
    """What one pod needs: host resources on the node, and a share of `gpus` GPUs."""

    key: str  # namespace/name
    cpu: int = 0  # millicores
    memory: int = 0  # bytes of host memory
    compute: int = 0  # millis of each GPU
    gpu_memory: int = 0  # bytes of each GPU
    gpus: int = 1
    pool: str = ""
    owner: str = ""  # namespace/Kind/name of the workload
    exclusive: bool = False  # real-time-mps: share a GPU only with the same owner
    models: frozenset[str] | None = None  # allowed GPU models; None: any

    @property
    def gpu_demand(self) -> tuple[object, ...]:
        """What the checks of one GPU (`placement.gpu_rejects`) read of the pod."""
        return (
            self.pool,
            self.models,
            self.compute,
            self.gpu_memory,
            self.exclusive,
            self.owner if self.exclusive else "",
        )

    @property
    def shape(self) -> tuple[object, ...]:
        """Everything placement depends on except the pod's name."""
        return (
            self.cpu,
            self.memory,
            self.compute,
            self.gpu_memory,
            self.gpus,
            self.pool,
            self.owner if self.exclusive else "",
            self.exclusive,
            self.models,
        )


@dataclass(slots=True, eq=False)
class Gpu:
    uuid: str
    node: str
    memory: int = 0  # bytes; 0 when unknown (then only compute is checked)
    model: str = ""
    pool: str = ""
    holder: str = ""  # the capacity pod's name
    coming: bool = False  # its capacity pod is not running (or has no UUID) yet
    compute: int = FULL_GPU
    used_compute: int = 0
    used_memory: int = 0
    owners: dict[str, int] = field(default_factory=dict)  # workload -> pods on this GPU
    exclusive_owner: str = ""  # set while an MPS workload holds the GPU
    healthy: bool = True  # False when the exporter reports the GPU unhealthy: no new pods
    over: int = 0  # pods running on it whose share its books cannot hold: no new pods
    draining: bool = False  # being emptied by consolidation: no new pods
    removing: bool = False  # on a node an autoscaler is removing: no new pods

    @property
    def free_compute(self) -> int:
        return self.compute - self.used_compute

    @property
    def free_memory(self) -> int | None:
        return self.memory - self.used_memory if self.memory else None

    @property
    def pods(self) -> int:
        return sum(self.owners.values()) + self.over

    def fits(self, request: "Request") -> bool:
        """Whether the books have room for `request`'s compute and memory."""
        free_memory = self.free_memory
        return self.free_compute >= request.compute and (
            free_memory is None or free_memory >= request.gpu_memory
        )


# Placement's answers, memoised here: a node's for one request shape (its cost and the
# GPUs chosen, or why it does not fit), and a node state's (the cost alone, or why not).
Fit = tuple[float, tuple[Gpu, ...]]
NodeAnswer = Fit | str
StateAnswer = float | str


@dataclass(slots=True, eq=False)
class Node:
    name: str
    cpu: int  # allocatable millicores
    memory: int  # allocatable bytes
    max_pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)
    ready: bool = True
    schedulable: bool = True
    removing: bool = False  # an autoscaler is removing it (`keys.AUTOSCALER_REMOVAL_TAINTS`)
    used_cpu: int = 0
    used_memory: int = 0
    used_pods: int = 0
    gpus: list[Gpu] = field(default_factory=list)
    version: int = 0
    memo: dict[int, NodeAnswer] = field(default_factory=dict)  # shape number -> answer
    # What placement and its scorer derive from this version of the node alone (the GPUs
    # a GPU demand may take, a pool's GPUs), keyed by what it is and what it was for.
    derived: dict[tuple[object, ...], object] = field(default_factory=dict)
    memo_generation: int = -1
    state: int = UNKNOWN  # this version's state number (`PlacementMemo.state_of`)
    position: int = -1  # its place in the snapshot's node order (ties go to the first)
    indexed: int = UNKNOWN  # the state the snapshot's `StateIndex` holds it under
    on_change: Callable[["Node"], None] | None = None  # the ledger's listener (`listen`)

    def touch(self) -> None:
        self.version += 1
        self.memo.clear()
        self.derived.clear()
        self.state = UNKNOWN
        if self.on_change is not None:
            self.on_change(self)

    @property
    def free_cpu(self) -> int:
        return self.cpu - self.used_cpu

    @property
    def free_memory(self) -> int:
        return self.memory - self.used_memory


@dataclass(frozen=True, slots=True)
class Booking:
    """Where an assumed or bound pod sits and what it holds there."""

    request: Request
    node: str
    gpus: tuple[str, ...]  # UUIDs its share is booked on
    over: tuple[str, ...] = ()  # UUIDs it runs on where its share did not fit

    @property
    def named(self) -> tuple[str, ...]:
        """Every GPU the pod runs on, booked or not."""
        return self.gpus + self.over


class Ledger:
    """Nodes, GPUs and bookings. Not thread-safe: one scheduling loop owns it."""

    def __init__(self, nodes: Iterable[Node] = (), *, check_hosts: bool = True) -> None:
        # Whether placement checks the node itself (ready, schedulable, CPU, memory, pod
        # count). The extender turns it off: kube-scheduler already filtered the nodes,
        # with every rule and its own accounting, and is the one authority on them.
        self.check_hosts = check_hosts
        self.nodes: dict[str, Node] = {}
        self.gpus: dict[str, Gpu] = {}
        self.bookings: dict[str, Booking] = {}
        # The bookings that name each GPU (booked or over), in the order they were made:
        # a GPU that (re)appears or frees share rebooks its own pods, not every pod.
        self._naming: dict[str, dict[str, None]] = {}
        self.topology = 0  # bumps when nodes, labels or GPUs change
        self.freed = 0  # bumps when a booking that held GPU share is forgotten
        self._positions = count()
        self._listener: Callable[[Node], None] | None = None
        # Placement's speed caches (`scheduler.memo.memo_of`), attached on first use.
        self.caches: object | None = None
        for node in nodes:
            self.add_node(node)

    def listen(self, listener: Callable[[Node], None]) -> None:
        """Have `listener` told of every node that changes from now on (`Node.touch`),
        and of every node there is now, as changed."""
        self._listener = listener
        for node in self.nodes.values():
            node.on_change = listener
            listener(node)

    # Topology.

    def add_node(self, node: Node) -> None:
        old = self.nodes.get(node.name)
        if old is not None:
            node.gpus = old.gpus
            node.used_cpu, node.used_memory, node.used_pods = (
                old.used_cpu,
                old.used_memory,
                old.used_pods,
            )
            node.position = old.position  # a replaced node keeps its place in the order
            old.touch()  # out of the index
        else:
            node.position = next(self._positions)
        node.on_change = self._listener
        self.nodes[node.name] = node
        for gpu in node.gpus:
            self.gpus[gpu.uuid] = gpu
        node.touch()
        self.topology += 1

    def remove_node(self, name: str) -> None:
        node = self.nodes.pop(name, None)
        if node is not None:
            for gpu in node.gpus:
                self.gpus.pop(gpu.uuid, None)
            node.touch()  # out of the index
            self.topology += 1

    def add_gpu(self, gpu: Gpu) -> None:
        """Add or replace a GPU; its usage is recomputed from the bookings that name it,
        so a GPU that reappears (or appears after its pods) is never double-booked."""
        node = self.nodes[gpu.node]
        old = self.gpus.get(gpu.uuid)
        if old is not None and old.node in self.nodes:
            holder = self.nodes[old.node]
            holder.gpus = [g for g in holder.gpus if g.uuid != gpu.uuid]
            holder.touch()
        gpu.used_compute, gpu.used_memory, gpu.owners, gpu.exclusive_owner = 0, 0, {}, ""
        gpu.over = 0
        for key in self.naming(gpu.uuid):
            self.bookings[key] = self._book(gpu, self.bookings[key])
        node.gpus.append(gpu)
        self.gpus[gpu.uuid] = gpu
        node.touch()
        self.topology += 1

    def remove_gpu(self, uuid: str) -> None:
        gpu = self.gpus.pop(uuid, None)
        if gpu is not None and gpu.node in self.nodes:
            node = self.nodes[gpu.node]
            node.gpus = [g for g in node.gpus if g.uuid != uuid]
            node.touch()
            self.topology += 1

    # Bookings.

    def assume(self, request: Request, node_name: str, uuids: Iterable[str]) -> Booking:
        """Book `request` on `node_name` and the GPUs `uuids`. Placement checked that it
        fits; a pod rebuilt from the cluster is booked on each GPU its share fits on, and
        counted as `over` on the others."""
        if request.key in self.bookings:
            raise ValueError(f"{request.key} is already booked")
        node = self.nodes[node_name]
        booking = Booking(request, node_name, tuple(uuids))
        node.used_cpu += request.cpu
        node.used_memory += request.memory
        node.used_pods += 1
        for uuid in booking.gpus:
            gpu = self.gpus.get(uuid)
            if gpu is None:  # a GPU not seen yet: `add_gpu` books the pod on it
                continue
            booking = self._book(gpu, booking)
            if gpu.node != node_name and gpu.node in self.nodes:
                self.nodes[gpu.node].touch()
        node.touch()
        self.bookings[request.key] = booking
        for uuid in booking.named:
            self._naming.setdefault(uuid, {})[request.key] = None
        return booking

    def naming(self, uuid: str) -> tuple[str, ...]:
        """The keys of the bookings that name the GPU `uuid` (booked or over), in the
        order they were made."""
        return tuple(self._naming.get(uuid, ()))

    def overcommitted(self) -> list[Booking]:
        """Pods running on a GPU whose books cannot hold their share."""
        return [b for b in self.bookings.values() if b.over]

    def _book(self, gpu: Gpu, booking: Booking) -> Booking:
        """`booking` with its share on `gpu` (named in it) booked if it fits, else over."""
        gpus = tuple(u for u in booking.gpus if u != gpu.uuid)
        over = tuple(u for u in booking.over if u != gpu.uuid)
        if gpu.fits(booking.request):
            _charge(gpu, booking.request)
            gpus += (gpu.uuid,)
        else:
            gpu.over += 1
            over += (gpu.uuid,)
        return Booking(booking.request, booking.node, gpus, over)

    def forget(self, key: str) -> Booking | None:
        """Undo `assume` (a failed bind, a deleted pod); None when nothing was booked."""
        booking = self.bookings.pop(key, None)
        if booking is None:
            return None
        request = booking.request
        if booking.gpus:
            self.freed += 1
        node = self.nodes.get(booking.node)
        if node is not None:
            node.used_cpu -= request.cpu
            node.used_memory -= request.memory
            node.used_pods -= 1
            node.touch()
        for uuid in booking.named:
            naming = self._naming.get(uuid)
            if naming is not None:
                naming.pop(key, None)
                if not naming:
                    del self._naming[uuid]
            gpu = self.gpus.get(uuid)
            if gpu is None:
                continue
            if gpu.node != booking.node and gpu.node in self.nodes:
                self.nodes[gpu.node].touch()
            if uuid in booking.over:
                gpu.over -= 1
                continue
            gpu.used_compute -= request.compute
            gpu.used_memory -= request.gpu_memory
            left = gpu.owners.get(request.owner, 0) - 1
            if left > 0:
                gpu.owners[request.owner] = left
            else:
                gpu.owners.pop(request.owner, None)
                if gpu.exclusive_owner == request.owner:
                    gpu.exclusive_owner = ""
            if gpu.over:
                self._rebook(gpu)
        return booking

    def _rebook(self, gpu: Gpu) -> None:
        """Book, first come first booked, the pods over on `gpu` that now fit."""
        for key in self.naming(gpu.uuid):
            booking = self.bookings[key]
            if gpu.uuid in booking.over and gpu.fits(booking.request):
                gpu.over -= 1
                self.bookings[key] = self._book(gpu, booking)
                if booking.node in self.nodes:
                    self.nodes[booking.node].touch()


def _charge(gpu: Gpu, request: Request) -> None:
    gpu.used_compute += request.compute
    gpu.used_memory += request.gpu_memory
    gpu.owners[request.owner] = gpu.owners.get(request.owner, 0) + 1
    if request.exclusive:
        gpu.exclusive_owner = request.owner
