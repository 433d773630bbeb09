"""The capacity planner: what a pool lacks for the pod being admitted, for the audit log.

The webhook creates no capacity pods: gpupack-scheduler alone does, when it places a pod
and no GPU it may use has room (one writer, so capacity stays bounded however many
webhook replicas admit a burst, and every capacity pod is made knowing where the pod may
run). At admission the webhook only plans, so the audit line says whether the pool's
GPUs (held and coming) hold the new pod too, or how many more it needs.

The pool view comes from two caches (informers): capacity pods (`gpupack-system`, label
`gpupack.io/role=capacity`, pool from their `gpupack.io/pool` label) and fractional pods
(all namespaces, schedulerName `gpupack-scheduler`, pool from their spec). Terminated and
deleting pods do not count. A fractional pod annotated `gpupack.io/capacity-pod` sits on
that GPU; one without it and without a node is waiting for a GPU.

Pods this replica admitted that the watch has not shown yet are remembered for `ttl`
seconds as reservations (keyed by decision id, dropped as soon as a pod with that
`gpupack.io/decision` appears), so the nine pods a ReplicaSet creates at once count each
other. Admissions of one pool are serialized by a lock.

A full plan reads the whole pool, so a burst into one pool would cost a read of the
whole, growing pool per admission. Within `PLAN_REUSE` seconds of a pool's last full
plan, an admission is fitted onto that plan's GPUs, with the pods admitted since
(`gpupack.packing.Packing`): no pool read. Its answer is the full plan's, give or take
a GPU (first fit in arrival order rather than largest first, and pods bound or deleted
in the last `PLAN_REUSE` seconds not seen yet). Pools with real-time-mps pods are
planned in full every time.

Nothing here raises into an admission: bugs become an "error" outcome, and the pod is
admitted anyway.
"""

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar, cast

from gpupack import keys
from gpupack.objects import JSON, PodSpec, annotations_of, labels_of
from gpupack.packing import Allocation, Packing, PlanGpu, Shortfall, shortfall
from gpupack.pool import scheduling_metadata
from gpupack.shares import gpu_memory, is_live, pod_allocation, pool_of
from webhook.decision import CapacityOutcome, Demand


def allocation_of(demand: Demand) -> Allocation:
    """The share an admitted pod's demand will hold, for the planner."""
    return Allocation(
        key=demand.decision_id,
        compute=demand.compute,
        memory=demand.memory,
        owner=f"{demand.namespace}/{demand.workload}",
        exclusive=demand.exclusive,
    )


log = logging.getLogger(__name__)
T = TypeVar("T")
_Memo = dict[int, tuple[JSON, T]]

POOL_INDEX: Final = "pool"
DECISION_INDEX: Final = "decision"
RESERVATION_TTL: Final = 60.0
# Seconds a pool's full plan is reused: the pods admitted meanwhile are fitted onto it.
PLAN_REUSE: Final = 0.2

# What a fractional pod adds to its pool: its allocation and the capacity pod it sits on
# ("" while it waits for one); None when it adds nothing (finished, deleting, annotations
# that do not parse, or on a node but not on any GPU of this pool).
_Seat = tuple[str, Allocation] | None
# What a capacity pod adds: None when finished or deleting, else its GPU's memory (None:
# unknown) and whether it runs.
_Held = tuple[int | None, bool] | None


class PodCache(Protocol):
    """What the manager reads from an informer."""

    @property
    def synced(self) -> bool: ...

    def by_index(self, index: str, value: str) -> list[JSON]: ...

    def items(self) -> list[JSON]: ...


# What the two pod caches keep of each pod (see webhook.cluster): the fields the indexers
# below, `_seat` and `_holding` read, and nothing else. In a cluster of 10,000 shares the
# webhook would otherwise keep 10,000 whole pods (containers, volumes, statuses) to read
# a dozen fields of each. A field read here must be kept here: one dropped reads as absent.
KEPT_METADATA: Final = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generateName",
    "labels",
    "annotations",
    "ownerReferences",
    "deletionTimestamp",
)


