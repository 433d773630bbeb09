"""One churn replay: the openb pods arrive and leave in time order, on the openb cluster,
through the placement core the extender uses; consolidation off or on.

Each pod arrives at its `creation_time` and leaves at its `deletion_time` (departures
first at equal times). The trace's Pending pods (no `scheduled_time`) never ran and are
left out; a pod that fits nowhere is counted as failed and dropped. Between events the
replay integrates over time:

- GPUs held: a GPU is held while any share sits on it (its capacity pod stays);
- the lower bound: the shares' compute, rounded up to whole GPUs (one pool: the trace
  has no pool metadata; memory is proportional to compute, `trace.MEMORY_NOTE`);
- GPU nodes held (a node with a held GPU) and the fewest nodes whose GPUs reach the
  lower bound (largest nodes first).

Consolidation runs `scheduler.consolidation.plan` `interval` seconds of trace time
after something left (or after a round that moved, or at once when the last round is
that long ago), never between two events of one instant: each move evicts the pods of
one GPU, which placement puts back at once with the GPU draining, as a controller's new
pod would be. The judge is the extender's minus what the trace cannot say (no
controllers, no PDBs: every trace pod counts as its own workload and as movable); the
budget is the policy's default, one eviction per pod per `window`. A recreated pod that
fits nowhere but its old GPU goes back there. A move after which as many GPUs are held
as before (placement put a moved pod on an empty GPU) is counted as wasted.
"""

import bisect
import csv
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from benchmarks.openb import trace
from benchmarks.openb.replay import scorer
from gpupack.policy import Consolidation, ConsolidationMode
from scheduler.consolidation import Move, fill, plan
from scheduler.ledger import Booking, Gpu, Ledger, Request
from scheduler.placement import Placement, Scorer, place

MODES: Final = tuple(ConsolidationMode)
INTERVAL: Final = 60.0  # seconds of trace time between consolidation rounds
HOUR: Final = 3600.0


@dataclass(frozen=True, slots=True)
class Timed:
    pod: trace.TracePod
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ChurnResult:
    workload: str
    policy: str
    mode: str
    pods: int
    failed: int
    gpu_hours: float
    bound_hours: float  # GPU-hours of the lower bound
    gpu_ratio_p95: float
    node_hours: float
    min_node_hours: float
    node_ratio_p95: float
    evictions: int
    wasted_moves: int  # GPUs emptied that left as many GPUs held as before
    hours: float  # trace time with any share held
    seconds: float

    @property
    def gpu_ratio(self) -> float:
        return self.gpu_hours / self.bound_hours if self.bound_hours else 1.0

    @property
    def node_ratio(self) -> float:
        return self.node_hours / self.min_node_hours if self.min_node_hours else 1.0

    @property
    def evictions_per_hour(self) -> float:
        return self.evictions / self.hours if self.hours else 0.0


