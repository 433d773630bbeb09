"""Consolidation: which part-used GPU to empty so that its capacity pod, and then its
node, can go. Pure: a snapshot and a judge in, moves out.

Churn leaves GPUs part-used: pods end, Deployments shrink, and every GPU that still
holds one share keeps a capacity pod and a node. Placement packs pods as they arrive;
nothing else moves a pod once it runs. A pool *could shrink* when it holds more GPUs
than its shares need (`lower_bound`: the shares' compute and memory, rounded up to whole
GPUs). Then its GPUs are tried in turn: those of the node holding fewest GPUs first
(emptying a node's last GPU lets an autoscaler remove the node, and nodes are what is
billed), the emptiest first among them. One qualifies when every share on it may be
moved (`Judge`: the policy allows it, a controller will recreate the pod, the budget
has room, ...) and fits, by the same compute, memory, model and real-time-mps rules
placement checks, on another GPU of its pool that stays held (on another node where
one has room), with the host CPU and memory of that GPU's node. That GPU is emptied:
its capacity pod is marked draining, so placement puts nothing new on it, and its pods
are evicted; their controllers recreate them and placement, which prefers GPUs already
in use, puts them on the GPUs that had room. The plan names those GPUs, but it is a
plan, not a binding: kube-scheduler's other rules (anti-affinity, spread) may send a
recreated pod elsewhere, which is why each workload's evictions are budgeted.

Only a move that empties a whole GPU is made: thinning a GPU saves nothing. A round
empties, per pool, the GPUs of one node (`per_pool` nodes): every GPU of that node that
qualifies, at once, so the node can go in one step rather than one GPU a round; a pool
with a GPU still draining starts nothing new, so it never drains faster than its pods
restart. Nothing moves off or onto a node an autoscaler is removing (`Gpu.removing`):
its pods are the autoscaler's to move, and a share put there would only move again.
The targets are GPUs already held on nodes that take pods: a move never makes the
cluster buy a node.
"""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from scheduler.ledger import FULL_GPU, Booking, Gpu, Ledger, Request

CANDIDATES: Final = 64  # GPUs tried per pool and round, in order: a bounded search

# Why `booking` may not be moved off `gpu` (a readable reason), or None when it may.
Judge = Callable[[Booking, Gpu], str | None]


@dataclass(frozen=True, slots=True)
class Move:
    """Empty `gpu`: evict `pods` (keys), planned to land on `targets` (one each)."""

    pool: str
    gpu: str  # UUID
    holder: str  # its capacity pod
    node: str
    pods: tuple[str, ...]
    targets: tuple[str, ...]
    held: int  # GPUs the pool holds (hosting a share)
    needed: int  # the lower bound of what its shares need
    node_gpus: int = 0  # a relocation (`scheduler.relocation`): the node's GPUs, all moving

    @property
    def reason(self) -> str:
        if self.node_gpus:
            return (
                f"node {self.node} holds only {self.node_gpus} GPU(s), all of pool "
                f"{self.pool or '(default)'}; they move to nodes the pool already uses, so "
                f"the node can go: GPU {self.gpu} (capacity pod {self.holder}) is emptied"
            )
        return (
            f"pool {self.pool or '(default)'} holds {self.held} GPUs where its shares need "
            f"{self.needed}; GPU {self.gpu} (capacity pod {self.holder} on {self.node}) is "
            f"emptied: its {len(self.pods)} share(s) fit on GPUs that stay held"
        )


def held(gpu: Gpu) -> bool:
    """A GPU someone pays for and something uses: running, with a share on it."""
    return not gpu.coming and gpu.pods > 0


def fill(gpu: Gpu) -> float:
    """How used a GPU is: the larger of its booked compute and memory, as fractions."""
    memory = gpu.used_memory / gpu.memory if gpu.memory else 0.0
    return max(gpu.used_compute / gpu.compute, memory)


def lower_bound(gpus: Iterable[Gpu]) -> int:
    """The fewest GPUs that could hold these GPUs' shares: their compute, and their
    memory over the largest GPU's, rounded up."""
    compute = memory = largest = 0
    for gpu in gpus:
        compute += gpu.used_compute
        memory += gpu.used_memory
        largest = max(largest, gpu.memory)
    by_memory = math.ceil(memory / largest) if largest else 0
    return max(math.ceil(compute / FULL_GPU), by_memory)


