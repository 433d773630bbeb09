"""The extender: kube-scheduler finds where a pod may go; this picks the GPU, holds it
from filter to bind, and writes the assignment.

kube-scheduler owns every placement rule (affinity, spread, taints, ports, volumes, CPU
and memory, preemption) and its queue; it calls `filter` with the nodes a pod passed
them on, and `bind` once it has chosen. Both run under one lock over the cache, so no
two decisions ever see the same free share.

- **filter**: the placement core picks the best GPU among the nodes given and *reserves*
  it (the share is booked in the snapshot, as kube-scheduler's cache assumes a pod), and
  the answer is that node alone. When no GPU has room, every node fails with its reason
  (unresolvable: evicting pods does not make room on a GPU), and capacity is asked for,
  steered towards the nodes the pod may go to.
- **reservations** (`scheduler.reservations`, their one owner and its state diagram)
  hold the share until bind, or until they are clearly abandoned: the
  pod deleted or bound elsewhere (the informer says so), filtered again (kube-scheduler
  retries it), or `reservation_timeout` seconds without a bind. kube-scheduler filters
  the next pod before the previous one is bound, so without them a GPU would be booked
  twice.
- **bind** writes the assignment annotations with the pod's resourceVersion as a
  precondition, then the Binding (`writer.bind`). A bind with no reservation (expired,
  or this process restarted in between) places the pod again on that node, or fails:
  kube-scheduler then retries the pod from the start. A restarted extender rebuilds its
  ledger from the annotations alone.
- **housekeeping** (`tick`), only while the kube-scheduler beside it leads: expire
  reservations, scale capacity down, mark hosting capacity for the autoscalers, evict
  pods whose capacity vanished (`scheduler.lifecycle`), empty part-used GPUs where the
  pods' policies allow it (`scheduler.drain`), keep ReplicaSet pods' deletion cost
  (`scheduler.deletion_cost`).
"""

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from gpupack.capacity import Allocation, Where
from gpupack.codec import rfc3339
from gpupack.objects import JSON
from gpupack.policy import PolicySet, effective_policies
from gpupack.quantity import format_compute, format_memory
from gpupack.runtime.api import ApiError
from scheduler import wire, writer
from scheduler.cache import Cache
from scheduler.deletion_cost import Costs
from scheduler.drain import Drainer
from scheduler.escapes import Escapes
from scheduler.fragmentation import task_mix
from scheduler.kube import Kube
from scheduler.ledger import NotOurs, pod_key
from scheduler.lifecycle import Lifecycle, Waiting, unschedulable
from scheduler.metrics import Metrics, Usage
from scheduler.placement import Placement, Scorer, place, refusal
from scheduler.reporting import Notices, measure
from scheduler.reservations import Reservations
from scheduler.score import FragmentationScorer
from scheduler.settings import Settings
from scheduler.snapshot import Gpu, Request, Snapshot

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


