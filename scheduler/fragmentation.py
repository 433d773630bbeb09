"""The task mix and the fragmentation measure behind `FragmentationScorer`.

Pure arithmetic, no placement: `task_mix` derives the typical pod shapes and their
popularity from a list of requests; `fragmentation` is the FGD paper's measure (idle GPU
compute the typical pods could not use on a node), optionally deepened (what filling the
node with each shape would leave idle, limited by CPU and host memory);
`DeepFragmentation` computes the deep form bit for bit, faster, and the per-node sums the
scorer's lower bounds need.
"""

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from scheduler.snapshot import Request

COVERAGE: Final = 0.95  # FGD's typical pods: the most frequent specs covering 95 % of pods
MIX_COVERAGE: Final = 0.99  # what FragmentationScorer is tuned with: rarer multi-GPU specs too
CACHE_LIMIT: Final = 200_000  # entries kept per cache before it starts over

Losses = tuple[tuple[int, ...], tuple[float, ...]]  # sorted slacks, loss of taking more
NO_LOSSES: Final[Losses] = ((), (0.0,))
_Kind = tuple[int, int, float]  # GPUs, compute, popularity x GPU millis per pod


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


class DeepFragmentation:
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
    ) -> tuple[Losses, Losses]:
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


def _gpu_slots(task: TaskType, model: str, ordered: tuple[int, ...]) -> int:
    """Pods of `task` that GPUs with `ordered` free compute hold; -1 if none can run."""
    if task.gpus == 0 or (task.models is not None and model not in task.models):
        return -1
    if task.gpus == 1:
        return sum(g // task.compute for g in ordered)
    return (len(ordered) - bisect_left(ordered, task.compute)) // task.gpus
