"""The capacity manager: make sure a pool has a GPU for the pod being admitted.

The pool view comes from two caches (informers): capacity pods (`gpupack-system`, label
`gpupack.io/role=capacity`, pool from their `gpupack.io/pool` label) and fractional pods
(all namespaces, schedulerName `gpupack-scheduler`, pool from their spec). Terminated and
deleting pods do not count. A fractional pod annotated `gpupack.io/capacity-pod` sits on
that GPU; one without it and without a node is waiting for a GPU.

Two things the caches cannot know yet are remembered for `ttl` seconds: reservations
(pods this replica admitted that the watch has not shown yet, keyed by decision id,
dropped as soon as a pod with that `gpupack.io/decision` appears), here per pool, and
capacity pods claimed or created but not yet seen, in `gpupack.runtime.capacity` (which
the scheduler creates capacity with too). Admissions of one pool are serialized by a
lock, so the nine pods a ReplicaSet creates at once count each other.

Nothing here raises into an admission: API failures and bugs become an "error" outcome,
and the pod is admitted anyway (the scheduler creates capacity when nothing fits).
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar

from gpupack import keys
from gpupack.capacity import (
    DEFAULT_IMAGE,
    Allocation,
    Gpu,
    Where,
    capacity_names,
    holding_nodes,
    plan,
)
from gpupack.kube import JSON, annotations_of, labels_of
from gpupack.runtime.capacity import CREATE_BUDGET, CapacityCreator, Created
from gpupack.shares import gpu_memory, is_live, pod_allocation, pool_of
from webhook.decision import CapacityOutcome, Demand
from webhook.kube import KubeClient


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


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool as the planner needs it: GPUs, allocations waiting, names in use."""

    gpus: tuple[Gpu, ...]
    unplaced: tuple[Allocation, ...]
    used_names: frozenset[str]
    new_gpu_memory: int | None