def plan(
    snapshot: Ledger,
    judge: Judge,
    *,
    busy: frozenset[str] = frozenset(),
    per_pool: int = 1,
    planned: Callable[[Move], None] | None = None,
) -> list[Move]:
    """The GPUs to empty now, those of at most `per_pool` nodes per pool; `busy` pools
    (one of their GPUs is still draining) get none. `planned` hears of each move as it is
    made, before the next GPU is judged (a budget the move spends is spent for it)."""
    on_gpu: dict[str, list[Booking]] = {}
    for booking in snapshot.bookings.values():
        for uuid in booking.named:
            on_gpu.setdefault(uuid, []).append(booking)
    pools: dict[str, list[Gpu]] = {}
    per_node: dict[str, int] = {}  # held GPUs on each node, of every pool
    for gpu in snapshot.gpus.values():
        if held(gpu):
            per_node[gpu.node] = per_node.get(gpu.node, 0) + 1
            if gpu.pool not in busy:
                pools.setdefault(gpu.pool, []).append(gpu)

    def emptiest(gpu: Gpu) -> tuple[int, float, int, str]:
        """The GPUs of the node holding fewest first (emptying a node's last GPU lets an
        autoscaler remove the node: the bill is per node), then the least used, then the
        one with fewest pods."""
        return (per_node[gpu.node], fill(gpu), gpu.pods, gpu.uuid)

    moves: list[Move] = []
    for pool, gpus in sorted(pools.items()):
        needed = lower_bound(gpus)
        if len(gpus) <= needed:
            continue
        room = Room(snapshot, gpus, per_node)
        tried = 0
        emptying: list[str] = []  # the nodes this round empties GPUs of, in order
        for gpu in sorted(gpus, key=emptiest):
            if tried == CANDIDATES:
                break
            if gpu.node not in emptying and len(emptying) == per_pool:
                continue  # the pool's nodes for this round are chosen
            shares = on_gpu.get(gpu.uuid, [])
            if gpu.uuid in room.targets or not movable(gpu, shares, judge):
                continue
            tried += 1
            targets = room.fit(gpu, [b.request for b in shares])
            if targets is None:
                continue
            ordered = sorted(shares, key=_largest_first)
            if gpu.node not in emptying:
                emptying.append(gpu.node)
            move = Move(
                pool,
                gpu.uuid,
                gpu.holder,
                gpu.node,
                tuple(b.request.key for b in ordered),
                targets,
                len(gpus),
                needed,
            )
            moves.append(move)
            if planned is not None:
                planned(move)
    return moves


def _largest_first(booking: Booking) -> tuple[int, int, str]:
    request = booking.request
    return (-request.compute, -request.gpu_memory, request.key)


def movable(gpu: Gpu, shares: list[Booking], judge: Judge) -> bool:
    """Whether every pod on `gpu` is a movable share of it alone."""
    if gpu.draining or gpu.removing or gpu.over or not gpu.healthy or not shares:
        return False
    for booking in shares:
        if booking.over or booking.request.gpus != 1 or booking.request.compute >= gpu.compute:
            return False  # a whole GPU's pod gains nothing by moving
        if judge(booking, gpu) is not None:
            return False
    return True


