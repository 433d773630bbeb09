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
placement may memoise it per node; both scorers say so (`by_state`), and placement then
scores each distinct node state once per pod shape (`Snapshot.state_of`).

Speed: a new node state costs a few fragmentation sums over the task mix. They are kept
per (model, free CPU, free memory, free compute) in a bounded cache, and the deep sum
(`_DeepFragmentation`) keeps the GPU side per model and free compute, so each sum is one
pass of integer arithmetic over the mix, with the same float additions in the same order
as `fragmentation` (bit-identical, so costs and decisions are too).
"""

import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from scheduler.snapshot import FULL_GPU, Gpu, Node, Request

NODE_WEIGHT: Final = 1e-3  # node fullness only breaks ties between equal GPUs
COVERAGE: Final = 0.95  # FGD's typical pods: the most frequent specs covering 95 % of pods
MIX_COVERAGE: Final = 0.99  # what FragmentationScorer is tuned with: rarer multi-GPU specs too
CACHE_LIMIT: Final = 200_000  # answers kept per scorer before the cache starts over


Slot = tuple[int, bool]  # a GPU as a scorer sees it: free compute, hosts pods


class PackingScorer:
    generation: Final = 0
    by_state: Final = True  # the cost depends only on the node's state (see placement)

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
    memory: int = 0  # bytes of host memory (the mean over the spec's pods)


def task_mix(requests: Iterable[Request], coverage: float = COVERAGE) -> tuple[TaskType, ...]:
    """The most frequent (cpu, compute, gpus, models) specs of `requests`, most frequent
    first, until they cover `coverage` of the pods; weights renormalised to sum to 1."""
    counts: Counter[tuple[int, int, int, frozenset[str] | None]] = Counter()
    memory: Counter[tuple[int, int, int, frozenset[str] | None]] = Counter()
    for r in requests:
        spec = (r.cpu, r.compute if r.gpus else 0, r.gpus, r.models)
        counts[spec] += 1
        memory[spec] += r.memory
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
    out: list[TaskType] = []
    for spec, count in chosen:
        cpu, compute, gpus, models = spec
        out.append(TaskType(cpu, compute, gpus, models, count / covered, memory[spec] // count))
    return tuple(out)


def _spec_order(spec: tuple[int, int, int, frozenset[str] | None]) -> tuple[int, int, int, str]:
    cpu, compute, gpus, models = spec
    return cpu, compute, gpus, "|".join(sorted(models)) if models is not None else ""


def fragmentation(
    mix: Sequence[TaskType],
    model: str,
    free_cpu: int,
    free: Sequence[int],
    free_memory: int | None = None,
    *,
    deep: bool = False,
) -> float:
    """Idle GPU millis that the typical pods could not use on a node with this model, free
    CPU and per-GPU free compute, popularity-weighted. For one task type: the whole idle
    GPU if it cannot run there at all (CPU-only, wrong model, too little CPU, too little
    host memory when `free_memory` is given, fewer than `gpus` GPUs with `compute` free),
    else the free compute of GPUs too small for it."""
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
            or (free_memory is not None and free_memory < task.memory)
            or (task.models is not None and model not in task.models)
        ):
            out += task.weight * total
            continue
        if deep:
            slots = (
                sum(g // task.compute for g in ordered)
                if task.gpus == 1
                else (len(ordered) - bisect_left(ordered, task.compute)) // task.gpus
            )
            if task.cpu:
                slots = min(slots, free_cpu // task.cpu)
            if free_memory is not None and task.memory:
                slots = min(slots, free_memory // task.memory)
            out += task.weight * (total - slots * task.compute * task.gpus)
            continue
        small = bisect_left(ordered, task.compute)  # GPUs with less than `compute` free
        if len(ordered) - small < task.gpus:
            out += task.weight * total
        else:
            out += task.weight * prefix[small]
    return out


@dataclass(frozen=True, slots=True)
class Weights:
    """How `FragmentationScorer` turns a placement into a cost, in GPU millis. The
    defaults are tuned on the openb trace (benchmarks/openb)."""

    step: float = 40.0  # fragmentation deltas within one step count as equal
    open_gpu: float = 50.0  # taking an idle GPU rather than a partly used one
    open_node: float = 0.25  # starting a node nobody uses
    best_fit: float = 1e-4  # per milli left free on the partly used GPU taken
    host_memory: bool = True  # a task type that lacks host memory cannot use the node
    deep: bool = True  # count what filling the node with each task type would leave


class FragmentationScorer:
    """Fragmentation delta plus consolidation (see the module docstring)."""

    by_state: Final = True  # the cost depends only on the node's state (see placement)

    def __init__(self, mix: Sequence[TaskType] = (), weights: Weights | None = None) -> None:
        self._mix: tuple[TaskType, ...] = tuple(mix)
        self._weights = weights or Weights()
        self._generation = 0
        self._frag: dict[tuple[object, ...], float] = {}
        self._answers: dict[tuple[object, ...], tuple[float, tuple[Slot, ...]]] = {}
        self._deep = _DeepFragmentation(self._mix)

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
        self._deep = _DeepFragmentation(self._mix)

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        pooled = [g for g in node.gpus if g.pool == request.pool and not g.coming]
        model = pooled[0].model if pooled else ""
        free = tuple(sorted((g.free_compute for g in pooled), reverse=True))
        fit_slots = tuple(sorted(_slot(g) for g in fits))
        node_used = node.used_pods > 0
        memory = node.free_memory if self._weights.host_memory else None
        key = (
            request.cpu,
            request.memory if memory is not None else 0,
            request.compute,
            request.gpus,
            model,
            node.free_cpu,
            memory,
            node_used,
            free,
            fit_slots,
        )
        answer = self._answers.get(key)
        if answer is None:
            state = _State(model, node.free_cpu, memory, node_used)
            answer = self._decide(request, state, free, fit_slots)
            if len(self._answers) >= CACHE_LIMIT:
                self._answers.clear()
            self._answers[key] = answer
        cost, wanted = answer
        return cost, _pick(fits, wanted, request.gpus)

    def _frag_of(self, state: "_State", free: tuple[int, ...]) -> float:
        key = (state.model, state.cpu, state.memory, free)
        value = self._frag.get(key)
        if value is None:
            if self._weights.deep:
                value = self._deep(state.model, state.cpu, free, state.memory)
            else:
                value = fragmentation(self._mix, state.model, state.cpu, free, state.memory)
            if len(self._frag) >= CACHE_LIMIT:
                self._frag.clear()
            self._frag[key] = value
        return value

    def _cost(self, after: "_State", free: tuple[int, ...], before: float) -> float:
        """The cost of leaving the node in `after` with `free` GPU compute."""
        w = self._weights
        delta = self._frag_of(after, free) - before
        if w.step:
            delta = w.step * math.ceil(delta / w.step - 1e-9)
        return delta if after.used else delta + w.open_node

    def _decide(
        self, request: Request, state: "_State", free: tuple[int, ...], fit_slots: tuple[Slot, ...]
    ) -> tuple[float, tuple[Slot, ...]]:
        w = self._weights
        before = self._frag_of(state, free)
        after = _State(
            state.model,
            state.cpu - request.cpu,
            None if state.memory is None else state.memory - request.memory,
            state.used,
        )
        if request.gpus <= 0:
            return self._cost(after, free, before), ()
        if request.gpus == 1:
            options: list[tuple[float, tuple[Slot, ...]]] = []
            for slot in dict.fromkeys(fit_slots):
                cost = self._cost(after, _take(free, (slot,), request.compute), before)
                if slot[1]:
                    cost += w.best_fit * (slot[0] - request.compute)
                else:
                    cost += w.open_gpu
                options.append((cost, (slot,)))
            return min(options)
        ranked = sorted(fit_slots, key=lambda s: (s[0], not s[1]))[: request.gpus]
        cost = self._cost(after, _take(free, ranked, request.compute), before)
        return cost + w.open_gpu * sum(1 for s in ranked if not s[1]), tuple(ranked)


class _DeepFragmentation:
    """`fragmentation(mix, ..., deep=True)`, bit for bit, faster: the GPU side (how many
    pods of each task type the GPUs hold) is kept per model and free compute, and the
    per-task sums run over flat tuples in the mix's order (the same float additions)."""

    def __init__(self, mix: Sequence[TaskType]) -> None:
        self._mix = tuple(mix)
        self._tasks = tuple((t.weight, t.cpu, t.memory, t.compute * t.gpus) for t in mix)
        self._gpu_side: dict[tuple[str, tuple[int, ...]], tuple[int, ...]] = {}

    def __call__(
        self, model: str, free_cpu: int, free: Sequence[int], free_memory: int | None
    ) -> float:
        ordered = tuple(sorted(free))
        total = sum(ordered)
        if not total:
            return 0.0
        key = (model, ordered)
        slots = self._gpu_side.get(key)
        if slots is None:
            slots = tuple(_gpu_slots(task, model, ordered) for task in self._mix)
            if len(self._gpu_side) >= CACHE_LIMIT:
                self._gpu_side.clear()
            self._gpu_side[key] = slots
        check_memory = free_memory is not None
        host_memory = free_memory or 0
        out = 0.0
        for (weight, cpu, memory, per_pod), gpu_fit in zip(self._tasks, slots, strict=True):
            fit = gpu_fit
            if fit < 0 or free_cpu < cpu or (check_memory and host_memory < memory):
                out += weight * total
                continue
            if cpu and free_cpu // cpu < fit:
                fit = free_cpu // cpu
            if check_memory and memory and host_memory // memory < fit:
                fit = host_memory // memory
            out += weight * (total - fit * per_pod)
        return out


