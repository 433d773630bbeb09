"""The task mix and the fragmentation measure behind `FragmentationScorer`.

Pure arithmetic, no placement: `task_mix` derives the typical pod shapes and their
popularity from a list of requests; `fragmentation` is the FGD paper's measure (idle GPU
compute the typical pods could not use on a node), optionally deepened (see below);
`DeepFragmentation` computes the deep form bit for bit, faster, and the per-node sums the
scorer's lower bounds need.

For a task type that can run on a node at all (a GPU type, an allowed model, enough free
CPU and host memory for one pod), FGD's measure counts as usable the free compute of the
GPUs that have enough for it (when there are enough such GPUs), and the rest as
fragmented. That is optimistic: of a GPU with 900 free, a 470 pod uses 470, and the 430
it leaves is of use only if a pod that fits in it comes. The deep measure counts what
filling the node with pods of the type would take (whole pods per GPU, whole GPU sets
for multi-GPU types, no more pods than host memory holds), and of the room those pods
would leave, the part the next GPU pod could still use (`Depth`): a partial GPU only a
sharing pod can use, a GPU short of a multi-GPU set any single-GPU pod. The chance
comes from the mix's own popularity, as FGD's weights do, so nothing in it is chosen per
trace: where whole-GPU pods dominate a partial GPU's leftover is mostly lost, where
sharing pods dominate it is mostly used. Free CPU only decides whether a type can run
at all: counted in the filling too, it made the scorer guard CPU at the GPUs' expense
where multi-GPU pods are common. docs/scheduler.md ("Packing") has the measurements.
"""

import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from scheduler.ledger import FULL_GPU as FULL
from scheduler.ledger import Request

COVERAGE: Final = 0.95  # FGD's typical pods: the most frequent specs covering 95 % of pods
CACHE_LIMIT: Final = 200_000  # entries kept per cache before it starts over

Losses = tuple[tuple[int, ...], tuple[float, ...]]  # sorted slacks, loss of taking more
NO_LOSSES: Final[Losses] = ((), (0.0,))
_Side = tuple[int, int]  # pods of a task type some GPUs hold (-1: none can run), FGD's usable
_Single = tuple[int, float, float]  # compute, popularity x GPU millis per pod, popularity
_Kind = tuple[int, int, float, float]  # GPUs, then as `_Single`
# A task type's row of one GPU side (`DeepFragmentation._rows`): the free CPU below which
# it cannot run there (infinite when the GPUs cannot hold it), the host memory below which
# it cannot, the host memory below which that memory holds fewer of its pods than the GPUs
# do, its term when it cannot run, its term when nothing on the host limits it, and what
# the term is computed from when host memory does (weight, GPU millis per pod, FGD's
# usable, depth).
_Row = tuple[float, int, float, float, float, tuple[float, int, int, float]]


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


@dataclass(frozen=True, slots=True)
class Depth:
    """How much of the room a task type's own pods would not fill the deep measure takes
    as lost: the chance that the next GPU pod could not use that room either, from the
    mix's popularity (the same probability FGD weighs its task types with). A
    single-GPU type leaves partial GPUs, which only sharing pods can use: `partial` is
    the whole-GPU pods' part of the GPU pods. A multi-GPU type leaves whole GPUs short
    of a set, which single-GPU pods can use: `whole` is the multi-GPU pods' part."""

    partial: float
    whole: float

    def of(self, task: "TaskType") -> float:
        return self.whole if task.gpus > 1 else self.partial


def depth_of(mix: Sequence["TaskType"]) -> Depth:
    """The mix's `Depth`; a mix without GPU pods loses all of it."""
    gpu = sum(t.weight for t in mix if t.gpus > 0)
    if gpu <= 0:
        return Depth(1.0, 1.0)
    whole = sum(t.weight for t in mix if t.gpus > 0 and t.compute >= FULL)
    multi = sum(t.weight for t in mix if t.gpus > 1)
    return Depth(whole / gpu, multi / gpu)