class Room:
    """The room left on a pool's GPUs and their nodes as this round's moves use it."""

    def __init__(self, snapshot: Ledger, gpus: list[Gpu], per_node: dict[str, int]) -> None:
        self._snapshot = snapshot
        self._per_node = per_node
        self._gpus = [
            g for g in gpus if g.healthy and not g.draining and not g.removing and not g.over
        ]
        self._compute = {g.uuid: g.free_compute for g in self._gpus}
        self._memory = {g.uuid: g.free_memory for g in self._gpus}
        self._owners = {g.uuid: set(g.owners) for g in self._gpus}
        self._exclusive = {g.uuid: g.exclusive_owner for g in self._gpus}
        self._cpu: dict[str, int] = {}
        self._host_memory: dict[str, int] = {}
        self._pods: dict[str, int] = {}
        self._emptied: set[str] = set()
        self.targets: set[str] = set()  # GPUs this round's moves send shares to

    def save(self) -> tuple[object, ...]:
        """The room as it is, for `restore`."""
        return (
            dict(self._compute),
            dict(self._memory),
            {k: set(v) for k, v in self._owners.items()},
            dict(self._exclusive),
            dict(self._cpu),
            dict(self._host_memory),
            dict(self._pods),
            set(self._emptied),
            set(self.targets),
        )

    def restore(self, saved: tuple[object, ...]) -> None:
        (
            self._compute,
            self._memory,
            self._owners,
            self._exclusive,
            self._cpu,
            self._host_memory,
            self._pods,
            self._emptied,
            self.targets,
        ) = saved  # type: ignore[assignment]

    def fit(
        self, source: Gpu, requests: list[Request], *, elsewhere: bool = False
    ) -> tuple[str, ...] | None:
        """Book every request on another GPU, largest first: on another node if one has
        room (so the source's node may empty; only there when `elsewhere`), best fit, of
        equals on the node holding most GPUs. None, and nothing booked, when one does not
        fit. The targets in `_largest_first` order."""
        saved = self.save()
        targets: list[str] = []
        for request in sorted(requests, key=lambda r: (-r.compute, -r.gpu_memory, r.key)):
            best: Gpu | None = None
            for gpu in self._gpus:
                if gpu.uuid == source.uuid or gpu.uuid in self._emptied:
                    continue
                if elsewhere and gpu.node == source.node:
                    continue
                if not self._takes(gpu, source, request):
                    continue
                if best is None or self._rank(gpu, source) < self._rank(best, source):
                    best = gpu
            if best is None:
                self.restore(saved)
                return None
            self._book(best, source, request)
            targets.append(best.uuid)
        self._emptied.add(source.uuid)
        self.targets.update(targets)
        return tuple(targets)

    def host_takes(self, name: str, requests: list[Request]) -> bool:
        """Book `requests`' CPU, memory and pod count on node `name` if it has room for
        them all (a new GPU there will take them), else book nothing."""
        node = self._snapshot.nodes.get(name)
        if node is None or not node.ready or not node.schedulable or node.removing:
            return False
        cpu = self._cpu.get(name, node.free_cpu) - sum(r.cpu for r in requests)
        memory = self._host_memory.get(name, node.free_memory) - sum(r.memory for r in requests)
        pods = self._pods.get(name, node.max_pods - node.used_pods) - len(requests)
        if cpu < 0 or memory < 0 or pods < 0:
            return False
        self._cpu[name], self._host_memory[name], self._pods[name] = cpu, memory, pods
        return True

    def emptied(self, source: Gpu) -> None:
        self._emptied.add(source.uuid)

    def _rank(self, gpu: Gpu, source: Gpu) -> tuple[bool, int, int]:
        same_node = gpu.node == source.node
        return (same_node, self._compute[gpu.uuid], -self._per_node.get(gpu.node, 0))

    def _takes(self, gpu: Gpu, source: Gpu, request: Request) -> bool:
        uuid = gpu.uuid
        if self._compute[uuid] < request.compute:
            return False
        memory = self._memory[uuid]
        if memory is not None and memory < request.gpu_memory:
            return False
        if request.models is not None and gpu.model not in request.models:
            return False
        exclusive = self._exclusive[uuid]
        if exclusive and (not request.exclusive or exclusive != request.owner):
            return False
        if request.exclusive and any(o != request.owner for o in self._owners[uuid]):
            return False
        if gpu.node == source.node:
            return True  # its CPU and memory are on that node already
        node = self._snapshot.nodes.get(gpu.node)
        if node is None or not node.ready or not node.schedulable or node.removing:
            return False
        cpu = self._cpu.get(node.name, node.free_cpu)
        host_memory = self._host_memory.get(node.name, node.free_memory)
        pods = self._pods.get(node.name, node.max_pods - node.used_pods)
        return cpu >= request.cpu and host_memory >= request.memory and pods > 0

    def _book(self, gpu: Gpu, source: Gpu, request: Request) -> None:
        uuid = gpu.uuid
        self._compute[uuid] -= request.compute
        memory = self._memory[uuid]
        if memory is not None:
            self._memory[uuid] = memory - request.gpu_memory
        self._owners[uuid].add(request.owner)
        if request.exclusive:
            self._exclusive[uuid] = request.owner
        if gpu.node != source.node:
            node = self._snapshot.nodes[gpu.node]
            self._cpu[node.name] = self._cpu.get(node.name, node.free_cpu) - request.cpu
            self._host_memory[node.name] = (
                self._host_memory.get(node.name, node.free_memory) - request.memory
            )
            self._pods[node.name] = self._pods.get(node.name, node.max_pods - node.used_pods) - 1
