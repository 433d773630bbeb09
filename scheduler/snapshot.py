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

Placement's answers depend on a node only through its *state* (`state_key`: capacity,
usage and each GPU's kind and usage, but not names), and busy clusters hold many nodes
in equal state. So the snapshot numbers states (`state_of`, cached on the node until it
changes) and request shapes (`shape_of`), and keeps a bounded table of answers per
shape and state (`answers`) that placement fills: equal nodes are scored once. States it
proved could not win it keeps only a lower bound for (`bounds`), computed from the
scorer's summary of the state (`profiles`), and why a state's GPUs refuse a GPU demand
(`refusals`).
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Final

from scheduler.state_index import UNKNOWN, Frontier, StateIndex

FULL_GPU: Final = 1000
STATE_LIMIT: Final = 100_000  # numbered node states kept before the table starts over
SHAPE_LIMIT: Final = 4_096  # numbered request shapes kept before the table starts over
ANSWER_LIMIT: Final = 1_000_000  # shared answers kept before the least used shapes lose theirs
DEAD_BATCH: Final = 32  # states left by every node, forgotten together


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
    used_cpu: int = 0
    used_memory: int = 0
    used_pods: int = 0
    gpus: list[Gpu] = field(default_factory=list)
    version: int = 0
    memo: dict[int, NodeAnswer] = field(default_factory=dict)  # shape number -> answer
    memo_generation: int = -1
    state: int = UNKNOWN  # this version's state number (`Snapshot.state_of`)
    position: int = -1  # its place in the snapshot's node order (ties go to the first)
    indexed: int = UNKNOWN  # the state the snapshot's `StateIndex` holds it under
    on_change: Callable[["Node"], None] | None = None  # the snapshot's `StateIndex.note`

    def touch(self) -> None:
        self.version += 1
        self.memo.clear()
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