def planned(pod: JSON) -> JSON:
    """What capacity planning reads of `pod`: a new object of `KEPT_METADATA`, the
    scheduling fields its pool key is made of (`scheduling_metadata` itself, so the key
    of the kept pod is the pod's), where it is, and its phase."""
    meta = pod.get("metadata") or {}
    spec = cast(PodSpec, pod.get("spec") or {})
    kept_spec: JSON = scheduling_metadata(spec)
    for name in ("nodeName", "schedulerName"):
        if name in spec:
            kept_spec[name] = spec[name]
    kept: JSON = {
        "metadata": {name: meta[name] for name in KEPT_METADATA if name in meta},
        "spec": kept_spec,
    }
    phase = (pod.get("status") or {}).get("phase")
    if phase is not None:
        kept["status"] = {"phase": phase}
    return kept


# Indexers for the two informers (see webhook.cluster).


def capacity_pool(pod: JSON) -> list[str]:
    pool = labels_of(pod).get(keys.POOL)
    return [pool] if pool else []


def fractional_pool(pod: JSON) -> list[str]:
    return [pool_of(pod)]


def decision_of(pod: JSON) -> list[str]:
    decision = annotations_of(pod).get(keys.DECISION)
    return [decision] if decision else []


@dataclass(slots=True)
class _Reservation:
    allocation: Allocation
    expires: float


