"""Scorers: which GPUs on a node a pod should take, and at what cost (lower is better).

Pure. Two scorers; the cluster may run either.

- `PackingScorer` is best fit in compute: the GPU left with the least free compute wins,
  so partly used GPUs fill before empty ones are opened (consolidation), and among equal
  GPUs the fuller node wins, so whole nodes stay free for the autoscaler. No state.
- `FragmentationScorer` avoids fragmenting GPUs in ways the typical pods cannot use. It
  is built from a *task mix* (`task_mix`: the most frequent pod specs, covering 95 % of
  the pods seen, with their popularity). A node's *fragmentation* is the idle GPU
  compute that the typical pods could not use there, popularity-weighted (the FGD
  paper's measure, `fragmentation`); the cost of a placement is how much it grows it.
  On top of that delta it consolidates: among placements that fragment alike it prefers
  GPUs and then nodes that are already in use, and the partly used GPU that fits best.

The fragmentation is computed on compute millis. GPU memory is checked by placement
(`fits` only holds GPUs with enough free memory); when pods ask for memory in
proportion to compute, as the trace benchmark derives it, the memory dimension is
implied by compute. A scorer's answer for a node depends only on that node's state, the
request and the scorer's task mix (`generation` moves when the mix is replaced), so
placement may memoise it per node; answers are also shared between nodes in the same
state (a bounded cache), which keeps a cold decision over thousands of nodes cheap.
"""

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from scheduler.snapshot import FULL_GPU, Gpu, Node, Request

NODE_WEIGHT: Final = 1e-3  # node fullness only breaks ties between equal GPUs
COVERAGE: Final = 0.95  # the typical pods: the most frequent specs covering 95 % of pods
CACHE_LIMIT: Final = 200_000  # answers kept per scorer before the cache starts over

# FragmentationScorer's cost, in GPU millis: the fragmentation delta, then consolidation.
OPEN_GPU_COST: Final = 0.5  # taking an idle GPU rather than a partly used one
OPEN_NODE_COST: Final = 0.25  # starting a node nobody uses
BEST_FIT_COST: Final = 1e-4  # per milli left free on a partly used GPU


class PackingScorer:
    generation: Final = 0

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        node_free = node.free_cpu / node.cpu if node.cpu else 0.0
        if request.gpus <= 0:
            return NODE_WEIGHT * node_free, ()
        ranked = sorted(fits, key=lambda g: (g.free_compute, -g.pods, g.uuid))
        chosen = tuple(ranked[: request.gpus])
        left = sum(g.free_compute - request.compute for g in chosen) / (FULL_GPU * request.gpus)
        return left + NODE_WEIGHT * node_free, chosen


@dataclass(frozen=True, slots=True)
class TaskType:
    """One typical pod spec and its popularity (the weights of a mix sum to 1)."""

    cpu: int  # millicores
    compute: int  # millis of each GPU; 0 for a CPU-only pod
    gpus: int
    models: frozenset[str] | None = None  # allowed GPU models; None: any
    weight: float = 1.0


def task_mix(requests: Iterable[Request], coverage: float = COVERAGE) -> tuple[TaskType, ...]:
    """The most frequent (cpu, compute, gpus, models) specs of `requests`, most frequent
    first, until they cover `coverage` of the pods; weights renormalised to sum to 1."""
    counts: Counter[tuple[int, int, int, frozenset[str] | None]] = Counter(
        (r.cpu, r.compute if r.gpus else 0, r.gpus, r.models) for r in requests
    )
    total = sum(counts.values())
    if not total:
        return ()
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], _spec_order(kv[0])))
    chosen: list[tuple[tuple[int, int, int, frozenset[str] | None], int]] = []
    covered = 0
    for spec, count in ranked:
        if covered >= coverage * total:
            break
        chosen.append((spec, count))
        covered += count
    return tuple(
        TaskType(cpu, compute, gpus, models, count / covered)
        for (cpu, compute, gpus, models), count in chosen
    )


def _spec_order(spec: tuple[int, int, int, frozenset[str] | None]) -> tuple[int, int, int, str]:
    cpu, compute, gpus, models = spec
    return cpu, compute, gpus, "|".join(sorted(models)) if models is not None else ""


def fragmentation(
    mix: Sequence[TaskType], model: str, free_cpu: int, free: Sequence[int]
) -> float:
    """Idle GPU millis that the typical pods could not use on a node with this model, free
    CPU and per-GPU free compute, popularity-weighted. For one task type: the whole idle
    GPU if it cannot run there at all (CPU-only, wrong model, too little CPU, fewer than
    `gpus` GPUs with `compute` free), else the free compute of GPUs too small for it."""
    ordered = sorted(free)
    total = sum(ordered)
    if not total:
        return 0.0
    prefix = [0]
    for value in ordered:
        prefix.append(prefix[-1] + value)
    out = 0.0
    for task in mix:
        if (
            task.gpus == 0
            or free_cpu < task.cpu
            or (task.models is not None and model not in task.models)
        ):
            out += task.weight * total
            continue
        small = bisect_left(ordered, task.compute)  # GPUs with less than `compute` free
        if len(ordered) - small < task.gpus:
            out += task.weight * total
        else:
            out += task.weight * prefix[small]
    return out