def _gpu_slots(task: TaskType, model: str, ordered: tuple[int, ...]) -> int:
    """Pods of `task` that GPUs with `ordered` free compute hold; -1 if none can run."""
    if task.gpus == 0 or (task.models is not None and model not in task.models):
        return -1
    if task.gpus == 1:
        return sum(g // task.compute for g in ordered)
    return (len(ordered) - bisect_left(ordered, task.compute)) // task.gpus


@dataclass(frozen=True, slots=True)
class _State:
    """A node as the fragmentation sees it."""

    model: str
    cpu: int  # free millicores
    memory: int | None  # free bytes; None: not considered
    used: bool  # hosts pods


def _slot(gpu: Gpu) -> Slot:
    return gpu.free_compute, gpu.pods > 0


def _take(free: tuple[int, ...], taken: Sequence[Slot], compute: int) -> tuple[int, ...]:
    """`free` (sorted, largest first) after `compute` is taken from GPUs in these slots."""
    out = list(free)
    for value, _ in taken:
        out.remove(value)
        out.append(value - compute)
    out.sort(reverse=True)
    return tuple(out)


def _pick(fits: Sequence[Gpu], wanted: Sequence[Slot], count: int) -> tuple[Gpu, ...]:
    """GPUs of `fits` in the wanted slots, in `fits` order."""
    remaining = list(wanted)
    chosen: list[Gpu] = []
    for gpu in fits:
        slot = _slot(gpu)
        if slot in remaining:
            remaining.remove(slot)
            chosen.append(gpu)
            if len(chosen) == count:
                break
    return tuple(chosen)