class Snapshot:
    """Nodes, GPUs and bookings. Not thread-safe: one scheduling loop owns it."""

    def __init__(self, nodes: Iterable[Node] = (), *, check_hosts: bool = True) -> None:
        # Whether placement checks the node itself (ready, schedulable, CPU, memory, pod
        # count). The extender turns it off: kube-scheduler already filtered the nodes,
        # with every rule and its own accounting, and is the one authority on them.
        self.check_hosts = check_hosts
        self.nodes: dict[str, Node] = {}
        self.gpus: dict[str, Gpu] = {}
        self.bookings: dict[str, Booking] = {}
        self.topology = 0  # bumps when nodes, labels or GPUs change
        self.freed = 0  # bumps when a booking that held GPU share is forgotten
        self._eligible: dict[tuple[object, ...], tuple[int, list[Node]]] = {}
        self._eligible_names: dict[tuple[object, ...], tuple[int, frozenset[str]]] = {}
        self._states: dict[tuple[object, ...], int] = {}
        self._numbers = count()  # state numbers are never reused
        self._shapes: dict[tuple[object, ...], int] = {}
        self._answers: dict[int, dict[int, StateAnswer]] = {}  # shape -> state -> answer
        self._bounds: dict[int, dict[int, float]] = {}  # shape -> state -> cost bound
        self._profiles: dict[int, object] = {}  # state -> what the scorer bounds with
        self._refusals: dict[tuple[object, ...], dict[int, str]] = {}  # see `refusals`
        self._frontiers: dict[int, Frontier] = {}  # shape -> its heap over the states
        self._used: dict[int, int] = {}  # shape -> the `answers` call that last used it
        self._index = StateIndex()
        self._positions = count()
        self._coming: tuple[int, list[Gpu]] | None = None  # (topology, GPUs coming)
        self._gpu_nodes: tuple[int, int] | None = None  # (topology, nodes holding GPUs)
        self._answers_of: tuple[object, int] | None = None  # (scorer, its generation)
        self._answer_calls = 0
        self._epoch = 0
        for node in nodes:
            self.add_node(node)

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
        node.on_change = self._index.note
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
        for key, booking in list(self.bookings.items()):
            if gpu.uuid in booking.named:
                self.bookings[key] = self._book(gpu, booking)
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

    def eligible(self, request: Request) -> list[Node]:
        """Nodes that hold GPUs of the pod's pool (cached until the topology changes).
        Which of them the pod may go to is kube-scheduler's to say (`place`'s `nodes`)."""
        key = (request.models, request.pool)
        cached = self._eligible.get(key)
        if cached is not None and cached[0] == self.topology:
            return cached[1]
        nodes = [n for n in self.nodes.values() if any(g.pool == request.pool for g in n.gpus)]
        self._eligible[key] = (self.topology, nodes)
        return nodes

    def eligible_names(self, request: Request) -> frozenset[str]:
        """The names of `eligible(request)` (cached until the topology changes)."""
        key = ("names", request.models, request.pool)
        cached = self._eligible_names.get(key)
        if cached is None or cached[0] != self.topology:
            names = frozenset(n.name for n in self.eligible(request))
            cached = self._eligible_names[key] = (self.topology, names)
        return cached[1]

    def coming(self) -> list[Gpu]:
        """The GPUs whose capacity pod is not running yet (cached until the topology
        changes: a GPU stops coming only by being added again)."""
        cached = self._coming
        if cached is None or cached[0] != self.topology:
            cached = self._coming = (self.topology, [g for g in self.gpus.values() if g.coming])
        return cached[1]

    def gpu_nodes(self) -> int:
        """How many nodes hold GPUs (cached until the topology changes)."""
        cached = self._gpu_nodes
        if cached is None or cached[0] != self.topology:
            cached = self._gpu_nodes = (
                self.topology,
                sum(1 for n in self.nodes.values() if n.gpus),
            )
        return cached[1]

    # Numbered states and shapes, for placement's shared answers.

    def state_of(self, node: Node) -> int:
        """The number of the node's current state; nodes in equal state share it. A node
        with a GPU held by a real-time-mps workload gets a number of its own (its answers
        depend on the pod's owner, which the shape leaves out). Numbers are never reused."""
        if node.state != UNKNOWN:
            return node.state
        key = state_key(node)
        number = None if key is None else self._states.get(key)
        if number is None:
            number = next(self._numbers)
            if key is not None:
                if len(self._states) >= STATE_LIMIT:
                    self._states.clear()  # equal states met later get new numbers
                self._states[key] = number
        node.state = number
        return number

    def states(self) -> StateIndex:
        """The live node states and their nodes, brought up to date with the nodes that
        changed since the last call."""
        self._index.refresh(self.nodes, self.state_of)
        self._forget_dead()
        return self._index

    def frontier(self, shape: int) -> Frontier:
        """One shape's heap over the node states (`scheduler.state_index`); kept and
        dropped with `answers`."""
        frontier = self._frontiers.get(shape)
        if frontier is None:
            frontier = self._frontiers[shape] = Frontier()
        return frontier

    def shape_of(self, request: Request) -> int:
        """A small number for the request's shape (memo and answer keys hash fast)."""
        shape = request.shape
        number = self._shapes.get(shape)
        if number is None:
            if len(self._shapes) >= SHAPE_LIMIT:  # numbers are reused: drop what used them
                self._shapes.clear()
                self._answers.clear()
                self._bounds.clear()
                self._frontiers.clear()
                self._used.clear()
                for node in self.nodes.values():
                    node.memo.clear()
            number = self._shapes[shape] = len(self._shapes)
        return number

    def scorer_epoch(self, scorer: object, generation: int) -> int:
        """A number that moves whenever placement runs with another scorer or the
        scorer's generation moves; answers kept under an older one are dropped."""
        owner = self._answers_of
        if owner is None or owner[0] is not scorer or owner[1] != generation:
            self._answers.clear()
            self._bounds.clear()
            self._profiles.clear()
            self._frontiers.clear()
            self._used.clear()
            self._answers_of = (scorer, generation)
            self._epoch += 1
        return self._epoch

    def answers(self, shape: int) -> dict[int, StateAnswer]:
        """Placement's answers for one shape by state number, under the current
        `scorer_epoch`. Bounded: what is kept of states no node is in any more is dropped
        (`_forget_dead`), and past `ANSWER_LIMIT` answers, bounds, frontier entries,
        profiles and refusals together (checked every 64 calls) the shapes used least
        recently lose theirs (`_shrink`)."""
        self._answer_calls += 1
        self._used[shape] = self._answer_calls
        if self._answer_calls % 64 == 0:
            self._shrink()
        answers = self._answers.get(shape)
        if answers is None:
            answers = self._answers[shape] = {}
        return answers

    def _held(self, shape: int) -> int:
        frontier = self._frontiers.get(shape)
        return (
            len(self._answers.get(shape, ()))
            + len(self._bounds.get(shape, ()))
            + (len(frontier.heap) if frontier is not None else 0)
        )

    def _shrink(self) -> None:
        """Past `ANSWER_LIMIT`, drop the tables of the shapes used least recently (a shape
        met again takes in every state anew) until half of it is left; then profiles and
        refusals, which every shape shares, if they alone are past it."""
        shapes = sum(map(self._held, self._used))
        shared = len(self._profiles) + sum(map(len, self._refusals.values()))
        if shapes + shared <= ANSWER_LIMIT:
            return
        for shape in sorted(self._used, key=self._used.__getitem__):
            if shapes <= ANSWER_LIMIT // 2:
                break
            shapes -= self._held(shape)
            self._answers.pop(shape, None)
            self._bounds.pop(shape, None)
            self._frontiers.pop(shape, None)
            del self._used[shape]
        if shared > ANSWER_LIMIT // 2:
            self._profiles.clear()
            self._refusals.clear()

    def _forget_dead(self) -> None:
        """Drop what is kept per state for the states no node is in any more (their numbers
        are never used again), in batches of `DEAD_BATCH`."""
        dead = self._index.dead
        if len(dead) < DEAD_BATCH:
            return
        gone = [state for state in dead if self._index.members(state) is None]
        dead.clear()
        tables: list[dict[int, Any]] = [
            *self._answers.values(),
            *self._bounds.values(),
            *(f.current for f in self._frontiers.values()),
            *self._refusals.values(),
            self._profiles,
        ]
        for table in tables:
            if table:
                for state in gone:
                    table.pop(state, None)

    def bounds(self, shape: int) -> dict[int, float]:
        """Lower bounds on the cost of one shape by state number, for states placement
        has not scored yet (see placement); kept and dropped with `answers`."""
        bounds = self._bounds.get(shape)
        if bounds is None:
            bounds = self._bounds[shape] = {}
        return bounds

    def refusals(self, request: Request) -> dict[int, str]:
        """Why no GPU of a node state takes a pod with the GPU demand of `request` (pool,
        models, compute, GPU memory, count), by state number, for the states placement
        found so; not for real-time-mps pods. A state's GPUs never change, so the reasons
        hold for every shape and scorer; kept and dropped with `answers`."""
        key = (request.pool, request.models, request.compute, request.gpu_memory, request.gpus)
        refused = self._refusals.get(key)
        if refused is None:
            refused = self._refusals[key] = {}
        return refused

    def profiles(self) -> dict[int, object]:
        """What the scorer bounds costs with, by state number (for every shape); kept and
        dropped with `answers`."""
        return self._profiles

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
        return booking

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
        for key, booking in list(self.bookings.items()):
            if gpu.uuid in booking.over and gpu.fits(booking.request):
                gpu.over -= 1
                self.bookings[key] = self._book(gpu, booking)
                if booking.node in self.nodes:
                    self.nodes[booking.node].touch()


def state_key(node: Node) -> tuple[object, ...] | None:
    """Everything placement and the state-sharing scorers read of a node, in GPU order;
    None when a GPU is held by a real-time-mps workload."""
    gpus: list[tuple[object, ...]] = []
    for g in node.gpus:
        if g.exclusive_owner:
            return None
        hosts_pods = bool(g.owners) or g.over > 0
        gpus.append(
            (
                g.pool,
                g.model,
                g.coming,
                g.compute,
                g.used_compute,
                g.memory,
                g.used_memory,
                hosts_pods,
                g.healthy,
                g.over > 0,
                g.draining,
            )
        )
    return (
        node.ready,
        node.schedulable,
        node.cpu,
        node.memory,
        node.used_cpu,
        node.used_memory,
        node.used_pods > 0,
        node.used_pods >= node.max_pods,
        tuple(gpus),
    )


def _charge(gpu: Gpu, request: Request) -> None:
    gpu.used_compute += request.compute
    gpu.used_memory += request.gpu_memory
    gpu.owners[request.owner] = gpu.owners.get(request.owner, 0) + 1
    if request.exclusive:
        gpu.exclusive_owner = request.owner
