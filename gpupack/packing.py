"""How many GPUs a pool lacks: two-dimensional first-fit packing of shares onto GPUs.

Pure and standard-library only: part of the contract, because the scheduler (which
creates capacity when a pod fits nowhere), the webhook (which plans at admission, for
its audit line) and `kubectl gpupack` reports must agree. Each turns its caches into
`PlanGpu`s and `Allocation`s and asks how many GPUs the pool lacks: `plan` (the bins
themselves, for reports), `shortfall` (just the count, for the scheduler's scale-up) or a
`Packing` kept between admissions (the webhook's burst path, `webhook.capacity`).

Packing is first-fit-decreasing in two dimensions: compute (millis, 1000 per GPU) and
memory (bytes, checked only where the GPU's memory is known; the exporter writes it on
the capacity pod). An exclusive allocation (`real-time-mps`) shares a GPU only with
allocations of the same workload. The result depends only on the values, never on the
order they arrive in, so every replica computes the same answer.
"""

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

FULL_GPU: Final = 1000  # compute millis in one GPU

_UNBOUNDED: Final = 1 << 30


@dataclass(frozen=True, slots=True)
class Allocation:
    """One fractional pod's share: placed on a GPU, pending, or about to be admitted."""

    key: str  # unique: the decision id or the pod's namespace/name
    compute: int  # millis of one GPU
    memory: int  # bytes
    owner: str  # "namespace/Kind/name" of the workload
    exclusive: bool = False  # real-time-mps: shares a GPU only with the same owner


@dataclass(frozen=True, slots=True)
class PlanGpu:
    """A capacity pod: one whole GPU, running or pending, and what is already on it."""

    name: str
    memory: int | None = None  # bytes; None until the exporter reports the device
    running: bool = False
    allocations: tuple[Allocation, ...] = ()


@dataclass(frozen=True, slots=True)
class Bin:
    """A GPU in the packing: an existing capacity pod (`name`) or one to create (None)."""

    name: str | None
    memory: int | None
    allocations: tuple[Allocation, ...]

    @property
    def compute_used(self) -> int:
        return sum(a.compute for a in self.allocations)

    @property
    def memory_used(self) -> int:
        return sum(a.memory for a in self.allocations)


@dataclass(frozen=True, slots=True)
class Plan:
    bins: tuple[Bin, ...]
    oversized: tuple[str, ...] = ()  # keys of allocations larger than the assumed new GPU

    @property
    def missing(self) -> int:
        """How many capacity pods to create."""
        return sum(1 for b in self.bins if b.name is None)


