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
as `fragmentation` (bit-identical, so costs and decisions are too). Placement may skip
a state altogether: `FragmentationScorer.bounder` gives a lower bound on the cost from a
per-state `profile` (usable capacity, what taking CPU or memory at least loses there)
and per-GPU-side sums, a few dictionary lookups where a scoring takes passes over the mix.
"""

import itertools
import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from scheduler.snapshot import FULL_GPU, Gpu, Node, Request

NODE_WEIGHT: Final = 1e-3  # node fullness only breaks ties between equal GPUs
COVERAGE: Final = 0.95  # FGD's typical pods: the most frequent specs covering 95 % of pods
MIX_COVERAGE: Final = 0.99  # what FragmentationScorer is tuned with: rarer multi-GPU specs too
CACHE_LIMIT: Final = 200_000  # answers kept per scorer before the cache starts over


Slot = tuple[int, bool]  # a GPU as a scorer sees it: free compute, hosts pods
_Gpu = tuple[int, bool, str, int]  # free compute, hosts pods, model, free memory (-1: unknown)
_Losses = tuple[tuple[int, ...], tuple[float, ...]]  # sorted slacks, loss of taking more
_NO_LOSSES: Final[_Losses] = ((), (0.0,))
_Kind = tuple[int, int, float]  # GPUs, compute, popularity x GPU millis per pod


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
        self._weight_sum = _weight_sum(self._mix)
        self._sides: dict[tuple[object, ...], int] = {}  # GPU sides numbered for `bounder`
        self._side_numbers = itertools.count()  # never reused
        # GPU demand -> GPU side number -> `_gpu_options`
        self._options: dict[tuple[object, ...], dict[int, tuple[tuple[float, float], ...]]] = {}

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
        self._weight_sum = _weight_sum(self._mix)
        self._options.clear()

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

    def profile(self, node: Node, pool: str) -> "_Profile":
        """What `bounder`'s bounds read of the node's state, for pods of `pool`: independent
        of the pod, so placement keeps one per node state (see placement)."""
        w = self._weights
        pooled = [g for g in node.gpus if g.pool == pool and not g.coming]
        model = pooled[0].model if pooled else ""
        free = tuple(sorted((g.free_compute for g in pooled), reverse=True))
        memory = node.free_memory if w.host_memory else None
        used = node.used_pods > 0
        before = self._frag_of(_State(model, node.free_cpu, memory, used), free)
        gpus = tuple(
            sorted(
                (
                    g.free_compute,
                    bool(g.owners),
                    g.model,
                    g.memory - g.used_memory if g.memory else -1,
                )
                for g in pooled
                if not g.exclusive_owner
            )
        )
        side = (model, free, gpus)
        number = self._sides.get(side)
        if number is None:
            if len(self._sides) >= CACHE_LIMIT:
                self._sides.clear()
            number = self._sides[side] = next(self._side_numbers)
        weight = self._weight_sum or 0.0
        total = weight * sum(free)
        cpu_losses = memory_losses = _NO_LOSSES
        if w.deep:
            cpu_losses, memory_losses = self._deep.host_losses(model, node.free_cpu, free, memory)
        return _Profile(
            pool,
            node.free_cpu,
            node.free_memory,
            used,
            total - before,
            1e-6 * (1.0 + total),
            side,
            number,
            cpu_losses,
            memory_losses,
        )

    def bounder(self, request: Request) -> Callable[[object], float] | None:
        """For `request`, a function from a node state's `profile` to a lower bound on
        the cost `choose` gives it there (placement skips states whose bound cannot beat
        the best cost found): inf when the pod cannot fit there, -inf when there is nothing
        to bound with. None when no bound is known (real-time-mps pods, negative weights).

        Placing x GPU millis never makes the node's usable capacity grow (every task
        type's fit only shrinks as CPU, memory and GPU compute do), so with weights summing
        to 1 the fragmentation delta is -x plus the usable capacity lost (the deep
        measure), and that loss is at least what the node had usable minus what its GPUs
        alone could still use afterwards (cached per model and free compute), and at least
        the popularity of the task types whose fit the CPU or host memory taken shrinks
        (`_DeepFragmentation.host_losses`). The consolidation terms are counted exactly."""
        w = self._weights
        weight = self._weight_sum
        if request.exclusive or weight is None:
            return None
        demand = (request.compute, request.gpus, request.models, request.gpu_memory)
        options_of = self._options.get(demand)
        if options_of is None or len(options_of) >= CACHE_LIMIT:
            options_of = self._options[demand] = {}
        pool, cpu, memory = request.pool, request.cpu, request.memory
        taken = request.compute * max(request.gpus, 0) * weight
        step, open_node = w.step, w.open_node
        ceil, inf = math.ceil, math.inf

        def bound(profile: object) -> float:
            if not isinstance(profile, _Profile) or profile.pool != pool:
                return -inf
            if profile.cpu < cpu or profile.memory < memory:
                return inf
            options = options_of.get(profile.number)
            if options is None:
                options = options_of[profile.number] = self._gpu_options(profile.side, request)
            slacks, losses = profile.cpu_losses
            host = losses[bisect_left(slacks, cpu)]
            slacks, losses = profile.memory_losses
            more = losses[bisect_left(slacks, memory)]
            host = max(host, more)
            usable = profile.usable
            spent = taken + profile.slack
            out = inf
            for usable_after, extra in options:
                loss = usable - usable_after
                delta = (loss if loss > host else host) - spent
                if step:
                    delta = step * ceil(delta / step - 1e-9)
                cost = delta if profile.used else delta + open_node
                cost += extra
                out = min(out, cost)
            return out

        return bound

    def _gpu_options(
        self, side: tuple[str, tuple[int, ...], tuple[_Gpu, ...]], request: Request
    ) -> tuple[tuple[float, float], ...]:
        """For each placement `choose` may weigh on GPUs in this state: what the GPUs alone
        could still use afterwards (inf when not measured) and the consolidation terms."""
        w = self._weights
        model, free, gpus = side
        fit = [
            (value, used)
            for value, used, gpu_model, memory in gpus
            if value >= request.compute
            and (request.models is None or gpu_model in request.models)
            and (memory < 0 or memory >= request.gpu_memory)
        ]
        if len(fit) < request.gpus:
            return ()

        def usable(left: tuple[int, ...]) -> float:
            return self._deep.usable(model, left) if w.deep else math.inf

        if request.gpus <= 0:
            return ((usable(free), 0.0),)
        if request.gpus == 1:
            deep = self._deep
            return tuple(
                (
                    deep.usable_after(model, free, slot[0], request.compute)
                    if w.deep
                    else math.inf,
                    w.best_fit * (slot[0] - request.compute) if slot[1] else w.open_gpu,
                )
                for slot in dict.fromkeys(fit)
            )
        ranked = sorted(fit, key=lambda s: (s[0], not s[1]))[: request.gpus]
        opened = w.open_gpu * sum(1 for s in ranked if not s[1])
        return ((usable(_take(free, ranked, request.compute)), opened),)

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
        self._usable: dict[tuple[str, tuple[int, ...]], float] = {}
        self._kinds: dict[str, tuple[tuple[tuple[int, float], ...], tuple[_Kind, ...]]] = {}
        self._taken: dict[tuple[str, int, int], float] = {}

    def _slots(self, model: str, ordered: tuple[int, ...]) -> tuple[int, ...]:
        key = (model, ordered)
        slots = self._gpu_side.get(key)
        if slots is None:
            seen: dict[tuple[object, ...], int] = {}  # task types alike on the GPU side
            out: list[int] = []
            for task in self._mix:
                kind = (task.gpus, task.compute, task.models is None or model in task.models)
                fit = seen.get(kind)
                if fit is None:
                    fit = seen[kind] = _gpu_slots(task, model, ordered)
                out.append(fit)
            slots = tuple(out)
            if len(self._gpu_side) >= CACHE_LIMIT:
                self._gpu_side.clear()
            self._gpu_side[key] = slots
        return slots

    def usable(self, model: str, free: Sequence[int]) -> float:
        """GPU millis the typical pods could use counting only the GPUs (no CPU or host
        memory limit), popularity-weighted: at least the usable part of any node with
        this model and free compute."""
        ordered = tuple(sorted(free))
        key = (model, ordered)
        value = self._usable.get(key)
        if value is None:
            value = 0.0
            for (weight, _, _, per_pod), fit in zip(
                self._tasks, self._slots(model, ordered), strict=True
            ):
                if fit > 0:
                    value += weight * fit * per_pod
            if len(self._usable) >= CACHE_LIMIT:
                self._usable.clear()
            self._usable[key] = value
        return value

    def host_losses(
        self, model: str, free_cpu: int, free: Sequence[int], free_memory: int | None
    ) -> tuple[_Losses, _Losses]:
        """On a node in this state, for CPU and for host memory: each task type's slack
        (how much can be taken before fewer of its pods fit), sorted, and the prefix sums
        of their popularity x GPU millis per pod. Taking r loses at least
        `losses[bisect_left(slacks, r)]` of usable capacity: each task type with less slack
        than r fits at least one pod fewer."""
        ordered = tuple(sorted(free))
        cpu: list[tuple[int, float]] = []
        memory: list[tuple[int, float]] = []
        if sum(ordered):
            check_memory = free_memory is not None
            host_memory = free_memory or 0
            for (weight, task_cpu, task_memory, per_pod), gpu_fit in zip(
                self._tasks, self._slots(model, ordered), strict=True
            ):
                fit = gpu_fit
                if fit < 0 or free_cpu < task_cpu or (check_memory and host_memory < task_memory):
                    continue
                if task_cpu and free_cpu // task_cpu < fit:
                    fit = free_cpu // task_cpu
                if check_memory and task_memory and host_memory // task_memory < fit:
                    fit = host_memory // task_memory
                if fit <= 0 or not per_pod:
                    continue
                if task_cpu:
                    cpu.append((free_cpu - fit * task_cpu, weight * per_pod))
                if check_memory and task_memory:
                    memory.append((host_memory - fit * task_memory, weight * per_pod))
        return _prefix(cpu), _prefix(memory)

    def usable_after(self, model: str, free: Sequence[int], value: int, compute: int) -> float:
        """`usable(model, free)` once `compute` is taken from one GPU with `value` free
        (the same sum up to float rounding): what each task type loses there, grouped by
        GPU demand."""
        ordered = tuple(sorted(free))
        out = self.usable(model, ordered)
        kinds = self._kinds.get(model)
        if kinds is None:
            kinds = self._kinds[model] = self._kinds_for(model)
        key = (model, value, compute)
        single = self._taken.get(key)
        if single is None:
            single = 0.0
            for task_compute, weight in kinds[0]:
                single += weight * (value // task_compute - (value - compute) // task_compute)
            if len(self._taken) >= CACHE_LIMIT:
                self._taken.clear()
            self._taken[key] = single
        out -= single
        for gpus, task_compute, weight in kinds[1]:
            if value >= task_compute > value - compute:  # one GPU fewer has task_compute
                big = len(ordered) - bisect_left(ordered, task_compute)
                out -= weight * (big // gpus - (big - 1) // gpus)
        return out

    def _kinds_for(self, model: str) -> tuple[tuple[tuple[int, float], ...], tuple[_Kind, ...]]:
        """The mix's GPU demand on `model`, popularity x GPU millis per pod summed per kind:
        single-GPU task types per compute, multi-GPU ones per (GPUs, compute)."""
        single: dict[int, float] = {}
        multi: dict[tuple[int, int], float] = {}
        for task, (weight, _, _, per_pod) in zip(self._mix, self._tasks, strict=True):
            if task.gpus <= 0 or task.compute <= 0:
                continue
            if task.models is not None and model not in task.models:
                continue
            if task.gpus == 1:
                single[task.compute] = single.get(task.compute, 0.0) + weight * per_pod
            else:
                kind = (task.gpus, task.compute)
                multi[kind] = multi.get(kind, 0.0) + weight * per_pod
        return tuple(single.items()), tuple((g, c, v) for (g, c), v in multi.items())

    def __call__(
        self, model: str, free_cpu: int, free: Sequence[int], free_memory: int | None
    ) -> float:
        ordered = tuple(sorted(free))
        total = sum(ordered)
        if not total:
            return 0.0
        slots = self._slots(model, ordered)
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


def _prefix(pairs: list[tuple[int, float]]) -> _Losses:
    pairs.sort()
    sums = [0.0]
    for _, value in pairs:
        sums.append(sums[-1] + value)
    return tuple(p[0] for p in pairs), tuple(sums)


def _weight_sum(mix: Sequence[TaskType]) -> float | None:
    """The mix's total weight; None if a weight is negative (then nothing bounds a cost)."""
    if any(t.weight < 0 for t in mix):
        return None
    return sum(t.weight for t in mix)


def _gpu_slots(task: TaskType, model: str, ordered: tuple[int, ...]) -> int:
    """Pods of `task` that GPUs with `ordered` free compute hold; -1 if none can run."""
    if task.gpus == 0 or (task.models is not None and model not in task.models):
        return -1
    if task.gpus == 1:
        return sum(g // task.compute for g in ordered)
    return (len(ordered) - bisect_left(ordered, task.compute)) // task.gpus


@dataclass(frozen=True, slots=True)
class _Profile:
    """A node state as `FragmentationScorer.bounder`'s bounds see it."""

    pool: str
    cpu: int  # free millicores
    memory: int  # free bytes of host memory
    used: bool  # hosts pods
    usable: float  # GPU millis the typical pods could use there, popularity-weighted
    slack: float  # float rounding the bound allows for
    side: tuple[str, tuple[int, ...], tuple[_Gpu, ...]]  # model, free compute, GPUs
    number: int  # the side's number (`FragmentationScorer._sides`)
    cpu_losses: "_Losses"  # what taking CPU at least costs (`_DeepFragmentation.host_losses`)
    memory_losses: "_Losses"  # the same for host memory


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