def read_timed(path: Path) -> list[Timed] | None:
    """The pods that ran, with their times; None when the file has no times (the
    multigpu lists carry five columns)."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if "creation_time" not in (reader.fieldnames or ()):
            return None
        rows = list(reader)
    pods = trace.read_pods(path)
    out: list[Timed] = []
    for pod, row in zip(pods, rows, strict=True):
        if not row.get("scheduled_time") or not row.get("deletion_time"):
            continue
        start, end = int(row["creation_time"]), int(row["deletion_time"])
        if end > start:
            out.append(Timed(pod, start, end))
    return out


class _Ledger:
    """GPUs and nodes held, kept as pods come and go."""

    def __init__(self, snapshot: Ledger, nodes: Sequence[trace.TraceNode]) -> None:
        self._snapshot = snapshot
        self.gpus = 0
        self.compute = 0
        self._node_gpus: dict[str, int] = {}
        sizes = sorted((n.gpus for n in nodes), reverse=True)
        self._prefix = [0]
        for size in sizes:
            self._prefix.append(self._prefix[-1] + size)

    @property
    def nodes(self) -> int:
        return len(self._node_gpus)

    @property
    def bound(self) -> int:
        return math.ceil(self.compute / 1000)

    @property
    def min_nodes(self) -> int:
        return bisect.bisect_left(self._prefix, self.bound)

    def assume(self, request: Request, node: str, uuids: Sequence[str]) -> None:
        before = [self._snapshot.gpus[u].pods for u in uuids]
        self._snapshot.assume(request, node, uuids)
        for uuid, pods in zip(uuids, before, strict=True):
            if pods == 0:
                self._held(self._snapshot.gpus[uuid], +1)
        self.compute += request.compute * len(uuids)

    def forget(self, key: str) -> Booking | None:
        booking = self._snapshot.forget(key)
        if booking is None:
            return None
        for uuid in booking.gpus:
            gpu = self._snapshot.gpus[uuid]
            if gpu.pods == 0:
                self._held(gpu, -1)
        self.compute -= booking.request.compute * len(booking.gpus)
        return booking

    def _held(self, gpu: Gpu, change: int) -> None:
        self.gpus += change
        count = self._node_gpus.get(gpu.node, 0) + change
        if count:
            self._node_gpus[gpu.node] = count
        else:
            del self._node_gpus[gpu.node]


class _Held:
    """The integrals over trace time of what the ledger holds, and its samples."""

    def __init__(self, ledger: _Ledger) -> None:
        self._ledger = ledger
        self.now: float | None = None
        self.gpu_hours = self.bound_hours = self.node_hours = self.min_node_hours = 0.0
        self.busy = 0.0
        self.gpu_samples: list[tuple[float, float]] = []
        self.node_samples: list[tuple[float, float]] = []

    def advance(self, to: float) -> None:
        """Count what is held from the last time to `to`."""
        ledger = self._ledger
        span = to - self.now if self.now is not None else 0.0
        self.now = to
        if span <= 0 or not ledger.bound:
            return
        self.gpu_hours += ledger.gpus * span / HOUR
        self.bound_hours += ledger.bound * span / HOUR
        self.node_hours += ledger.nodes * span / HOUR
        self.min_node_hours += ledger.min_nodes * span / HOUR
        self.busy += span / HOUR
        self.gpu_samples.append((ledger.gpus / ledger.bound, span))
        self.node_samples.append((ledger.nodes / max(1, ledger.min_nodes), span))


Forget = Callable[[str], Booking | None]
Assume = Callable[[Request, str, tuple[str, ...]], object]


def relocate(
    snapshot: Ledger, chooser: Scorer, move: Move, forget: Forget, assume: Assume
) -> list[tuple[Booking, str, tuple[str, ...]]]:
    """Empty one GPU as the cluster would: each pod evicted and placed again at once (its
    controller's new pod) while the GPU drains; a pod that fits nowhere else goes back.
    Each moved pod's old booking, and its new node and GPUs."""
    source = snapshot.gpus[move.gpu]
    source.draining = True
    snapshot.nodes[source.node].touch()
    moved: list[tuple[Booking, str, tuple[str, ...]]] = []
    for key in move.pods:
        booking = forget(key)
        assert booking is not None
        result = place(snapshot, booking.request, chooser)
        node, gpus = (
            (result.node, result.gpus)
            if isinstance(result, Placement)
            else (booking.node, booking.gpus)
        )
        assume(booking.request, node, gpus)
        moved.append((booking, node, gpus))
    source.draining = False
    snapshot.nodes[source.node].touch()
    return moved


def _move(
    snapshot: Ledger,
    ledger: _Ledger,
    chooser: Scorer,
    move: Move,
    moved_at: dict[str, list[float]],
    now: float,
) -> tuple[int, int]:
    """(evictions, 1 if as many GPUs are held after the move as before)."""
    held_before = ledger.gpus
    for booking, _, _ in relocate(snapshot, chooser, move, ledger.forget, ledger.assume):
        moved_at.setdefault(booking.request.key, []).append(now)
    return len(move.pods), int(ledger.gpus >= held_before)


def _p95(samples: list[tuple[float, float]]) -> float:
    """The time-weighted 95th percentile of (value, duration) samples."""
    total = sum(d for _, d in samples)
    if not total:
        return 1.0
    seen = 0.0
    for value, duration in sorted(samples):
        seen += duration
        if seen >= 0.95 * total:
            return value
    return max(v for v, _ in samples)


def replay(
    workload: str,
    policy: str,
    mode: ConsolidationMode,
    nodes: Sequence[trace.TraceNode],
    pods: Sequence[Timed],
    settings: Consolidation | None = None,
    interval: float = INTERVAL,
) -> ChurnResult:
    """Replay `pods` on `nodes` with `policy`'s scorer; `settings` the policy's budget
    (the defaults: one eviction per pod per 600 s)."""
    started = time.perf_counter()
    settings = settings or Consolidation()
    snapshot = trace.snapshot(sorted(nodes, key=lambda n: n.name))
    ledger = _Ledger(snapshot, nodes)
    chooser = scorer(policy, [t.pod for t in pods])
    requests = {i: trace.request(t.pod, i) for i, t in enumerate(pods)}
    events = sorted(
        [(t.end, 0, i) for i, t in enumerate(pods)] + [(t.start, 1, i) for i, t in enumerate(pods)]
    )
    moved_at: dict[str, list[float]] = {}
    window = float(settings.window_seconds)

    def judge(booking: Booking, gpu: Gpu) -> str | None:
        if mode is ConsolidationMode.OFF:
            return "consolidation is off"
        if mode is ConsolidationMode.IDLE and fill(gpu) > settings.idle_below:
            return "GPU not idle"
        at = held.now or 0.0
        recent = [t for t in moved_at.get(booking.request.key, ()) if at - t < window]
        if len(recent) >= settings.evictions:
            return "budget spent"
        return None

    held = _Held(ledger)
    failed = evictions = wasted = 0
    due = math.inf  # when the next consolidation round runs: `interval` after a change
    last_round = -math.inf
    for when, kind, index in events:
        now = float(when)
        # Rounds due before this event run first (never between events of one instant).
        while mode is not ConsolidationMode.OFF and due < now:
            held.advance(due)
            moves = plan(snapshot, judge)
            last_round, due = due, math.inf
            for move in moves:
                made, lost = _move(snapshot, ledger, chooser, move, moved_at, last_round)
                evictions += made
                wasted += lost
            if moves:  # more may follow once these have landed
                due = last_round + interval
        held.advance(now)
        request = requests[index]
        if kind == 0:
            if ledger.forget(request.key) is not None and due == math.inf:
                due = max(now, last_round + interval)
        else:
            result = place(snapshot, request, chooser)
            if isinstance(result, Placement):
                ledger.assume(request, result.node, result.gpus)
            else:
                failed += 1
    return ChurnResult(
        workload,
        policy,
        mode.value,
        len(pods),
        failed,
        held.gpu_hours,
        held.bound_hours,
        _p95(held.gpu_samples),
        held.node_hours,
        held.min_node_hours,
        _p95(held.node_samples),
        evictions,
        wasted,
        held.busy,
        time.perf_counter() - started,
    )
