"""The waiting room: the pods that fit on no GPU, what capacity is asked for them, and
when kube-scheduler is asked to try them again.

One owner of the `Waiting` records. The extender hands a pod over when its filter finds
no GPU (`refused`) and takes it back when one is found (`placed`); housekeeping, while
the kube-scheduler beside it leads, adopts the pods kube-scheduler never asked about
(`adopt_unplaceable`) and requeues those a GPU now has room for (`requeue`). What a GPU
for a waiting pod must meet, and the capacity pods themselves, are the capacity
lifecycle's (`scheduler.lifecycle`): the room asks, the lifecycle creates.

Every method runs under the extender's lock, over its cache and reservations; API writes
(requeues) go to its thread pool through `submit`.

- **Refused:** a pod fits on no GPU of the nodes kube-scheduler let it go to. Its record
  names those nodes, the ones it rejected (a node that appears later is not held against
  it) and the key of where a GPU for it may land (`Lifecycle.requirements`); the pool's
  pods waiting with the same key are planned together (`unplaced`).
- **Adopted:** a pod no node can take at all never reaches the extender (a GPU pool
  scaled to zero, a selector no node matches yet); its kube-scheduler verdict
  (`unschedulable`) is read from its status and capacity asked for it likewise.
- **Requeued:** kube-scheduler parks a refused pod until an event its own plugins care
  about; a share freed or a GPU that came is none. So each pod a GPU now has room for is
  asked to try again (`writer.requeue`), as many as the room takes.
- **Forgotten:** once bound, reserved, or deleted (one the informer never showed after
  `WAITING_FORGET` seconds).
"""

import logging
import math
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gpupack.codec import rfc3339
from gpupack.objects import JSON
from gpupack.packing import Allocation
from gpupack.runtime.api import ApiError
from scheduler import writer
from scheduler.cache import Cache
from scheduler.kube import Kube
from scheduler.ledger import Request
from scheduler.manifest import Where
from scheduler.metrics import Metrics
from scheduler.placement import Placement, Scorer, place
from scheduler.reservations import Reservations
from scheduler.translate import pod_key

log = logging.getLogger(__name__)

WAITING_FORGET: float = 60.0  # seconds a waiting pod the informer never showed is kept
REQUEUE_EVERY: float = 2.0  # seconds between two requeues of one pod, at least
# ... and between two with no filter of the pod in between: kube-scheduler has the pod
# queued since the first (in a burst, behind many others), unless it missed the update.
REQUEUE_AGAIN: float = 30.0
# Seconds after its last filter by which kube-scheduler has written its verdict on a pod:
# a verdict that does not name gpupack then is one it reached without the extender.
VERDICT_WRITTEN: float = 5.0
# Seconds after the GPU nodes changed by which kube-scheduler has judged a pod no node
# could take against the new ones: a node event moves it out of its unschedulable queue,
# and its backoff is at most ten seconds (`podMaxBackoffSeconds`).
VERDICT_RENEWED: float = 30.0


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pod that fit on no GPU at its last filter."""

    pool: str
    allocation: Allocation
    nodes: frozenset[str]  # where kube-scheduler would let it go
    since: float
    rejected: frozenset[str] = frozenset()  # the nodes it would not (others are new)
    placement: str = ""  # the key of where a GPU for it may land (`Lifecycle.requirements`)
    gpu_nodes: int = 0  # `Cache.gpu_nodes_changed` when `placement` was judged
    verdict: str | None = None  # kube-scheduler's word when no node was feasible


class CapacityAsker(Protocol):
    """What the room asks of the capacity lifecycle (`scheduler.lifecycle.Lifecycle`)."""

    def requirements(
        self,
        example: JSON,
        pool: str,
        feasible: Collection[str],
        memory: int,
        judged: float | None,
    ) -> Where: ...

    def request(
        self,
        pool: str,
        example: JSON,
        waiting: list[Allocation],
        required: Where,
        feasible: Collection[str] = (),
    ) -> None: ...


def unschedulable(pod: JSON) -> str | None:
    """Why kube-scheduler found no node for the pod (its PodScheduled condition's
    message), or None when it has not said so."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message", ""))
    return None


