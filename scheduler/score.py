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
scores each distinct node state once per pod shape (`PlacementMemo.state_of`).

Speed: a new node state costs a few fragmentation sums over the task mix. They are kept
per (model, free CPU, free memory, free compute) in a bounded cache, and the deep sum
(`DeepFragmentation`) keeps the GPU side per model and free compute, so each sum is one
pass of integer arithmetic over the mix, with the same float additions in the same order
as `fragmentation` (bit-identical, so costs and decisions are too). Placement may skip
a state altogether: `FragmentationScorer.bounder` gives a lower bound on the cost from a
per-state `profile` (usable capacity, what taking CPU or memory at least loses there)
and per-GPU-side sums, a few dictionary lookups where a scoring takes passes over the mix.
"""

import itertools
import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, cast

from scheduler.fragmentation import (
    CACHE_LIMIT,
    NO_LOSSES,
    DeepFragmentation,
    Depth,
    Losses,
    TaskType,
    fragmentation,
    weight_sum,
)
from scheduler.ledger import FULL_GPU, Gpu, Node, Request
from scheduler.placement import Scorer

NODE_WEIGHT: Final = 1e-3  # node fullness only breaks ties between equal GPUs


Slot = tuple[int, bool]  # a GPU as a scorer sees it: free compute, hosts pods
_Gpu = tuple[int, bool, str, int]  # free compute, hosts pods, model, free memory (-1: unknown)


class PackingScorer(Scorer):
    generation: Final = 0
    by_state = True  # the cost depends only on the node's state (see placement)

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
class Weights:
    """How `FragmentationScorer` turns a placement into a cost, in GPU millis. The
    defaults are tuned on the openb trace (benchmarks/openb)."""

    step: float = 40.0  # fragmentation deltas within one step count as equal
    open_gpu: float = 50.0  # taking an idle GPU rather than a partly used one
    open_node: float = 0.25  # starting a node nobody uses
    best_fit: float = 1e-4  # per milli left free on the partly used GPU taken
    host_memory: bool = True  # a task type that lacks host memory cannot use the node
    deep: bool = True  # blend in what filling the node with each task type would take
    depth: Depth | None = None  # the deep measure's depth; None: derived from the mix


class FragmentationScorer(Scorer):
    """Fragmentation delta plus consolidation (see the module docstring)."""

    by_state = True  # the cost depends only on the node's state (see placement)

    def __init__(self, mix: Sequence[TaskType] = (), weights: Weights | None = None) -> None:
        self._mix: tuple[TaskType, ...] = tuple(mix)
        self._weights = weights or Weights()
        self._generation = 0
        self._frag: dict[tuple[object, ...], float] = {}
        self._answers: dict[tuple[object, ...], tuple[float, tuple[Slot, ...]]] = {}
        self._deep = DeepFragmentation(self._mix, self._weights.depth)
        self._weight_sum = weight_sum(self._mix)
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
        self._deep = DeepFragmentation(self._mix, self._weights.depth)
        self._weight_sum = weight_sum(self._mix)
        self._options.clear()

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        model, free, _ = _pool_side(node, request.pool)
        slots_key = ("fit slots", request.gpu_demand)  # `fits` are the node's for it
        fit_slots = cast("tuple[Slot, ...] | None", node.derived.get(slots_key))
        if fit_slots is None:
            fit_slots = node.derived[slots_key] = tuple(sorted([_slot(g) for g in fits]))
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
        model, free, pooled = _pool_side(node, pool)
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
        cpu_losses = memory_losses = NO_LOSSES
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
        (`DeepFragmentation.host_losses`). The consolidation terms are counted exactly."""
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
    cpu_losses: Losses  # what taking CPU at least costs (`DeepFragmentation.host_losses`)
    memory_losses: Losses  # the same for host memory


class _State(NamedTuple):
    """A node as the fragmentation sees it (a tuple: made for every placement weighed)."""

    model: str
    cpu: int  # free millicores
    memory: int | None  # free bytes; None: not considered
    used: bool  # hosts pods


def _pool_side(node: Node, pool: str) -> tuple[str, tuple[int, ...], list[Gpu]]:
    """The model, the free compute (largest first) and the running GPUs of the node's
    `pool`, derived once per version of the node."""
    key = ("pool side", pool)
    side = node.derived.get(key)
    if side is None:
        pooled = [g for g in node.gpus if g.pool == pool and not g.coming]
        model = pooled[0].model if pooled else ""
        free = tuple(sorted([g.free_compute for g in pooled], reverse=True))
        side = node.derived[key] = (model, free, pooled)
    return cast("tuple[str, tuple[int, ...], list[Gpu]]", side)


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