@dataclass(slots=True)
class _PoolState:
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while planning only
    reservations: dict[str, _Reservation] = field(default_factory=dict)  # by decision id
    # What the last view read of each of the pool's pods, by id() of the informer's object,
    # with the object: an informer replaces an object on every change, so the same object
    # means "read already". Each view keeps only the pods it saw (see `_view`).
    seats: "_Memo[_Seat]" = field(default_factory=dict)
    held: "_Memo[_Held]" = field(default_factory=dict)
    # The last full plan's GPUs with the pods admitted since fitted on (None: plan in full
    # next time), when it was made, and how many GPUs the pool had then.
    packing: Packing | None = None
    planned_at: float = -math.inf
    gpus: int = 0


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool as the planner needs it: GPUs and allocations waiting."""

    gpus: tuple[PlanGpu, ...]
    unplaced: tuple[Allocation, ...]
    new_gpu_memory: int | None


class CapacityManager:
    """Plans, for each admission, whether its pool's GPUs hold the new pod."""

    def __init__(
        self,
        capacity_pods: PodCache,
        fractional_pods: PodCache,
        *,
        ttl: float = RESERVATION_TTL,
        clock: Callable[[], float] = time.monotonic,
        reuse: float = PLAN_REUSE,
    ) -> None:
        self._capacity = capacity_pods
        self._fractional = fractional_pods
        self._ttl = ttl
        self._reuse = reuse
        self._clock = clock
        self._guard = threading.Lock()
        self._pools: dict[str, _PoolState] = {}

    @property
    def synced(self) -> bool:
        return self._capacity.synced and self._fractional.synced

    def plan(self, demand: Demand, dry_run: bool) -> CapacityOutcome:
        """Plan the pod's pool with the pod in it (no API call): "sufficient", or "needed"
        with how many GPUs it lacks. Unless `dry_run`, the pod is reserved, so the next
        admissions of the pool count it. Holds the pool's lock while planning."""
        state = self._state(demand.pool)
        with state.lock:
            try:
                return self._plan(state, demand, dry_run)
            except Exception as exc:  # never into the admission
                log.exception("capacity for pool %s failed", demand.pool)
                detail = f"internal error: {type(exc).__name__}: {exc}"
                return CapacityOutcome("error", detail=detail)

    def reservations(self, pool: str) -> dict[str, Allocation]:
        """The live reservations of a pool, by decision id (for tests and debugging)."""
        state = self._state(pool)
        with state.lock:
            self._prune(state, self._clock())
            return {key: r.allocation for key, r in state.reservations.items()}

    def _state(self, pool: str) -> _PoolState:
        with self._guard:
            return self._pools.setdefault(pool, _PoolState())

    def _plan(self, state: _PoolState, demand: Demand, dry_run: bool) -> CapacityOutcome:
        now = self._clock()
        if not dry_run:
            self._reserve(state, demand, now)
        if not self.synced:
            return CapacityOutcome("not-synced", detail="the pod caches have not synced yet")
        allocation = allocation_of(demand)
        packing = state.packing
        if packing is not None and now - state.planned_at < self._reuse and not demand.exclusive:
            packing = packing.copy()  # a dry run leaves the pool's as it is
            packing.fit([allocation])
            needed, gpus = Shortfall(packing.missing, tuple(packing.oversized)), state.gpus
        else:
            self._prune(state, now)
            view = self._view(state, demand)
            unplaced = (*view.unplaced, allocation)
            packing = Packing.of(view.gpus, view.new_gpu_memory)
            if packing is None or any(a.exclusive for a in unplaced):
                packing = None  # real-time-mps: owners matter, only `plan` packs it
                needed = shortfall(view.gpus, unplaced, new_gpu_memory=view.new_gpu_memory)
            else:
                packing.fit(unplaced)
                needed = Shortfall(packing.missing, tuple(packing.oversized))
            gpus = len(view.gpus)
            if not dry_run:
                state.planned_at = now
        if not dry_run:
            state.packing, state.gpus = packing, gpus
        extra: JSON = {"pool": demand.pool, "gpus": gpus, "missing": needed.missing}
        if needed.oversized:  # larger than the pool's known GPUs: a bigger one must come
            extra["oversized"] = list(needed.oversized)
        if needed.missing == 0:
            return CapacityOutcome("sufficient", extra=extra)
        detail = (
            f"the pool lacks {needed.missing} GPU(s); gpupack-scheduler creates the capacity "
            "pods when it places the pod"
        )
        return CapacityOutcome("needed", detail=detail, extra=extra)

    def _reserve(self, state: _PoolState, demand: Demand, now: float) -> None:
        state.reservations[demand.decision_id] = _Reservation(
            allocation_of(demand), now + self._ttl
        )

    def _prune(self, state: _PoolState, now: float) -> None:
        """Forget reservations whose pod is visible or that expired."""
        for decision, reservation in list(state.reservations.items()):
            if reservation.expires <= now or self._fractional.by_index(DECISION_INDEX, decision):
                del state.reservations[decision]

    def _view(self, state: _PoolState, demand: Demand) -> PoolView:
        """The pool from the caches. Every admission reads the whole pool, so each pod is
        read once per version of it (`_seat`, `_holding`): the rest is a pass of lookups."""
        capacity = self._capacity.by_index(POOL_INDEX, demand.pool)
        state.held = _reread(state.held, capacity, _holding)
        live = {
            pod["metadata"]["name"]: held
            for pod in capacity
            if (held := state.held[id(pod)][1]) is not None
        }
        placed: dict[str, list[Allocation]] = {name: [] for name in live}
        unplaced: list[Allocation] = []
        fractional = self._fractional.by_index(POOL_INDEX, demand.pool)
        state.seats = _reread(state.seats, fractional, _seat)
        for entry in state.seats.values():
            if entry[1] is None:
                continue
            host, allocation = entry[1]
            if not host:
                unplaced.append(allocation)
            elif host in placed:  # else: a GPU this pool no longer has
                placed[host].append(allocation)
        for decision, reservation in state.reservations.items():
            if decision != demand.decision_id:
                unplaced.append(reservation.allocation)
        gpus = [
            PlanGpu(name=name, memory=memory, running=running, allocations=tuple(placed[name]))
            for name, (memory, running) in live.items()
        ]
        known = [memory for memory, _ in live.values() if memory is not None]
        return PoolView(
            gpus=tuple(gpus),
            unplaced=tuple(unplaced),
            new_gpu_memory=min(known) if known else None,
        )


def _seat(pod: JSON) -> _Seat:
    allocation = pod_allocation(pod) if is_live(pod) else None
    if allocation is None:
        return None
    host = annotations_of(pod).get(keys.CAPACITY_POD)
    if host is None:
        return None if (pod.get("spec") or {}).get("nodeName") else ("", allocation)
    return host, allocation


def _holding(pod: JSON) -> _Held:
    if not is_live(pod):
        return None
    return gpu_memory(pod), (pod.get("status") or {}).get("phase") == "Running"


def _reread(memo: "_Memo[T]", pods: list[JSON], read: Callable[[JSON], T]) -> "_Memo[T]":
    """`read` of each of `pods`, in their order, from `memo` where the object is the same:
    a new memo of these pods only, so a pod gone from the pool is forgotten."""
    out: _Memo[T] = {}
    for pod in pods:
        entry = memo.get(id(pod))
        out[id(pod)] = entry if entry is not None and entry[0] is pod else (pod, read(pod))
    return out
