"""Relocation: empty a node whose GPUs the pool could hold on nodes already paid for. Pure.

Consolidation (`scheduler.consolidation.plan`) empties a GPU when its shares fit on GPUs
that stay held; it saves GPUs. Nodes are what an autoscaler bills, and churn leaves them
sparse: a node kept by two GPUs of small shares while the pool's other nodes have whole
GPUs free. Those GPUs are paid for already (the node is), so moving the sparse node's
shares onto them costs no GPU and saves the node. The live churn benchmark measured it:
held GPUs near the shares' bound, nodes far above theirs (docs/scheduler.md).

A pool's node qualifies, sparsest first (fewest held GPUs), when:

- every GPU held on it is the pool's, nothing else on it holds a GPU (`foreign`: another
  workload's whole-GPU pod, which keeps the node anyway), and none of its GPUs is coming
  or draining;
- every pod on those GPUs may move (the same judge and rules as consolidation);
- each of its GPUs' shares fit, on another node, on GPUs of the pool that stay held
  (`Room.fit`, best fit), or else together on a new GPU of a node where the pool already
  holds GPUs (so its capacity pods can land there), that is no sparser, has a whole GPU
  nobody holds (`free`), takes pods and has the host CPU and memory for them.

Then each of its GPUs is emptied like any consolidation move: marked draining, its pods
evicted; their controllers recreate them, and placement puts them on the GPUs with room
or, where none has, asks a capacity pod, which the capacity profile packs onto the
fullest node with a free GPU (never a node whose every GPU of the pool is draining,
`scheduler.lifecycle.requirements`). One node per pool per round; never a node an
autoscaler is removing; never one for which a GPU would have to be bought.
"""

from collections.abc import Callable, Collection, Mapping
from functools import cache

from scheduler.consolidation import Judge, Move, Room, held, movable
from scheduler.ledger import Booking, Gpu, Ledger, Request

NEW_GPU: str = "new:"  # a target `new:<node>`: a new GPU on that node


def describe(target: str) -> str:
    """A move's target as an Event says it."""
    if target.startswith(NEW_GPU):
        return f"a new GPU on node {target.removeprefix(NEW_GPU)} (a whole GPU already there)"
    return f"GPU {target}"


Whole = tuple[Mapping[str, int], Collection[str]]  # free whole GPUs per node; `foreign`


def relocate(
    snapshot: Ledger,
    judge: Judge,
    whole: Callable[[], Whole],
    *,
    busy: Collection[str] = (),
    planned: Callable[[Move], None] | None = None,
) -> list[Move]:
    """The moves that empty, per pool not `busy`, its sparsest node that qualifies.
    `whole` says which whole GPUs are free and which nodes other pods hold GPUs on
    (`Cache.free_gpus`, a scan of every pod): asked once, and only when a pool has a node
    worth emptying."""
    whole = cache(whole)
    on_gpu: dict[str, list[Booking]] = {}
    for booking in snapshot.bookings.values():
        for uuid in booking.named:
            on_gpu.setdefault(uuid, []).append(booking)
    per_node: dict[str, int] = {}
    unsettled: set[str] = set()  # nodes with a GPU coming or draining
    pools: dict[str, list[Gpu]] = {}
    for gpu in snapshot.gpus.values():
        if gpu.coming or gpu.draining:
            unsettled.add(gpu.node)
        if held(gpu):
            per_node[gpu.node] = per_node.get(gpu.node, 0) + 1
            if gpu.pool not in busy:
                pools.setdefault(gpu.pool, []).append(gpu)
    moves: list[Move] = []
    for pool, gpus in sorted(pools.items()):
        mine: dict[str, list[Gpu]] = {}
        for gpu in gpus:
            mine.setdefault(gpu.node, []).append(gpu)
        slots: dict[str, int] | None = None
        room = Room(snapshot, gpus, per_node)
        for node in sorted(mine, key=lambda n: (per_node[n], n)):
            on_node = mine[node]
            if len(mine) < 2 or node in unsettled or len(on_node) != per_node[node]:
                continue
            if not all(movable(g, on_gpu.get(g.uuid, []), judge) for g in on_node):
                continue
            free, foreign = whole()
            if node in foreign:
                continue
            if slots is None:
                slots = dict(free)
            made = _empty(pool, node, on_node, mine, per_node, slots, room, on_gpu, len(gpus))
            if made is None:
                continue
            for move in made:
                moves.append(move)
                if planned is not None:
                    planned(move)
            break  # one node per pool and round
    return moves


def _empty(
    pool: str,
    node: str,
    on_node: list[Gpu],
    mine: Mapping[str, list[Gpu]],
    per_node: Mapping[str, int],
    slots: dict[str, int],
    room: Room,
    on_gpu: Mapping[str, list[Booking]],
    held_gpus: int,
) -> list[Move] | None:
    """Moves emptying `node`'s GPUs (`on_node`), booked in `room` and `slots`; None, and
    nothing booked, when one GPU's shares fit nowhere."""
    saved, slots_saved = room.save(), dict(slots)
    made: list[Move] = []
    for gpu in sorted(on_node, key=lambda g: (-g.used_compute, g.uuid)):
        shares = sorted(on_gpu.get(gpu.uuid, []), key=_largest_first)
        requests = [b.request for b in shares]
        targets = room.fit(gpu, requests, elsewhere=True)
        if targets is None:
            host = _new_gpu_on(node, mine, per_node, slots, room, requests)
            if host is None:
                room.restore(saved)
                slots.clear()
                slots.update(slots_saved)
                return None
            slots[host] -= 1
            room.emptied(gpu)
            targets = tuple(NEW_GPU + host for _ in shares)
        made.append(
            Move(
                pool,
                gpu.uuid,
                gpu.holder,
                gpu.node,
                tuple(b.request.key for b in shares),
                targets,
                held_gpus,
                held_gpus,
                node_gpus=per_node[node],
            )
        )
    return made


def _new_gpu_on(
    source: str,
    mine: Mapping[str, list[Gpu]],
    per_node: Mapping[str, int],
    slots: Mapping[str, int],
    room: Room,
    requests: list[Request],
) -> str | None:
    """The node, of the pool's others no sparser than `source`, with a free GPU and the
    host room for `requests`, holding most GPUs (then by name); None when none has."""
    candidates = sorted(
        (n for n in mine if n != source and per_node[n] >= per_node[source]),
        key=lambda n: (-per_node[n], n),
    )
    for name in candidates:
        if slots.get(name, 0) > 0 and room.host_takes(name, requests):
            return name
    return None


def _largest_first(booking: Booking) -> tuple[int, int, str]:
    request = booking.request
    return (-request.compute, -request.gpu_memory, request.key)
