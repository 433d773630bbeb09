"""The scheduling loop: queue, cycle, bind, capacity lifecycle.

One thread owns the cache and the snapshot. Each pass folds informer changes in, takes
the results of finished binds, tries every queued pod whose backoff has passed (by
priority, then age), asks for capacity for the pools where pods fit nowhere, and every
few seconds does housekeeping. API writes run on a small thread pool and report back; the loop
forgets an assumption whose bind failed, so a pod is booked only where it is bound.

The capacity rules (the last three below) are carried out by `scheduler.lifecycle`.

- **Backoff** per pod: 1, 2, 4 ... 30 s after each failed attempt, reset when GPUs,
  nodes or freed shares change (something that could make it fit).
- **Unschedulable:** PodScheduled=False and a FailedScheduling Event, written again
  only when the message changes; then capacity for the pool: the first-fit plan of the
  pool's waiting pods over its coming GPUs says how many capacity pods are missing, and
  they are created under deterministic names (a retry or a racing webhook collides).
- **Scale down:** a capacity pod with nothing booked on its GPU, in a pool with no
  waiting pods, for `grace_period` seconds is deleted (uid and resourceVersion
  preconditions). One hosting pods carries the autoscalers' do-not-evict annotations.
- **Orphans:** a pod bound to a GPU that no capacity pod holds any more (someone
  deleted it, its node went away) gets a Warning Event and is evicted through the
  Eviction API after `orphan_grace` seconds: its controller recreates it and the new pod
  is placed on a GPU that is held. Nothing keeps running on a GPU nobody accounts for.
"""

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from gpupack.capacity import Allocation
from gpupack.kube import JSON
from gpupack.quantity import format_compute, format_memory
from gpupack.runtime.api import ApiError
from scheduler import writer
from scheduler.cache import Cache, Pending
from scheduler.fragmentation import task_mix
from scheduler.kube import Kube
from scheduler.ledger import NotOurs
from scheduler.lifecycle import Lifecycle
from scheduler.metrics import Metrics, Usage
from scheduler.placement import Placement, Scorer, Unfit, place
from scheduler.score import FragmentationScorer
from scheduler.settings import Settings
from scheduler.snapshot import Request

log = logging.getLogger(__name__)

BACKOFF_BASE: Final = 1.0
BACKOFF_CAP: Final = 30.0


@dataclass(slots=True)
class _Waiting:
    first_seen: float
    attempts: int = 0
    not_before: float = 0.0
    reported: str = ""  # the last unschedulable message written on the pod