@dataclass(slots=True)
class _OpenBin:
    name: str | None
    memory: int | None
    allocations: list[Allocation] = field(default_factory=list)
    compute_used: int = 0
    memory_used: int = 0
    owners: set[str] = field(default_factory=set)
    exclusive_owner: str | None = None

    def fits(self, a: Allocation) -> bool:
        if self.compute_used + a.compute > FULL_GPU:
            return False
        if self.memory is not None and self.memory_used + a.memory > self.memory:
            return False
        if self.exclusive_owner is not None and self.exclusive_owner != a.owner:
            return False
        return not (a.exclusive and self.owners - {a.owner})

    def add(self, a: Allocation) -> None:
        self.add_run([a])

    def add_run(self, run: list[Allocation]) -> None:
        """Add allocations of one shape (`_shape`): the sums grow by one multiple, not
        one allocation at a time (a burst of a workload is hundreds of them)."""
        if not run:
            return
        first = run[0]
        self.allocations.extend(run)
        self.compute_used += first.compute * len(run)
        self.memory_used += first.memory * len(run)
        if first.exclusive:
            self.owners.add(first.owner)
            self.exclusive_owner = first.owner
        else:
            self.owners.update(a.owner for a in run)

    def room_for(self, a: Allocation) -> int:
        """How many more allocations shaped like `a` fit (the same answer `fits` gives
        one at a time)."""
        if self.exclusive_owner is not None and self.exclusive_owner != a.owner:
            return 0
        if a.exclusive and self.owners - {a.owner}:
            return 0
        count = (FULL_GPU - self.compute_used) // a.compute if a.compute > 0 else _UNBOUNDED
        if self.memory is not None and a.memory > 0:
            count = min(count, (self.memory - self.memory_used) // a.memory)
        return max(count, 0)

    def freeze(self) -> Bin:
        return Bin(self.name, self.memory, tuple(self.allocations))


def _decreasing(a: Allocation) -> tuple[int, int, str, str]:
    return (-a.compute, -a.memory, a.owner, a.key)


def _shape(a: Allocation) -> tuple[int, int, bool, str]:
    """Allocations that pack alike. The owner matters only to exclusive (MPS) ones; for
    the rest it matters only at GPUs an MPS workload holds (see `_fill`)."""
    return (a.compute, a.memory, a.exclusive, a.owner if a.exclusive else "")


def _fill(open_bin: _OpenBin, pending: list[Allocation]) -> list[Allocation]:
    """Put as many of `pending` (one shape, in order) on `open_bin` as fit, first ones
    first, the way first fit one at a time would; return the rest."""
    owner = open_bin.exclusive_owner
    if owner is None or pending[0].exclusive:
        room = open_bin.room_for(pending[0])
        open_bin.add_run(pending[:room])
        return pending[room:]
    # A GPU held by an MPS workload takes only that workload's pods.
    eligible = [i for i, a in enumerate(pending) if a.owner == owner]
    if not eligible:
        return pending
    taken = set(eligible[: open_bin.room_for(pending[eligible[0]])])
    open_bin.add_run([pending[index] for index in sorted(taken)])
    return [a for i, a in enumerate(pending) if i not in taken]


def plan(
    gpus: Sequence[PlanGpu], unplaced: Iterable[Allocation], *, new_gpu_memory: int | None
) -> Plan:
    """Pack `unplaced` onto `gpus` (first fit, largest first), opening new GPUs as needed.

    New GPUs are assumed to have `new_gpu_memory` bytes (None: unknown, check compute only).
    An allocation too large for that gets a new GPU of unknown memory to itself and is
    reported in `oversized`.
    """
    bins: list[_OpenBin] = []
    for gpu in sorted(gpus, key=lambda g: (not g.running, g.name)):
        open_bin = _OpenBin(gpu.name, gpu.memory)
        for allocation in gpu.allocations:
            open_bin.add(allocation)
        bins.append(open_bin)
    oversized: list[str] = []
    # First-fit decreasing, a run of equal shapes at a time: first fit of k identical
    # allocations fills each bin with as many as fit, in bin order. A burst of one
    # workload's pods is one run, so this is O(runs x bins + n), not O(n x bins).
    for _, run in itertools.groupby(sorted(unplaced, key=_decreasing), key=_shape):
        pending = list(run)
        for open_bin in bins:
            if not pending:
                break
            pending = _fill(open_bin, pending)
        while pending:
            target = _OpenBin(None, new_gpu_memory)
            if not target.fits(pending[0]):
                target = _OpenBin(None, None)
                oversized.append(pending[0].key)
            room = max(target.room_for(pending[0]), 1)
            target.add_run(pending[:room])
            pending = pending[room:]
            bins.append(target)
    return Plan(tuple(b.freeze() for b in bins), tuple(oversized))


@dataclass(frozen=True, slots=True)
class Shortfall:
    """What `plan` says a pool lacks, without its bins."""

    missing: int  # capacity pods to create
    oversized: tuple[str, ...] = ()  # as `Plan.oversized`


@dataclass(slots=True)
class _Group:
    """`count` GPUs in one state: the sums of what they hold, and their memory."""

    count: int
    used: int
    used_memory: int
    size: int | None

    def room(self, compute: int, memory: int) -> int:
        return _room(self.used, self.used_memory, self.size, compute, memory)

    def taking(self, count: int, pods: int, compute: int, memory: int) -> "_Group":
        return _Group(
            count, self.used + pods * compute, self.used_memory + pods * memory, self.size
        )


def shortfall(
    gpus: Sequence[PlanGpu], unplaced: Iterable[Allocation], *, new_gpu_memory: int | None
) -> Shortfall:
    """`plan(...)`'s `missing` and `oversized`, at the cost of the pool's distinct shapes
    and GPUs rather than of its allocations: the webhook asks it for every admission, of
    pools that can hold hundreds of waiting pods. GPUs to create are kept as groups of
    equal ones (first fit fills the first of a group before the next, so a group splits
    into at most three), never one by one. Where a real-time-mps allocation is involved
    (owners then matter) it asks `plan` itself. A property test holds it to `plan`."""
    unplaced = list(unplaced)
    packing = Packing.of(gpus, new_gpu_memory)
    if packing is None or any(a.exclusive for a in unplaced):
        result = plan(gpus, unplaced, new_gpu_memory=new_gpu_memory)
        return Shortfall(result.missing, result.oversized)
    packing.fit(unplaced)
    return Shortfall(packing.missing, tuple(packing.oversized))


@dataclass(slots=True)
class Packing:
    """A pool's GPUs as `shortfall` packs them: groups of equal GPUs, those held (first
    fit's order: running first, then by name) and those to create. `fit` packs more
    allocations onto them, first fit decreasing within its own allocations only: a
    packing fitted twice may take a GPU more than one packed once with both sets (the
    webhook's estimate between two full plans, `webhook.capacity`)."""

    held: list[_Group]
    created: list[_Group]
    new_gpu_memory: int | None
    oversized: list[str]

    @classmethod
    def of(cls, gpus: Sequence[PlanGpu], new_gpu_memory: int | None) -> "Packing | None":
        """The packing of `gpus` with nothing to fit yet; None where a GPU holds a
        real-time-mps allocation (owners matter then: only `plan` packs it)."""
        if any(a.exclusive for g in gpus for a in g.allocations):
            return None
        held = [
            _Group(
                1,
                sum(a.compute for a in g.allocations),
                sum(a.memory for a in g.allocations),
                g.memory,
            )
            for g in sorted(gpus, key=lambda g: (not g.running, g.name))
        ]
        return cls(held, [], new_gpu_memory, [])

    @property
    def missing(self) -> int:
        return sum(g.count for g in self.created)

    def copy(self) -> "Packing":
        """Another packing in the same state (groups are never changed, only replaced)."""
        return Packing(
            list(self.held), list(self.created), self.new_gpu_memory, list(self.oversized)
        )

    def fit(self, unplaced: Sequence[Allocation]) -> None:
        """Pack `unplaced` (none of them real-time-mps), largest shape first, onto the GPUs
        held, then those to create, then onto new ones."""
        created = self.created
        shapes = Counter((a.compute, a.memory) for a in unplaced)
        for (compute, memory), count in sorted(shapes.items(), key=lambda s: (-s[0][0], -s[0][1])):
            n = count
            for bins in (self.held, created):
                index = 0
                while n and index < len(bins):
                    group = bins[index]
                    room = group.room(compute, memory)
                    if not room:
                        index += 1
                        continue
                    full = min(group.count, n // room)
                    rest = n - full * room if full < group.count else 0
                    parts = [
                        group.taking(full, room, compute, memory),
                        group.taking(1 if rest else 0, rest, compute, memory),
                        group.taking(group.count - full - (1 if rest else 0), 0, compute, memory),
                    ]
                    parts = [p for p in parts if p.count]
                    bins[index : index + 1] = parts
                    index += len(parts)
                    n -= full * room + rest
            if not n:
                continue
            new_gpu_memory = self.new_gpu_memory
            too_large = _room(0, 0, new_gpu_memory, compute, memory) == 0  # for the assumed GPU
            size = None if too_large else new_gpu_memory
            room = max(_room(0, 0, size, compute, memory), 1)
            if too_large:  # each GPU created for them names its first
                run = sorted(
                    (a for a in unplaced if (a.compute, a.memory) == (compute, memory)),
                    key=_decreasing,
                )
                self.oversized += [a.key for a in run[count - n :: room]]
            empty = _Group(0, 0, 0, size)
            if n // room:
                created.append(empty.taking(n // room, room, compute, memory))
            if n % room:
                created.append(empty.taking(1, n % room, compute, memory))


def _room(used: int, used_memory: int, size: int | None, compute: int, memory: int) -> int:
    """How many allocations of (`compute`, `memory`) a GPU with these sums still takes:
    `_OpenBin.room_for` for allocations of no real-time-mps workload."""
    count = (FULL_GPU - used) // compute if compute > 0 else _UNBOUNDED
    if size is not None and memory > 0:
        count = min(count, (size - used_memory) // memory)
    return max(count, 0)
