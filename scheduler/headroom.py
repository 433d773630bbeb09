"""Headroom: which of a pool's empty GPUs it keeps for its next pods. Pure.

A GPU a departure empties is a GPU someone pays for. Holding every one of them for a
fixed grace period (what gpupack did before: 300 s) made churn cost whole GPUs, and
with an autoscaler whole nodes, for pods that never came. But giving every one back at
once makes the next pod of a busy pool wait for a capacity pod, and under an autoscaler
for a node. So a pool keeps *room* rather than GPUs:

- **How much:** room for `pods` more pods as large as the largest share the pool runs
  now (its largest compute and its largest memory; `Headroom`). The likely next pod of a
  pool is one more replica like those it has (a Deployment scaling up, a pod replaced,
  the next notebook of the namespace); a pool that runs nothing keeps nothing, so the
  nodes of a workload that left go as fast as the autoscaler allows.
- **Where from:** the free room on the GPUs the pool holds and uses first (it costs
  nothing more); only what they lack is made up from its empty GPUs, those on the nodes
  holding most of the pool's GPUs first (a node the pool keeps anyway; an empty GPU
  alone on a node would keep the node).
- **The rest** is given back: at once when the capacity pod never hosted anything past
  `unused_grace`, else after `grace_period` (`scheduler.lifecycle`), both short.

Waiting pods are not headroom: an empty GPU a waiting pod could use is kept for it
(`scheduler.lifecycle._could_use`) before this is asked. A GPU that takes no new pods
(draining, unhealthy, over-committed, on a node an autoscaler is removing) is no room.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.ledger import FULL_GPU, Gpu, Ledger, Request


@dataclass(frozen=True, slots=True)
class Headroom:
    """Room for `pods` more pods of (`compute` millis, `memory` bytes) each."""

    pods: int = 0
    compute: int = 0
    memory: int = 0

    def fits_on(self, gpu: Gpu, used_compute: int, used_memory: int) -> int:
        """How many of these pods a GPU with these sums takes (at most `pods`)."""
        if self.pods <= 0:
            return 0
        count = (gpu.compute - used_compute) // self.compute if self.compute else self.pods
        if gpu.memory and self.memory:
            count = min(count, (gpu.memory - used_memory) // self.memory)
        return max(0, min(count, self.pods))


def headroom_of(requests: Iterable[Request], pods: int) -> Headroom:
    """Room for `pods` more pods as large as the largest of `requests` (the shares a pool
    runs); none when it runs none. A whole-GPU pod (compute of a GPU or more) asks an
    empty GPU."""
    compute = memory = 0
    seen = False
    for request in requests:
        seen = True
        compute = max(compute, min(request.compute, FULL_GPU))
        memory = max(memory, request.gpu_memory)
    if not seen or pods <= 0:
        return Headroom()
    return Headroom(pods, compute, memory)


def takes_pods(gpu: Gpu) -> bool:
    """Whether placement may put a new pod on this GPU."""
    return not gpu.coming and gpu.healthy and not gpu.draining and not gpu.removing and not gpu.over


def kept(
    need: Headroom,
    used: Sequence[Gpu],
    empty: Sequence[Gpu],
    per_node: dict[str, int],
) -> tuple[str, ...]:
    """The UUIDs of the `empty` GPUs a pool keeps for `need`, given the room left on the
    GPUs it `used` (hosting its shares); `per_node`: the pool's held GPUs on each node."""
    missing = need.pods
    for gpu in used:
        if missing <= 0:
            return ()
        if takes_pods(gpu):
            missing -= need.fits_on(gpu, gpu.used_compute, gpu.used_memory)
    keep: list[str] = []
    for gpu in sorted(empty, key=lambda g: (-per_node.get(g.node, 0), g.node, g.uuid)):
        if missing <= 0:
            break
        if not takes_pods(gpu):
            continue
        room = need.fits_on(gpu, 0, 0)
        if room > 0:
            keep.append(gpu.uuid)
            missing -= room
    return tuple(keep)


def pools_headroom(ledger: Ledger, empty: list[Gpu], pods: int) -> frozenset[str]:
    """Which of the `empty` GPUs (running, nothing booked) each of their pools keeps as
    headroom for `pods` more pods like the largest it runs (`headroom_of`, `kept`)."""
    if not empty or pods <= 0:
        return frozenset()
    pools = {g.pool for g in empty}
    used: dict[str, list[Gpu]] = {}
    per_node: dict[str, dict[str, int]] = {}
    for gpu in ledger.gpus.values():
        if gpu.pool in pools and not gpu.coming:
            nodes = per_node.setdefault(gpu.pool, {})
            nodes[gpu.node] = nodes.get(gpu.node, 0) + 1
            if gpu.pods:
                used.setdefault(gpu.pool, []).append(gpu)
    requests: dict[str, list[Request]] = {}
    for booking in ledger.bookings.values():
        on = ledger.gpus.get(booking.gpus[0]) if booking.gpus else None
        if on is not None and on.pool in pools:
            requests.setdefault(on.pool, []).append(booking.request)
    keep: set[str] = set()
    for pool in pools:
        need = headroom_of(requests.get(pool, ()), pods)
        mine = [g for g in empty if g.pool == pool and not g.coming]
        keep.update(kept(need, used.get(pool, ()), mine, per_node.get(pool, {})))
    return frozenset(keep)