def fragmentation(
    mix: Sequence[TaskType],
    model: str,
    free_cpu: int,
    free: Sequence[int],
    free_memory: int | None = None,
    *,
    deep: bool = False,
    depth: Depth | None = None,
) -> float:
    """Idle GPU millis that the typical pods could not use on a node with this model, free
    CPU and per-GPU free compute, popularity-weighted. For one task type: the whole idle
    GPU if it cannot run there at all (CPU-only, wrong model, too little CPU, too little
    host memory when `free_memory` is given, fewer than `gpus` GPUs with `compute` free),
    else the idle compute minus what it can use: the free compute of the GPUs with room
    for it (FGD), or with `deep` the blend of that and what pods of the type would fill
    (see the module docstring)."""
    ordered = sorted(free)
    total = sum(ordered)
    if not total:
        return 0.0
    if depth is None:
        depth = depth_of(mix)
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
        wide = _wide(task, ordered)
        if not deep:
            out += task.weight * (total - wide)
            continue
        slots = _gpu_slots(task, model, ordered)
        if free_memory is not None and task.memory:
            slots = min(slots, free_memory // task.memory)
        filled = slots * task.compute * task.gpus
        out += task.weight * (total - usable_part(filled, wide, depth.of(task)))
    return out


def usable_part(filled: int, wide: int, depth: float) -> float:
    """A task type's usable compute on a node: what its pods would fill, and `1 - depth`
    of the rest of what FGD counts (the free compute of the GPUs with room for it)."""
    return depth * filled + (1.0 - depth) * wide


class DeepFragmentation:
    """`fragmentation(mix, ..., deep=True)`, bit for bit, faster: the GPU side (how many
    pods of each task type the GPUs hold, and FGD's usable compute for it) is kept per
    model and free compute, and the per-task sums run over flat tuples in the mix's order
    (the same float operations)."""

    def __init__(self, mix: Sequence[TaskType], depth: Depth | None = None) -> None:
        self._mix = tuple(mix)
        self.depth = depth_of(self._mix) if depth is None else depth
        self._tasks = tuple((t.weight, t.cpu, t.memory, t.compute * t.gpus) for t in mix)
        self._depths = tuple(self.depth.of(t) for t in mix)
        self._gpu_side: dict[tuple[str, tuple[int, ...]], tuple[_Side, ...]] = {}
        self._gpu_rows: dict[tuple[str, tuple[int, ...]], tuple[_Row, ...]] = {}
        self._usable: dict[tuple[str, tuple[int, ...]], float] = {}
        self._kinds: dict[str, tuple[tuple[_Single, ...], tuple[_Kind, ...]]] = {}
        self._taken: dict[tuple[str, int, int], float] = {}

    def _sides(self, model: str, ordered: tuple[int, ...]) -> tuple[_Side, ...]:
        """Per task type: pods its GPUs hold (-1: it cannot run on them), FGD's usable."""
        key = (model, ordered)
        sides = self._gpu_side.get(key)
        if sides is None:
            seen: dict[tuple[object, ...], _Side] = {}  # task types alike on the GPU side
            out: list[_Side] = []
            for task in self._mix:
                kind = (task.gpus, task.compute, task.models is None or model in task.models)
                side = seen.get(kind)
                if side is None:
                    fit = _gpu_slots(task, model, ordered)
                    side = seen[kind] = (fit, _wide(task, ordered) if fit > 0 else 0)
                out.append(side)
            sides = tuple(out)
            if len(self._gpu_side) >= CACHE_LIMIT:
                self._gpu_side.clear()
            self._gpu_side[key] = sides
        return sides

    def usable(self, model: str, free: Sequence[int]) -> float:
        """GPU millis the typical pods could use counting only the GPUs (no CPU or host
        memory limit), popularity-weighted: at least the usable part of any node with
        this model and free compute."""
        ordered = tuple(sorted(free))
        key = (model, ordered)
        value = self._usable.get(key)
        if value is None:
            value = 0.0
            for (weight, _, _, per_pod), (fit, wide), depth in zip(
                self._tasks, self._sides(model, ordered), self._depths, strict=True
            ):
                if fit > 0:
                    value += weight * usable_part(fit * per_pod, wide, depth)
            if len(self._usable) >= CACHE_LIMIT:
                self._usable.clear()
            self._usable[key] = value
        return value

    def host_losses(
        self, model: str, free_cpu: int, free: Sequence[int], free_memory: int | None
    ) -> tuple[Losses, Losses]:
        """On a node in this state, for CPU and for host memory: slacks (how much can be
        taken before a task type loses usable compute), sorted, and the prefix sums of
        what it loses. Taking r loses at least `losses[bisect_left(slacks, r)]`: a type
        whose CPU slack is below r cannot run any more (it loses all it could use); one
        whose memory slack is below r fits one pod fewer (its depth of a pod), or cannot
        run (the rest)."""
        ordered = tuple(sorted(free))
        cpu: list[tuple[int, float]] = []
        memory: list[tuple[int, float]] = []
        if sum(ordered):
            check_memory = free_memory is not None
            host_memory = free_memory or 0
            for (weight, task_cpu, task_memory, per_pod), (gpu_fit, wide), depth in zip(
                self._tasks, self._sides(model, ordered), self._depths, strict=True
            ):
                if (
                    gpu_fit < 0
                    or free_cpu < task_cpu
                    or (check_memory and host_memory < task_memory)
                ):
                    continue
                fit = gpu_fit
                if check_memory and task_memory and host_memory // task_memory < fit:
                    fit = host_memory // task_memory
                if fit <= 0 or not per_pod:
                    continue
                value = weight * usable_part(fit * per_pod, wide, depth)
                if task_cpu:
                    cpu.append((free_cpu - task_cpu, value))
                if check_memory and task_memory:
                    one = weight * depth * per_pod
                    memory.append((host_memory - fit * task_memory, one))
                    memory.append((host_memory - task_memory, max(value - one, 0.0)))
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
        left = value - compute
        key = (model, value, compute)
        single = self._taken.get(key)
        if single is None:
            single = 0.0
            depth, breadth = self.depth.partial, 1.0 - self.depth.partial
            for task_compute, filled, wide in kinds[0]:
                pods = value // task_compute - left // task_compute
                room = (value if value >= task_compute else 0) - (
                    left if left >= task_compute else 0
                )
                single += depth * filled * pods + breadth * wide * room
            if len(self._taken) >= CACHE_LIMIT:
                self._taken.clear()
            self._taken[key] = single
        out -= single
        depth, breadth = self.depth.whole, 1.0 - self.depth.whole
        for gpus, task_compute, filled, wide in kinds[1]:
            if value < task_compute:
                continue  # the GPU had no room for it: nothing changes
            small = bisect_left(ordered, task_compute)
            big = len(ordered) - small
            before = sum(ordered[small:]) if big >= gpus else 0
            if left >= task_compute:
                after = before - compute if big >= gpus else 0
            else:
                after = sum(ordered[small:]) - value if big - 1 >= gpus else 0
                out -= depth * filled * (big // gpus - (big - 1) // gpus)
            out -= breadth * wide * (before - after)
        return out

    def _kinds_for(self, model: str) -> tuple[tuple[_Single, ...], tuple[_Kind, ...]]:
        """The mix's GPU demand on `model`, summed per kind: popularity x GPU millis per
        pod (what its pods fill) and popularity (what FGD counts), single-GPU task types
        per compute, multi-GPU ones per (GPUs, compute)."""
        single: dict[int, tuple[float, float]] = {}
        multi: dict[tuple[int, int], tuple[float, float]] = {}
        for task, (weight, _, _, per_pod) in zip(self._mix, self._tasks, strict=True):
            if task.gpus <= 0 or task.compute <= 0:
                continue
            if task.models is not None and model not in task.models:
                continue
            if task.gpus == 1:
                filled, wide = single.get(task.compute, (0.0, 0.0))
                single[task.compute] = (filled + weight * per_pod, wide + weight)
            else:
                kind = (task.gpus, task.compute)
                filled, wide = multi.get(kind, (0.0, 0.0))
                multi[kind] = (filled + weight * per_pod, wide + weight)
        return (
            tuple((c, f, w) for c, (f, w) in single.items()),
            tuple((g, c, f, w) for (g, c), (f, w) in multi.items()),
        )

    def _rows(self, model: str, ordered: tuple[int, ...]) -> tuple[_Row, ...]:
        """Per task type, in the mix's order, the terms `__call__` adds for GPUs with
        `ordered` free compute, computed once per GPU side by the same float operations:
        what is left to a node's CPU and host memory is which of them applies."""
        key = (model, ordered)
        rows = self._gpu_rows.get(key)
        if rows is None:
            total = sum(ordered)
            rows = tuple(
                (
                    cpu if gpu_fit >= 0 else math.inf,
                    memory,
                    memory * gpu_fit if memory else -math.inf,
                    weight * total,
                    weight * (total - usable_part(gpu_fit * per_pod, wide, depth)),
                    (weight, per_pod, wide, depth),
                )
                for (weight, cpu, memory, per_pod), (gpu_fit, wide), depth in zip(
                    self._tasks, self._sides(model, ordered), self._depths, strict=True
                )
            )
            if len(self._gpu_rows) >= CACHE_LIMIT:
                self._gpu_rows.clear()
            self._gpu_rows[key] = rows
        return rows

    def __call__(
        self, model: str, free_cpu: int, free: Sequence[int], free_memory: int | None
    ) -> float:
        ordered = tuple(sorted(free))
        total = sum(ordered)
        if not total:
            return 0.0
        out = 0.0
        if free_memory is None:
            for cpu, _, _, idle, usable, _ in self._rows(model, ordered):
                out += idle if free_cpu < cpu else usable
            return out
        for cpu, memory, capped, idle, usable, parts in self._rows(model, ordered):
            if free_cpu < cpu or free_memory < memory:
                out += idle
            elif free_memory < capped:  # host memory holds fewer pods than the GPUs
                weight, per_pod, wide, depth = parts
                filled = free_memory // memory * per_pod  # `usable_part`, inlined:
                out += weight * (total - (depth * filled + (1.0 - depth) * wide))
            else:
                out += usable
        return out


def _prefix(pairs: list[tuple[int, float]]) -> Losses:
    pairs.sort()
    sums = [0.0]
    for _, value in pairs:
        sums.append(sums[-1] + value)
    return tuple(p[0] for p in pairs), tuple(sums)


def weight_sum(mix: Sequence[TaskType]) -> float | None:
    """The mix's total weight; None if a weight is negative (then nothing bounds a cost)."""
    if any(t.weight < 0 for t in mix):
        return None
    return sum(t.weight for t in mix)


def _wide(task: TaskType, ordered: Sequence[int]) -> int:
    """FGD's usable compute for `task` on GPUs with `ordered` (ascending) free compute:
    the free compute of the GPUs with room for one of its pods, if there are `gpus` such
    GPUs; else 0."""
    small = bisect_left(ordered, task.compute)
    if len(ordered) - small < task.gpus:
        return 0
    return sum(ordered[small:])


def _gpu_slots(task: TaskType, model: str, ordered: Sequence[int]) -> int:
    """Pods of `task` that GPUs with `ordered` free compute hold; -1 if none can run."""
    if task.gpus == 0 or (task.models is not None and model not in task.models):
        return -1
    if task.gpus == 1:
        return sum(g // task.compute for g in ordered)
    return (len(ordered) - bisect_left(ordered, task.compute)) // task.gpus
