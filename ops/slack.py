"""The bill's slack: GPUs held against the GPUs the shares need, and what holds the
difference, as `kubectl gpupack status` shows it. Pure: pods in, counts out.

Per pool (capacity pods' `gpupack.io/pool`), the shares running on its GPUs need at least
their compute and their memory, each rounded up to whole GPUs (the bound consolidation
works towards, `scheduler.consolidation.lower_bound`). A held GPU beyond that is one of:

- **draining**: consolidation is emptying it (`gpupack.io/draining`); it goes once its
  pods have moved;
- **headroom**: empty, kept as the pool's room for its next pod (`scheduler.headroom`,
  computed here exactly as the scheduler does, less what only it sees: node taints);
- **grace**: empty and not needed, given back once the grace period passes;
- **fragmentation**: hosting shares that would fit on fewer GPUs; consolidation gathers
  them where the pods' policies allow a move.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpupack import keys
from gpupack.errors import ContractError
from gpupack.objects import JSON, annotations_of, labels_of
from gpupack.quantity import parse_compute, parse_memory
from gpupack.shares import gpu_memory
from scheduler.headroom import headroom_of, kept
from scheduler.ledger import Gpu, Request


@dataclass(slots=True)
class Slack:
    held: int = 0  # running capacity pods holding a GPU
    needed: int = 0  # the fewest GPUs the running shares fit, pool by pool
    draining: int = 0
    headroom: int = 0
    grace: int = 0
    fragmentation: int = 0


@dataclass(slots=True)
class _Pool:
    gpus: dict[str, Gpu] = field(default_factory=dict)  # GPU UUID -> the GPU
    requests: list[Request] = field(default_factory=list)


def slack(capacity: Iterable[JSON], shares: Iterable[JSON], headroom_pods: int = 1) -> Slack:
    """The slack of the running capacity pods `capacity` and the bound shares `shares`;
    `headroom_pods` as the scheduler's `--headroom-pods` (the chart's default: 1)."""
    pools: dict[str, _Pool] = {}
    where: dict[str, _Pool] = {}
    for pod in capacity:
        name = str(pod["metadata"].get("name", ""))
        pool = pools.setdefault(labels_of(pod).get(keys.POOL, ""), _Pool())
        gpu = Gpu(
            uuid=annotations_of(pod).get(keys.GPU_UUID, name),
            node=str((pod.get("spec") or {}).get("nodeName", "")),
            memory=gpu_memory(pod) or 0,
            holder=name,
            draining=bool(annotations_of(pod).get(keys.DRAINING)),
        )
        pool.gpus[gpu.uuid] = gpu
        where[gpu.uuid] = pool
    for pod in shares:
        annotations = annotations_of(pod)
        holder = where.get(annotations.get(keys.GPU_UUID, ""))
        if holder is None:
            continue
        try:
            compute = parse_compute(annotations.get(keys.GPU_COMPUTE, "0"), keys.GPU_COMPUTE)
            memory = parse_memory(annotations.get(keys.GPU_MEMORY, "0"), keys.GPU_MEMORY)
        except ContractError:
            continue
        gpu = holder.gpus[annotations[keys.GPU_UUID]]
        gpu.used_compute += compute
        gpu.used_memory += memory
        gpu.owners["share"] = gpu.owners.get("share", 0) + 1
        holder.requests.append(
            Request(key=str(pod["metadata"].get("name")), compute=compute, gpu_memory=memory)
        )
    result = Slack()
    for pool in pools.values():
        gpus = list(pool.gpus.values())
        result.held += len(gpus)
        used = [g for g in gpus if g.pods]
        needed = _needed(used)
        result.needed += needed
        result.draining += sum(1 for g in gpus if g.draining)
        empty = [g for g in gpus if not g.pods and not g.draining]
        per_node: dict[str, int] = {}
        for gpu in gpus:
            per_node[gpu.node] = per_node.get(gpu.node, 0) + 1
        room = kept(headroom_of(pool.requests, headroom_pods), used, empty, per_node)
        result.headroom += len(room)
        result.grace += len(empty) - len(room)
        hosting = sum(1 for g in used if not g.draining)
        result.fragmentation += max(0, hosting - needed)
    return result


def _needed(used: list[Gpu]) -> int:
    compute = sum(g.used_compute for g in used)
    memory = sum(g.used_memory for g in used)
    largest = max((g.memory for g in used), default=0)
    by_memory = math.ceil(memory / largest) if largest else 0
    return max(math.ceil(compute / 1000), by_memory)