class CapacityManager:
    """Creates capacity pods when a pool lacks room for a new fractional pod."""

    def __init__(
        self,
        client: KubeClient,
        capacity_pods: PodCache,
        fractional_pods: PodCache,
        *,
        image: str = DEFAULT_IMAGE,
        mps_image: str | None = None,
        namespace: str = keys.SYSTEM_NAMESPACE,
        ttl: float = RESERVATION_TTL,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        create_attempts: int = 3,
        create_budget: float = CREATE_BUDGET,
        on_created: Callable[[int], None] | None = None,
    ) -> None:
        self._capacity = capacity_pods
        self._fractional = fractional_pods
        self._ttl = ttl
        self._clock = clock
        self._on_created = on_created
        self._creator = CapacityCreator(
            client,
            namespace=namespace,
            image=image,
            mps_image=mps_image,
            ttl=ttl,
            clock=clock,
            sleep=sleep,
            attempts=create_attempts,
            budget=create_budget,
        )
        self._guard = threading.Lock()
        self._pools: dict[str, _PoolState] = {}

    @property
    def synced(self) -> bool:
        return self._capacity.synced and self._fractional.synced

    def ensure(self, demand: Demand, dry_run: bool) -> CapacityOutcome:
        """`claim`, then create what it claimed (blocking: it may call the API)."""
        claimed = self.claim(demand, dry_run)
        return self.create_claimed(demand, claimed) if claimed.action == "creating" else claimed

    def claim(self, demand: Demand, dry_run: bool) -> CapacityOutcome:
        """Plan without calling the API. When GPUs are missing, reserve the pod and claim
        the capacity pods' names (counted as GPUs on their way from now on), and answer
        "creating" with them; `create_claimed` then creates them, off the admission's path.
        Holds the pool's lock only while planning."""
        state = self._state(demand.pool)
        with state.lock:
            try:
                return self._plan_and_claim(state, demand, dry_run)
            except Exception as exc:  # never into the admission
                log.exception("capacity for pool %s failed", demand.pool)
                detail = f"internal error: {type(exc).__name__}: {exc}"
                return CapacityOutcome("error", detail=detail)

    def create_claimed(self, demand: Demand, claimed: CapacityOutcome) -> CapacityOutcome:
        """Create the capacity pods `claim` answered "creating" for (blocking: API calls).
        Names that could not be created are released, so the next admission plans again."""
        try:
            made = self._creator.create(
                demand.pool,
                claimed.created,
                demand.scheduling,
                created_for=f"{demand.namespace}/{demand.workload}",
                where=Where(packed=tuple(holding_nodes(self._capacity.items()))),
            )
        except Exception as exc:  # a bug: release the claim, never raise
            log.exception("creating capacity for pool %s failed", demand.pool)
            self._creator.release(demand.pool, claimed.created)
            return CapacityOutcome("error", detail=f"internal error: {type(exc).__name__}: {exc}")
        return self._outcome(made, claimed.extra)

    def reservations(self, pool: str) -> dict[str, Allocation]:
        """The live reservations of a pool, by decision id (for tests and debugging)."""
        state = self._state(pool)
        with state.lock:
            self._prune(state, self._clock())
            return {key: r.allocation for key, r in state.reservations.items()}

    def _state(self, pool: str) -> _PoolState:
        with self._guard:
            return self._pools.setdefault(pool, _PoolState())

    def _plan_and_claim(self, state: _PoolState, demand: Demand, dry_run: bool) -> CapacityOutcome:
        now = self._clock()
        if not self.synced:
            if not dry_run:
                self._reserve(state, demand, now)
            return CapacityOutcome(
                "not-synced", detail="the pod caches have not synced yet; created nothing"
            )
        self._prune(state, now)
        view = self._view(state, demand)
        needed = plan(
            view.gpus,
            (*view.unplaced, allocation_of(demand)),
            new_gpu_memory=view.new_gpu_memory,
        )
        extra: JSON = {"pool": demand.pool, "gpus": len(view.gpus), "missing": needed.missing}
        if needed.oversized:  # larger than the pool's known GPUs: a bigger one must come
            extra["oversized"] = list(needed.oversized)
        if needed.missing == 0:
            if not dry_run:
                self._reserve(state, demand, now)
            return CapacityOutcome("sufficient", extra=extra)
        if dry_run:
            names = capacity_names(demand.pool, view.used_names, needed.missing)
            detail = f"would create {len(names)} capacity pod(s): {', '.join(names)}"
            return CapacityOutcome("dry-run", detail=detail, extra=extra)
        self._reserve(state, demand, now)
        names = self._creator.claim(demand.pool, needed.missing, view.used_names)
        return CapacityOutcome("creating", created=names, extra=extra)

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
        seen = [pod["metadata"]["name"] for pod in capacity]
        in_flight = self._creator.in_flight(demand.pool, seen)
        state.held = _reread(state.held, capacity, _holding)
        live = {
            name: held
            for name, pod in zip(seen, capacity, strict=True)
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
            Gpu(name=name, memory=memory, running=running, allocations=tuple(placed[name]))
            for name, (memory, running) in live.items()
        ]
        gpus.extend(Gpu(name=name) for name in in_flight)
        known = [memory for memory, _ in live.values() if memory is not None]
        return PoolView(
            gpus=tuple(gpus),
            unplaced=tuple(unplaced),
            used_names=frozenset(seen) | frozenset(in_flight),
            new_gpu_memory=min(known) if known else None,
        )

    def _outcome(self, made: Created, extra: JSON) -> CapacityOutcome:
        if made.created and self._on_created is not None:
            self._on_created(len(made.created))
        extra = {**extra, "already_existed": list(made.existing)} if made.existing else extra
        if made.failure is not None:
            return CapacityOutcome("error", created=made.created, detail=made.failure, extra=extra)
        if not made.created:
            detail = f"already created by another replica: {', '.join(made.existing)}"
            return CapacityOutcome("sufficient", detail=detail, extra=extra)
        return CapacityOutcome("created", created=made.created, extra=extra)


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