class WaitingRoom:
    def __init__(
        self,
        kube: Kube,
        cache: Cache,
        reservations: Reservations,
        scorer: Scorer,
        lifecycle: CapacityAsker,
        submit: Callable[..., Any],
        metrics: Metrics | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._cache = cache
        self._reservations = reservations
        self._scorer = scorer
        self._lifecycle = lifecycle
        self._submit = submit
        self._metrics = metrics
        self._wall = wall  # the times other processes read: the API server's clock
        self.entries: dict[str, Waiting] = {}
        self._gpu_nodes_seen = (0, 0.0)  # `Cache.gpu_nodes_changed`, and since when
        self._changed = True  # whether the books changed since the last requeue round
        self._next_round = math.inf  # when a pod asked before may be asked again
        self._requeued: dict[str, float] = {}  # pod -> when it was last requeued

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def books_changed(self) -> None:
        """A share was freed or booked, a GPU came or went: the next `requeue` looks."""
        self._changed = True

    # The extender's verbs.

    def refused(
        self,
        key: str,
        pod: JSON,
        request: Request,
        feasible: frozenset[str],
        now: float,
        *,
        ask: bool = True,
    ) -> None:
        """A pod that fits on no GPU of `feasible`, the nodes kube-scheduler let it go to;
        with `ask`, capacity is asked for it (not while a GPU that will take it starts)."""
        required = self._wait(key, pod, request, feasible, now)
        if ask:
            self._ask_capacity(pod, request, required, feasible, now)

    def placed(self, key: str) -> None:
        self.entries.pop(key, None)

    # Housekeeping.

    def tidy(self, now: float) -> None:
        """Forget the pods that wait no more."""
        for key in [k for k, w in self.entries.items() if not self._still_waiting(k, w, now)]:
            del self.entries[key]
        for key in [k for k in self._requeued if k not in self.entries]:
            del self._requeued[key]

    def adopt_unplaceable(self, now: float) -> None:
        """Ask capacity for pods that no node can take at all: kube-scheduler found none
        feasible, so it never asked the extender (a GPU node pool scaled to zero, a node
        selector no node matches yet). Their GPU may only land on a node that does not
        exist yet, and where their required pod affinity allows: an autoscaler adds one
        if it can. A pod whose last refusal names gpupack was seen by the extender and
        is left to its next filter.

        Such a pod is judged again when the GPU nodes change: a node an autoscaler added
        for it may be one it cannot use either (replicas with required anti-affinity, two
        of them asking at once, one capacity pod for both), and kube-scheduler will not
        ask the extender about it. So is a pod filtered before whose feasible nodes have
        all gone since (kube-scheduler's verdict, written after the filter, names no
        gpupack reason): what it was waiting for, a GPU on those nodes, can no longer
        help it, and would otherwise be kept for it.

        Judged again only once kube-scheduler has judged it against the changed nodes (its
        verdict is new, or `VERDICT_RENEWED` passed): until then its verdict is about the
        nodes before, and a node just added for it, which it can use, would count as one
        it cannot, and its GPU be asked for a second time elsewhere."""
        generation = self._cache.gpu_nodes_changed
        if generation != self._gpu_nodes_seen[0]:
            self._gpu_nodes_seen = (generation, now)
        settled = now - self._gpu_nodes_seen[1] >= VERDICT_RENEWED
        for key, entry in self._cache.pending.items():
            if self._reservations.booked(key):
                continue
            known = self.entries.get(key)
            if known is not None and known.nodes and now - known.since < VERDICT_WRITTEN:
                continue  # kube-scheduler may not have written its verdict on the filter
            if known is not None and not known.nodes and known.gpu_nodes == generation:
                continue
            request = entry.request
            why = unschedulable(entry.pod)
            if not isinstance(request, Request) or why is None or "gpupack:" in why:
                continue
            if known is not None and not known.nodes and why == known.verdict and not settled:
                continue  # kube-scheduler has not judged it against the changed nodes yet
            required = self._wait(key, entry.pod, request, frozenset(), now, why)
            if known is not None and not known.nodes and known.placement == required.key:
                self.entries[key] = replace(self.entries[key], since=known.since)
                continue  # asked for already, with the same requirements
            self._ask_capacity(entry.pod, request, required, (), now)

    def requeue(self, now: float) -> None:
        """Ask kube-scheduler to try again each refused pod that a GPU now has room for:
        a share freed, a reservation expired, a capacity pod became usable. Without it
        kube-scheduler keeps such a pod parked until an event its own plugins care about,
        or its five-minute flush. A pod may go to the nodes kube-scheduler found feasible
        at its last filter and to nodes that were not there then. Only when the books
        changed, and at most once per `REQUEUE_EVERY` seconds per pod.

        Only as many pods as the room takes, the longest waiting first: each one that
        would be placed is booked for the round (and forgotten at its end), so the next
        sees the room it leaves. A pod asked within `REQUEUE_EVERY` holds its room too:
        its filter is coming. (Asking every pod that fits on its own asked thousands of
        pods, a write each, for the room of a few.) A pod asked and not filtered since is
        asked again only after `REQUEUE_AGAIN`: in a burst its filter may be many seconds
        away, behind the pods queued before it, and each request is a write. Such a pod
        sets when the next round comes if nothing changes before: every round places each
        waiting pod under the lock kube-scheduler's filters wait on."""
        if not self._changed and now < self._next_round:
            return
        self._changed, self._next_round = False, math.inf
        snapshot = self._cache.ledger
        promised: list[str] = []
        try:
            for key, waiting in self.entries.items():
                if self._reservations.booked(key):
                    continue
                pod = self._cache.pod(key)
                request = self._cache.request(pod) if pod is not None else None
                if pod is None or not isinstance(request, Request):
                    continue
                nodes = None
                if waiting.rejected:
                    nodes = [n for n in snapshot.nodes if n not in waiting.rejected]
                result = place(snapshot, request, self._scorer, nodes)
                if not isinstance(result, Placement):
                    continue
                snapshot.assume(request, result.node, result.gpus)
                promised.append(key)
                asked = self._requeued.get(key, -REQUEUE_AGAIN)
                again = asked + (REQUEUE_AGAIN if asked >= waiting.since else REQUEUE_EVERY)
                if now < again:
                    self._next_round = min(self._next_round, again)
                    continue
                self._requeued[key] = now
                self._next_round = min(self._next_round, now + REQUEUE_AGAIN)
                self._submit(self._requeue_pod, pod)
        finally:
            for key in promised:
                snapshot.forget(key)

    # Within.

    def _wait(
        self,
        key: str,
        pod: JSON,
        request: Request,
        feasible: frozenset[str],
        now: float,
        verdict: str | None = None,
    ) -> Where:
        """Record a pod that fits on no GPU of `feasible`, the nodes kube-scheduler let it
        go to, with kube-scheduler's `verdict` when no node was (`adopt_unplaceable`);
        the requirements a GPU for it must meet."""
        allocation = Allocation(
            key, request.compute, request.gpu_memory, request.owner, request.exclusive
        )
        # A filter's verdict may predate a node that began taking pods just before: such
        # a node is not held against the pod, here nor when it is requeued.
        judged = now if verdict is None else None
        fresh = set()
        if judged is not None:
            fresh = {n for n in list(self._cache.began) if self._cache.just_began(n, judged)}
        rejected = frozenset(
            n for n in self._cache.ledger.nodes if n not in feasible and n not in fresh
        )
        required = self._lifecycle.requirements(
            pod, request.pool, feasible, request.gpu_memory, judged
        )
        self.entries[key] = Waiting(
            request.pool,
            allocation,
            feasible,
            now,
            rejected,
            required.key,
            self._cache.gpu_nodes_changed,
            verdict,
        )
        return required

    def _ask_capacity(
        self, pod: JSON, request: Request, required: Where, feasible: Collection[str], now: float
    ) -> None:
        unplaced = self._unplaced(request.pool, required.key, now)
        self._lifecycle.request(request.pool, pod, unplaced, required, feasible)

    def _unplaced(self, pool: str, placement: str, now: float) -> list[Allocation]:
        """The pool's pods that fit nowhere at their last filter, still wait, and may use
        GPUs that land where `placement` says, as the planner sees them."""
        return [
            w.allocation
            for key, w in self.entries.items()
            if w.pool == pool and w.placement == placement and self._still_waiting(key, w, now)
        ]

    def _still_waiting(self, key: str, waiting: Waiting, now: float) -> bool:
        """Whether a pod that fit nowhere still waits: unbound, not reserved, and known
        to the informer (or filtered too recently for it to have seen the pod)."""
        pod = self._cache.pod(key)
        if pod is None:
            return now - waiting.since < WAITING_FORGET
        return not (pod.get("spec") or {}).get("nodeName") and not self._reservations.booked(key)

    def _requeue_pod(self, pod: JSON) -> None:
        when = rfc3339(self._wall())  # wall time, not the clock
        try:
            writer.requeue(self._kube, pod, when)
        except ApiError as error:
            log.warning("could not requeue %s: %s", pod_key(pod), error)
            return
        log.debug("requeued", extra={"pod": pod_key(pod)})
        if self._metrics is not None:
            self._metrics.requeued.inc()