class FragmentationScorer:
    """Fragmentation delta plus consolidation (see the module docstring)."""

    def __init__(self, mix: Sequence[TaskType] = ()) -> None:
        self._mix: tuple[TaskType, ...] = tuple(mix)
        self._generation = 0
        self._frag: dict[tuple[object, ...], float] = {}
        self._answers: dict[tuple[object, ...], tuple[float, tuple[int, ...]]] = {}

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def mix(self) -> tuple[TaskType, ...]:
        return self._mix

    def set_mix(self, mix: Sequence[TaskType]) -> None:
        """Replace the task mix (e.g. re-derived from recent pods); answers change."""
        self._mix = tuple(mix)
        self._generation += 1
        self._frag.clear()
        self._answers.clear()

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        pooled = [g for g in node.gpus if g.pool == request.pool and not g.coming]
        model = pooled[0].model if pooled else ""
        free = tuple(sorted((g.free_compute for g in pooled), reverse=True))
        used = tuple(sorted((g.free_compute for g in pooled if g.pods), reverse=True))
        fit_free = tuple(sorted({(g.free_compute, g.pods > 0) for g in fits}))
        key = (
            request.cpu,
            request.compute,
            request.gpus,
            model,
            node.free_cpu,
            node.used_pods > 0,
            free,
            used,
            fit_free,
        )
        answer = self._answers.get(key)
        if answer is None:
            answer = self._decide(request, model, node.free_cpu, node.used_pods > 0, free, fits)
            if len(self._answers) >= CACHE_LIMIT:
                self._answers.clear()
            self._answers[key] = answer
        cost, wanted = answer
        return cost, _pick(fits, wanted, request.gpus)

    def _frag_of(self, model: str, free_cpu: int, free: tuple[int, ...]) -> float:
        key = (model, free_cpu, free)
        value = self._frag.get(key)
        if value is None:
            value = fragmentation(self._mix, model, free_cpu, free)
            if len(self._frag) >= CACHE_LIMIT:
                self._frag.clear()
            self._frag[key] = value
        return value

    def _decide(
        self,
        request: Request,
        model: str,
        free_cpu: int,
        node_used: bool,
        free: tuple[int, ...],
        fits: Sequence[Gpu],
    ) -> tuple[float, tuple[int, ...]]:
        before = self._frag_of(model, free_cpu, free)
        cpu_after = free_cpu - request.cpu
        open_node = 0.0 if node_used else OPEN_NODE_COST
        if request.gpus <= 0:
            return self._frag_of(model, cpu_after, free) - before + open_node, ()
        options: list[tuple[float, tuple[int, ...]]] = []
        if request.gpus == 1:
            seen: set[tuple[int, bool]] = set()
            for gpu in fits:
                option = (gpu.free_compute, gpu.pods > 0)
                if option in seen:
                    continue
                seen.add(option)
                after = _take(free, (gpu.free_compute,), request.compute)
                cost = self._frag_of(model, cpu_after, after) - before
                if gpu.pods:
                    cost += BEST_FIT_COST * (gpu.free_compute - request.compute)
                else:
                    cost += OPEN_GPU_COST
                options.append((cost + open_node, (gpu.free_compute,)))
            return min(options)
        ranked = sorted(fits, key=lambda g: (g.free_compute, -g.pods))[: request.gpus]
        wanted = tuple(g.free_compute for g in ranked)
        after = _take(free, wanted, request.compute)
        cost = self._frag_of(model, cpu_after, after) - before
        cost += OPEN_GPU_COST * sum(1 for g in ranked if not g.pods)
        return cost + open_node, wanted


def _take(free: tuple[int, ...], taken: Sequence[int], compute: int) -> tuple[int, ...]:
    """`free` (sorted, largest first) after `compute` is taken from GPUs with these free
    values."""
    out = list(free)
    for value in taken:
        out.remove(value)
        out.append(value - compute)
    out.sort(reverse=True)
    return tuple(out)


def _pick(fits: Sequence[Gpu], wanted: Sequence[int], count: int) -> tuple[Gpu, ...]:
    """GPUs of `fits` with the wanted free compute values, in `fits` order."""
    remaining = list(wanted)
    chosen: list[Gpu] = []
    for gpu in fits:
        if gpu.free_compute in remaining:
            remaining.remove(gpu.free_compute)
            chosen.append(gpu)
            if len(chosen) == count:
                break
    return tuple(chosen)