class Extender:
    def __init__(
        self,
        kube: Kube,
        cache: Cache,
        scorer: Scorer,
        settings: Settings,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        escapes: Escapes | None = None,
        policies: Callable[[], PolicySet] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._wall = wall  # the times other processes read: the API server's clock
        self.escapes = escapes
        self.cache = cache
        self._scorer = scorer
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="api-write")
        self._lifecycle = Lifecycle(kube, cache, settings, self._pool.submit, metrics)
        self._drainer = Drainer(
            kube,
            cache,
            policies or (lambda: effective_policies(())),
            settings,
            self._pool.submit,
            metrics,
            wall,
        )
        self._costs = Costs(kube, cache, self._pool.submit) if settings.deletion_cost else None
        self.notices = Notices(kube, cache, self._pool.submit, settings.namespace, escapes)
        self.reservations = Reservations(cache)
        self.waiting: dict[str, Waiting] = {}
        self._gpu_nodes_seen = (0, 0.0)  # `Cache.gpu_nodes_changed`, and since when
        # Capacity pod -> the resourceVersion our cache had when we labelled it hosting:
        # until the informer brings the labelled copy, the next binds need not label again.
        self._marked: dict[str, str] = {}
        self._mark_gates: dict[str, threading.Lock] = {}  # one label write per capacity pod
        self._changed = True  # whether the books changed since the last requeue round
        self._next_round = math.inf  # when a pod asked before may be asked again
        self._requeued: dict[str, float] = {}  # pod -> when it was last requeued
        self.leading = False  # whether the kube-scheduler beside us leads (`leadership`)
        self.usage = Usage(0, 0, 0, 0, 0, leader=False)

    # The verbs.

    def filter(self, args: wire.FilterArgs) -> wire.FilterResult:
        pod, nodes = args.pod, args.nodes
        key = pod_key(pod)
        with self._lock:
            now = self._sync()
            self._release(key, "filtered again")
            request = self.cache.request(pod)
            if isinstance(request, NotOurs):
                self._count("refused")
                return wire.every(nodes, f"gpupack: {request.message}")
            if not nodes:
                return wire.refused({})
            result = place(self.cache.snapshot, request, self._scorer, nodes)
            if isinstance(result, Placement):
                self.reservations.reserve(key, pod, request, result, now)
                self.waiting.pop(key, None)
                self._count("placed")
                return wire.chosen(result.node)
            self._count("unschedulable")
            snapshot = self.cache.snapshot
            asks = f"(asks {format_compute(request.compute)}, {format_memory(request.gpu_memory)})"
            reasons = {n: f"gpupack: {refusal(snapshot, request, n)} {asks}" for n in nodes}
            required = self._wait(key, pod, request, frozenset(nodes), now)
            starting = _starting(snapshot, request, nodes)
            if starting is not None:
                return wire.retry(
                    f"gpupack: the GPU of capacity pod {starting.holder} on {starting.node} "
                    f"is starting; it will take this pod {asks}"
                )
            self._ask_capacity(pod, request, required, nodes, now)
            return wire.refused(reasons)

    def bind(self, args: wire.BindArgs) -> wire.BindResult:
        key = args.key
        with self._lock:
            now = self._sync()
            held = self.reservations.get(key)
            if held is None or held.uid != args.uid or held.node != args.node:
                self._release(key, "bound to another node than reserved")
                why = self._reserve_again(args, now)
                if why is not None:
                    self._count_bind("error")
                    return wire.bind_failed(why)
                held = self.reservations[key]
            held.binding = True
        try:
            self._ensure_marked(held.holder)
            writer.bind(self._kube, held.pod, held.node, held.gpu, held.holder, held.request)
        except (ApiError, writer.Changed) as error:
            with self._lock:
                if self.reservations.get(key) is held:
                    self._release(key, f"bind failed: {error}")
            log.warning("binding %s to %s failed: %s", key, args.node, error)
            self._count_bind("error")
            return wire.bind_failed(f"gpupack could not bind {key} to {args.node}: {error}")
        with self._lock:
            self.reservations.confirm(key, held)
            latency = self._clock() - held.since
        if self._metrics is not None:
            self._metrics.latency.observe(latency)
        self._count_bind("scheduled")
        log.debug(
            "bound",
            extra={"pod": key, "node": held.node, "gpu": held.gpu, "capacity_pod": held.holder},
        )
        return wire.bound()

    def _ensure_marked(self, holder: str) -> None:
        """Label the capacity pod `holder` hosting before the first pod lands on its GPU:
        from then on the API server refuses to delete or evict it, so its GPU stays held
        while anything runs. kube-scheduler binds in parallel: one bind per capacity pod
        writes the label, the others wait for it rather than write it again."""
        with self._lock:
            gate = self._mark_gates.setdefault(holder, threading.Lock())
        with gate:
            with self._lock:
                pod = self._unmarked(holder)
            if pod is None:
                return
            writer.mark_hosting(self._kube, pod, True)
            with self._lock:
                self._marked[holder] = pod["metadata"].get("resourceVersion", "")

    def _unmarked(self, holder: str) -> JSON | None:
        """The capacity pod `holder` when it still needs the hosting label, else None."""
        capacity = self.cache.capacity.get(holder)
        if capacity is None or writer.hosting(capacity.pod):
            self._marked.pop(holder, None)
            return None
        version = capacity.pod["metadata"].get("resourceVersion", "")
        return None if self._marked.get(holder) == version else capacity.pod

    # Housekeeping.

    def tick(self) -> None:
        """Fold changes in, expire reservations; while leading, the capacity lifecycle."""
        with self._lock:
            now = self._sync()
            self._expire(now)
            for key in [k for k, w in self.waiting.items() if not self._still_waiting(k, w, now)]:
                del self.waiting[key]
            for holder in [h for h in self._marked if h not in self.cache.capacity]:
                del self._marked[holder]
            for holder in [h for h in self._mark_gates if h not in self.cache.capacity]:
                del self._mark_gates[holder]
            for key in [k for k in self._requeued if k not in self.waiting]:
                del self._requeued[key]
            if self.leading:
                self._adopt_unplaceable(now)
                self._lifecycle.housekeeping(now, self.waiting)
                self._drainer.round(now)
                if self._costs is not None:
                    self._costs.round(now)
                self._requeue(now)
            else:
                self._drainer.pause()
            self.notices.report(self.leading)
            self._refresh_mix()
            self.usage = measure(self.cache, self.reservations, self.leading, self.escapes)

    def flush(self) -> None:
        """Wait until the API writes submitted so far are done (with one worker they run in
        order; with more, until the ones ahead of a marker started and it ran)."""
        self._pool.submit(lambda: None).result()

    def run(self, stop: threading.Event) -> None:
        """`tick` every housekeeping interval until `stop`."""
        try:
            while not stop.wait(self._settings.housekeeping_interval):
                self.tick()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=False)

    # Reservations.

    def _sync(self) -> float:
        """Fold informer changes in (a reservation whose pod was deleted or bound leaves
        `cache.assumed` then); the time now."""
        now = self._clock()
        if self.cache.refresh(now):
            self._changed = True
        return now

    def _expire(self, now: float) -> None:
        """Forget reservations the informer showed abandoned; release those never bound
        in time (housekeeping: the verbs need neither, since a stale reservation still
        books its share, and filter and bind check the one they touch)."""
        expired = self.reservations.expire(now, self._settings.reservation_timeout)
        if expired:
            self._changed = True
            if self._metrics is not None:
                self._metrics.reservations_expired.inc(len(expired))
            self.cache.refresh(now)  # the released pods are pending again

    def _still_waiting(self, key: str, waiting: Waiting, now: float) -> bool:
        """Whether a pod that fit nowhere still waits: unbound, not reserved, and known
        to the informer (or filtered too recently for it to have seen the pod)."""
        pod = self.cache.pod(key)
        if pod is None:
            return now - waiting.since < WAITING_FORGET
        return not (pod.get("spec") or {}).get("nodeName") and not self.reservations.booked(key)

    def _release(self, key: str, why: str) -> None:
        if self.reservations.release(key, why):
            self._changed = True

    def _reserve_again(self, args: wire.BindArgs, now: float) -> str | None:
        """Place a pod kube-scheduler binds without our reservation on the node it chose;
        why not, or None."""
        pod = self.cache.pod(args.key)
        if pod is None or str(pod["metadata"].get("uid", "")) != args.uid:
            return f"gpupack holds no GPU for {args.key} (uid {args.uid}) and does not see it yet"
        if (pod.get("spec") or {}).get("nodeName"):
            return f"{args.key} is already bound"
        request = self.cache.request(pod)
        if isinstance(request, NotOurs):
            return request.message
        if self.reservations.booked(args.key):  # booked from the informer, not by us
            return f"{args.key} is already booked"
        result = place(self.cache.snapshot, request, self._scorer, (args.node,))
        if not isinstance(result, Placement):
            why = refusal(self.cache.snapshot, request, args.node)
            return f"the GPU reserved for {args.key} was released and {args.node} has {why}"
        self.reservations.reserve(args.key, pod, request, result, now)
        return None

    # Pods that wait for a GPU.

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
        go to, with kube-scheduler's `verdict` when no node was (`_adopt_unplaceable`);
        the requirements a GPU for it must meet."""
        allocation = Allocation(
            key, request.compute, request.gpu_memory, request.owner, request.exclusive
        )
        # A filter's verdict may predate a node that began taking pods just before: such
        # a node is not held against the pod, here nor when it is requeued.
        judged = now if verdict is None else None
        fresh = set()
        if judged is not None:
            fresh = {n for n in list(self.cache.began) if self.cache.just_began(n, judged)}
        rejected = frozenset(
            n for n in self.cache.snapshot.nodes if n not in feasible and n not in fresh
        )
        required = self._lifecycle.requirements(
            pod, request.pool, feasible, request.gpu_memory, judged
        )
        self.waiting[key] = Waiting(
            request.pool,
            allocation,
            feasible,
            now,
            rejected,
            required.key,
            self.cache.gpu_nodes_changed,
            verdict,
        )
        return required

    def _ask_capacity(
        self, pod: JSON, request: Request, required: Where, feasible: Sequence[str], now: float
    ) -> None:
        unplaced = self._unplaced(request.pool, required.key, now)
        self._lifecycle.request(request.pool, pod, unplaced, required, feasible)

    def _adopt_unplaceable(self, now: float) -> None:
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
        generation = self.cache.gpu_nodes_changed
        if generation != self._gpu_nodes_seen[0]:
            self._gpu_nodes_seen = (generation, now)
        settled = now - self._gpu_nodes_seen[1] >= VERDICT_RENEWED
        for key, entry in self.cache.pending.items():
            if self.reservations.booked(key):
                continue
            known = self.waiting.get(key)
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
                self.waiting[key] = replace(self.waiting[key], since=known.since)
                continue  # asked for already, with the same requirements
            self._ask_capacity(entry.pod, request, required, (), now)

    # Requeueing what was refused.

    def _requeue(self, now: float) -> None:
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
        away, behind the pods queued before it, and each request is a write (asking it
        every `REQUEUE_EVERY` meanwhile made 1,649 requests for 331 refusals). Such a pod
        sets when the next round comes if nothing changes before: every round places each
        waiting pod under the lock kube-scheduler's filters wait on."""
        if not self._changed and now < self._next_round:
            return
        self._changed, self._next_round = False, math.inf
        snapshot = self.cache.snapshot
        promised: list[str] = []
        try:
            for key, waiting in self.waiting.items():
                if self.reservations.booked(key):
                    continue
                pod = self.cache.pod(key)
                request = self.cache.request(pod) if pod is not None else None
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
                self._pool.submit(self._requeue_pod, pod)
        finally:
            for key in promised:
                snapshot.forget(key)

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

    # Capacity planning and the scorer's mix.

    def _unplaced(self, pool: str, placement: str, now: float) -> list[Allocation]:
        """The pool's pods that fit nowhere at their last filter, still wait, and may use
        GPUs that land where `placement` says, as the planner sees them."""
        return [
            w.allocation
            for key, w in self.waiting.items()
            if w.pool == pool and w.placement == placement and self._still_waiting(key, w, now)
        ]

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

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.filters.labels(result=result).inc()

    def _count_bind(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.attempts.labels(result=result).inc()


def _starting(snapshot: Snapshot, request: Request, nodes: Sequence[str]) -> Gpu | None:
    """A GPU of the pod's pool on one of `nodes` that is not running yet (its capacity
    pod is bound, the exporter has not named the device) and will have room for it.
    kube-scheduler parks a pod its extender refused until an event its own plugins care
    about, and a GPU starting is none; so the pod is asked to retry instead."""
    for name in nodes:
        node = snapshot.nodes.get(name)
        for gpu in node.gpus if node is not None else ():
            if not (gpu.coming and gpu.healthy and gpu.pool == request.pool):
                continue
            if request.models is not None and gpu.model not in request.models:
                continue
            if gpu.fits(request) and gpu.exclusive_owner in ("", request.owner):
                return gpu
    return None
