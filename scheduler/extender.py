"""The extender: kube-scheduler finds where a pod may go; this picks the GPU, holds it
from filter to bind, and writes the assignment.

kube-scheduler owns every placement rule (affinity, spread, taints, ports, volumes, CPU
and memory, preemption) and its queue; it calls `filter` with the nodes a pod passed
them on, and `bind` once it has chosen. Both run under one lock over the cache, so no
two decisions ever see the same free share.

- **filter**: the placement core picks the best GPU among the nodes given and *reserves*
  it (the share is booked in the snapshot, as kube-scheduler's cache assumes a pod), and
  the answer is that node alone. When no GPU has room, every node fails with its reason
  (unresolvable: evicting pods does not make room on a GPU) and the pod goes to the
  waiting room (`scheduler.waiting`), which asks capacity for it, steered towards the
  nodes the pod may go to; or, when a GPU that will take it is starting, the pod is
  asked to retry.
- **reservations** (`scheduler.reservations`, their one owner and its state diagram)
  hold the share until bind, or until they are clearly abandoned: the
  pod deleted or bound elsewhere (the informer says so), filtered again (kube-scheduler
  retries it), or `reservation_timeout` seconds without a bind. kube-scheduler filters
  the next pod before the previous one is bound, so without them a GPU would be booked
  twice.
- **bind** has the capacity pod labelled hosting (`Lifecycle.ensure_hosting`), then
  writes one Binding that carries the assignment annotations, with the pod's uid and
  resourceVersion as preconditions (`writer.bind`). A bind with no reservation (expired,
  or this process restarted in between) places the pod again on that node, or fails:
  kube-scheduler then retries the pod from the start. A restarted extender rebuilds its
  ledger from the annotations alone.
- **housekeeping** (`tick`): expire reservations and tidy the waiting room; only while
  the kube-scheduler beside it leads, adopt and requeue waiting pods
  (`scheduler.waiting`), scale capacity, mark hosting capacity for the autoscalers, evict
  pods whose capacity vanished (`scheduler.lifecycle`), empty part-used GPUs where the
  pods' policies allow it (`scheduler.drain`), keep ReplicaSet pods' deletion cost
  (`scheduler.deletion_cost`).
"""

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

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
from scheduler.ledger import Gpu, Ledger, Request
from scheduler.lifecycle import Lifecycle
from scheduler.metrics import Metrics, Usage
from scheduler.placement import Placement, Scorer, place, refusal, refusals
from scheduler.reporting import Notices, measure
from scheduler.reservations import Reservations
from scheduler.score import FragmentationScorer
from scheduler.settings import Settings
from scheduler.translate import NotOurs, pod_key
from scheduler.waiting import WaitingRoom

log = logging.getLogger(__name__)


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
        self.escapes = escapes
        self.cache = cache
        self._scorer = scorer
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="api-write")
        self._lifecycle = Lifecycle(kube, cache, settings, self._pool.submit, metrics, self._lock)
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
        submit = self._pool.submit
        self.waiting = WaitingRoom(
            kube, cache, self.reservations, scorer, self._lifecycle, submit, metrics, wall
        )
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
            result = place(self.cache.ledger, request, self._scorer, nodes)
            if isinstance(result, Placement):
                self.reservations.reserve(key, pod, request, result, now)
                self.waiting.placed(key)
                self._count("placed")
                return wire.chosen(result.node)
            self._count("unschedulable")
            snapshot = self.cache.ledger
            asks = f"(asks {format_compute(request.compute)}, {format_memory(request.gpu_memory)})"
            why = refusals(snapshot, request, nodes)
            reasons = {n: f"gpupack: {why[n]} {asks}" for n in nodes}
            starting = _starting(snapshot, request, nodes)
            self.waiting.refused(key, pod, request, frozenset(nodes), now, ask=starting is None)
            if starting is not None:
                return wire.retry(
                    f"gpupack: the GPU of capacity pod {starting.holder} on {starting.node} "
                    f"is starting; it will take this pod {asks}"
                )
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
            self._lifecycle.ensure_hosting(held.holder)
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

    # Housekeeping.

    def tick(self) -> None:
        """Fold changes in, expire reservations; while leading, the capacity lifecycle."""
        with self._lock:
            now = self._sync()
            self._expire(now)
            self.waiting.tidy(now)
            self._lifecycle.tidy()
            if self.leading:
                self.waiting.adopt_unplaceable(now)
                self._lifecycle.housekeeping(now, self.waiting.entries)
                self._drainer.round(now)
                if self._costs is not None:
                    self._costs.round(now)
                self.waiting.requeue(now)
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
            self.waiting.books_changed()
        return now

    def _expire(self, now: float) -> None:
        """Forget reservations the informer showed abandoned; release those never bound
        in time (housekeeping: the verbs need neither, since a stale reservation still
        books its share, and filter and bind check the one they touch)."""
        expired = self.reservations.expire(now, self._settings.reservation_timeout)
        if expired:
            self.waiting.books_changed()
            if self._metrics is not None:
                self._metrics.reservations_expired.inc(len(expired))
            self.cache.refresh(now)  # the released pods are pending again

    def _release(self, key: str, why: str) -> None:
        if self.reservations.release(key, why):
            self.waiting.books_changed()

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
        result = place(self.cache.ledger, request, self._scorer, (args.node,))
        if not isinstance(result, Placement):
            why = refusal(self.cache.ledger, request, args.node)
            return f"the GPU reserved for {args.key} was released and {args.node} has {why}"
        self.reservations.reserve(args.key, pod, request, result, now)
        return None

    # The scorer's mix.

    def _refresh_mix(self) -> None:
        """Keep a fragmentation scorer's task mix to the pods this cluster runs: the
        fractional pods booked and waiting. Replaced only when it changes, since a new
        mix invalidates every memoised answer."""
        if not isinstance(self._scorer, FragmentationScorer):
            return
        requests = [b.request for b in self.cache.ledger.bookings.values() if b.gpus]
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


def _starting(snapshot: Ledger, request: Request, nodes: Sequence[str]) -> Gpu | None:
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