class Scheduler:
    def __init__(
        self,
        kube: Kube,
        cache: Cache,
        scorer: Scorer,
        settings: Settings,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self.cache = cache
        self._scorer = scorer
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="api-write")
        self._results: collections.deque[tuple[str, ApiError | None]] = collections.deque()
        self._waiting: dict[str, _Waiting] = {}
        self._lifecycle = Lifecycle(kube, cache, settings, self._pool.submit, metrics)
        self._next_housekeeping = 0.0
        self._seen_topology = -1
        self._seen_freed = -1
        self.leading = False
        self.usage = Usage(0, 0, 0, 0, 0, leader=False)  # refreshed by housekeeping

    # The loop.

    def run(self, stop: threading.Event) -> None:
        """Schedule until `stop` is set. The caches must have synced."""
        self.leading = True
        try:
            while not stop.is_set():
                delay = self.cycle()
                self.cache.dirty.wake.wait(delay)
        finally:
            self.leading = False
            self.usage = self._measure()
            self._pool.shutdown(wait=True, cancel_futures=False)

    def cycle(self) -> float:
        """One pass; returns how long the loop may sleep if nothing changes."""
        now = self._clock()
        self.cache.refresh()
        self._take_results()
        self._track_pending(now)
        unfit_pools: dict[str, JSON] = {}
        for key in self._ready(now):
            entry = self.cache.pending.get(key)
            if entry is not None:
                self._schedule_one(key, entry, now, unfit_pools)
        for pool, pod in unfit_pools.items():
            self._lifecycle.request(pool, pod, self._unplaced(pool))
        if now >= self._next_housekeeping:
            self._lifecycle.housekeeping(now)
            self._refresh_mix()
            self.usage = self._measure()
            self._next_housekeeping = now + self._settings.housekeeping_interval
        waits = [w.not_before - now for w in self._waiting.values() if w.not_before > now]
        return max(0.01, min([self._settings.housekeeping_interval, *waits]))

    def _track_pending(self, now: float) -> None:
        for key in [k for k in self._waiting if k not in self.cache.pending]:
            del self._waiting[key]
        for key in self.cache.pending:
            if key not in self._waiting:
                self._waiting[key] = _Waiting(first_seen=now)
        snapshot = self.cache.snapshot
        if (snapshot.topology, snapshot.freed) != (self._seen_topology, self._seen_freed):
            self._seen_topology, self._seen_freed = snapshot.topology, snapshot.freed
            for waiting in self._waiting.values():
                waiting.not_before = 0.0  # something changed that could make it fit

    def _ready(self, now: float) -> list[str]:
        """Pods whose backoff has passed: higher priority first, then oldest first (the
        order of kube-scheduler's active queue)."""
        pending = self.cache.pending
        ready = [
            (-int((pending[key].pod.get("spec") or {}).get("priority") or 0), w.first_seen, key)
            for key, w in self._waiting.items()
            if w.not_before <= now and key not in self.cache.assumed and key in pending
        ]
        return [key for _, _, key in sorted(ready)]

    # One pod.

    def _schedule_one(self, key: str, entry: Pending, now: float, unfit: dict[str, JSON]) -> None:
        waiting = self._waiting[key]
        pod, request = entry.pod, entry.request
        if isinstance(request, NotOurs):
            self._unschedulable(key, pod, waiting, request.reason, request.message, now)
            waiting.not_before = float("inf")  # until the pod changes
            return
        result = place(self.cache.snapshot, request, self._scorer)
        if isinstance(result, Unfit):
            self._unschedulable(key, pod, waiting, "Unschedulable", result.message, now)
            unfit.setdefault(request.pool, pod)
            return
        self._assume_and_bind(key, pod, request, result, waiting, now)

    def _assume_and_bind(
        self,
        key: str,
        pod: JSON,
        request: Request,
        placement: Placement,
        waiting: _Waiting,
        now: float,
    ) -> None:
        snapshot = self.cache.snapshot
        snapshot.assume(request, placement.node, placement.gpus)
        self.cache.assumed.add(key)
        self.cache.pending.pop(key, None)
        uuid = placement.gpus[0]
        holder = snapshot.gpus[uuid].holder
        latency = now - waiting.first_seen
        note = (
            f"Assigned {key} to {placement.node}, GPU {uuid} held by {holder}: "
            f"{format_compute(request.compute)} compute, {format_memory(request.gpu_memory)}"
        )

        def bind() -> None:
            try:
                writer.bind(self._kube, pod, placement.node, uuid, holder)
            except ApiError as error:
                self._results.append((key, error))
            else:
                self._results.append((key, None))
                if self._metrics is not None:
                    self._metrics.latency.observe(latency)
                writer.event(self._kube, pod, "Scheduled", note, instance=self._settings.identity)
            self.cache.dirty.wake.set()

        self._pool.submit(bind)

    def _take_results(self) -> None:
        while self._results:
            key, error = self._results.popleft()
            if error is None:
                self._count("scheduled")
                continue
            self._count("error")
            log.warning("binding %s failed: %s", key, error)
            self.cache.assumed.discard(key)
            self.cache.snapshot.forget(key)
            self.cache.dirty.pod(key)  # back to the queue from the informer's copy
            waiting = self._waiting.get(key)
            if waiting is not None and error.status != 409:
                self._backoff(waiting, self._clock())

    def _unschedulable(
        self, key: str, pod: JSON, waiting: _Waiting, reason: str, message: str, now: float
    ) -> None:
        self._count("unschedulable")
        self._backoff(waiting, now)
        if waiting.reported == message:
            return
        waiting.reported = message
        identity = self._settings.identity

        def report() -> None:
            try:
                writer.unschedulable(self._kube, pod, reason, message)
            except ApiError as error:
                log.warning("could not set PodScheduled on %s: %s", key, error)
            writer.event(
                self._kube, pod, "FailedScheduling", message, warning=True, instance=identity
            )

        self._pool.submit(report)

    def _backoff(self, waiting: _Waiting, now: float) -> None:
        waiting.attempts += 1
        delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(waiting.attempts - 1, 10))
        waiting.not_before = now + delay

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.attempts.labels(result=result).inc()

    def _unplaced(self, pool: str) -> list[Allocation]:
        """The pool's pods that were tried and fit nowhere, as the planner sees them."""
        out: list[Allocation] = []
        for key, entry in self.cache.pending.items():
            state = self._waiting.get(key)
            request = entry.request
            if state is None or state.attempts == 0 or not isinstance(request, Request):
                continue
            if request.pool == pool:
                share = (request.compute, request.gpu_memory, request.owner, request.exclusive)
                out.append(Allocation(key, *share))
        return out

    def _refresh_mix(self) -> None:
        """Keep a fragmentation scorer's task mix to the pods this cluster runs: the
        fractional pods booked and waiting. Replaced only when it changes, since a new
        mix invalidates every memoised answer."""
        if not isinstance(self._scorer, FragmentationScorer):
            return
        requests = [b.request for b in self.cache.snapshot.bookings.values() if b.gpus]
        for entry in self.cache.pending.values():
            if isinstance(entry.request, Request):
                requests.append(entry.request)
        mix = task_mix(requests)
        if mix != self._scorer.mix:
            self._scorer.set_mix(mix)

    # Metrics.

    def _measure(self) -> Usage:
        gpus = list(self.cache.snapshot.gpus.values())
        held = [g for g in gpus if not g.coming]
        return Usage(
            gpus_held=len(held),
            gpus_coming=len(self.cache.capacity) - len(held),
            gpus_in_use=sum(1 for g in held if g.owners),
            compute_allocated=sum(g.used_compute for g in held),
            pending_pods=len(self.cache.pending),
            leader=self.leading,
        )
