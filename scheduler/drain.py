"""The consolidation loop: empty the part-used GPUs `scheduler.consolidation` picks, so
their capacity pods, and then their nodes, can go.

Runs in the leader's housekeeping, at most every `consolidation_interval` seconds. A
round first looks after the GPUs already draining (capacity pods marked
`gpupack.io/draining` with the time it began): one still hosting `drain_timeout` after
that time is given back to placement (the mark removed). One whose pods have all left
is the lifecycle's to delete, at once (`scheduler.lifecycle`). A pool with a GPU
draining starts no other drain. Then it asks
`consolidation.plan` for moves, judging each pod (`judge`):

- its policy (the pod's `gpupack.io/policy`, as the GPUPolicy objects say now) has
  consolidation `On`, or `IdleGPUs` and the GPU holds at most `idleBelow` of itself;
  real-time-mps pods only where the policy sets `allowMPS`;
- it runs, and a controller that recreates pods owns it (ReplicaSet, StatefulSet,
  ReplicationController): a Job's pod, a bare pod, or one of another operator is never
  moved;
- it does not ask to stay (`karpenter.sh/do-not-disrupt: "true"`,
  `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`);
- its workload runs at least the policy's `minReplicas` pods on GPUs (the built-in
  real-time policy: 2, so a single-replica server is never moved);
- its workload has budget left: at most `evictionsPerWindow` evictions in any
  `windowSeconds`. The budget is the leader's memory, written to a ConfigMap after each
  round that moved (`scheduler.budgets`): a new leader reads what the last one spent, or,
  where it cannot, starts with every budget spent for a window, so the bound holds across
  restarts and failovers.

A move marks the capacity pod draining (placement puts nothing new on it), then evicts
its pods one by one through the Eviction API, so PodDisruptionBudgets hold, each with an
Event `GPUConsolidation` saying why and where its share is planned to go. An eviction a
PodDisruptionBudget refuses (429) stops the move, with an Event `GPUConsolidationBlocked`
on the pod; if nothing was evicted yet the mark is removed at once.
"""

import logging
import math
import time
from collections.abc import Callable

from gpupack import keys
from gpupack.codec import parse_time, rfc3339
from gpupack.objects import JSON, annotations_of, controller_kind
from gpupack.policy import BUILTIN, DEFAULT_POLICY, ConsolidationMode, Policy, PolicySet
from gpupack.runtime.api import ApiError
from gpupack.shares import is_running
from scheduler import budgets, writer
from scheduler.cache import Cache
from scheduler.consolidation import Move, fill, plan
from scheduler.kube import Kube
from scheduler.ledger import Booking, Gpu
from scheduler.metrics import Metrics
from scheduler.relocation import describe, relocate
from scheduler.settings import Settings

log = logging.getLogger(__name__)

RECREATED_BY: frozenset[str] = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})
Submit = Callable[..., object]


def asks_to_stay(pod: JSON) -> bool:
    annotations = annotations_of(pod)
    return (
        annotations.get(keys.KARPENTER_DO_NOT_DISRUPT) == "true"
        or annotations.get(keys.CA_SAFE_TO_EVICT) == "false"
    )


class Drainer:
    def __init__(
        self,
        kube: Kube,
        cache: Cache,
        policies: Callable[[], PolicySet],
        settings: Settings,
        submit: Submit,
        metrics: Metrics | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self.cache = cache
        self._policies = policies
        self._settings = settings
        self._submit = submit
        self._metrics = metrics
        self._wall = wall
        self._since: float | None = None  # when this leader's budgets began
        self._last_round = -math.inf
        self._evicted: dict[str, list[float]] = {}  # workload -> eviction times
        self._now = 0.0
        self._policy_set: PolicySet | None = None
        self._replicas: dict[str, int] = {}  # workload -> its pods booked on GPUs now

    def pause(self) -> None:
        """Not leading: the next leader's budgets start over (spent)."""
        self._since = None
        self._evicted.clear()

    def _begin(self, now: float) -> None:
        """A new leader's budgets: what the last one spent (`scheduler.budgets`), else
        every budget spent for a window."""
        name = self._settings.budgets_configmap
        ledger = budgets.load(self._kube, self._settings.namespace, name) if name else None
        if ledger is None:
            self._since = now
            return
        self._since = -math.inf
        wall = self._wall()
        self._evicted = {
            owner: [now - (wall - t) for t in times if wall - t < budgets.KEPT]
            for owner, times in ledger.items()
        }

    def _save(self) -> None:
        name = self._settings.budgets_configmap
        if not name:
            return
        wall = self._wall()
        ledger = {o: [wall - (self._now - t) for t in ts] for o, ts in self._evicted.items()}
        self._submit(budgets.save, self._kube, self._settings.namespace, name, ledger, wall)

    def round(self, now: float) -> list[Move]:
        """One consolidation round if one is due; the moves started."""
        if self._since is None:
            self._begin(now)
        if self._settings.consolidation_interval <= 0:
            return []
        if now - self._last_round < self._settings.consolidation_interval:
            return []
        self._last_round = now
        self._now = now
        busy = self._look_after_drains()
        self._policy_set = self._policies()
        if not any(
            p.consolidation.mode is not ConsolidationMode.OFF
            for p in self._policy_set.policies.values()
        ):
            return []
        self._replicas = {}
        for booking in self.cache.ledger.bookings.values():
            if booking.gpus:
                owner = booking.request.owner
                self._replicas[owner] = self._replicas.get(owner, 0) + 1
        snapshot = self.cache.ledger
        moves = plan(snapshot, self._judge, busy=frozenset(busy), planned=self._spend)
        moves += relocate(
            snapshot,
            self._judge,
            self.cache.free_gpus,
            busy=busy | {m.pool for m in moves},
            planned=self._spend,
        )
        for move in moves:
            pods: list[JSON] = []
            for key in move.pods:
                pod = self.cache.pod(key)
                assert pod is not None  # the judge read it
                pods.append(pod)
            holder = self.cache.capacity[move.holder].pod
            log.info("consolidating: %s", move.reason)
            self._submit(self._drain, move, holder, pods)
        if moves:
            self._save()
        return moves

    # Judging.

    def _spend(self, move: Move) -> None:
        """Spend the budgets of the workloads `move` evicts, before the round judges the
        next GPU."""
        for key in move.pods:
            owner = self.cache.ledger.bookings[key].request.owner
            self._evicted.setdefault(owner, []).append(self._now)

    def policy_of(self, pod: JSON) -> Policy:
        policies = self._policy_set or self._policies()
        name = annotations_of(pod).get(keys.POLICY, "")
        return policies.policies.get(name) or BUILTIN[DEFAULT_POLICY]

    def _judge(self, booking: Booking, gpu: Gpu) -> str | None:
        """Why this pod may not be moved off this GPU now, or None."""
        pod = self.cache.pod(booking.request.key)
        if pod is None or not is_running(pod):
            return "not running"
        policy = self.policy_of(pod)
        settings = policy.consolidation
        if settings.mode is ConsolidationMode.OFF:
            return f"policy {policy.name}: consolidation Off"
        if settings.mode is ConsolidationMode.IDLE and fill(gpu) > settings.idle_below:
            return f"policy {policy.name}: IdleGPUs, and the GPU holds more than idleBelow"
        if booking.request.exclusive and not settings.allow_mps:
            return f"policy {policy.name}: real-time-mps pods move only with allowMPS"
        if controller_kind(pod) not in RECREATED_BY:
            return "no ReplicaSet, StatefulSet or ReplicationController recreates it"
        if asks_to_stay(pod):
            return "it asks not to be disrupted"
        replicas = self._replicas.get(booking.request.owner, 0)
        if replicas < settings.min_replicas:
            return (
                f"policy {policy.name}: its workload runs {replicas} pod(s), fewer than "
                f"minReplicas {settings.min_replicas}"
            )
        assert self._since is not None
        window = settings.window_seconds
        if self._now - self._since < window:
            return "this leader's budget window has not begun"
        owner = booking.request.owner
        recent = [t for t in self._evicted.get(owner, ()) if self._now - t < window]
        self._evicted[owner] = recent
        # Emptying the GPU evicts every pod of the workload on it: all must fit the budget.
        if len(recent) + max(1, gpu.owners.get(owner, 1)) > settings.evictions:
            return f"workload {owner} spent its budget ({settings.evictions} per {window}s)"
        return None

    # Drains under way.

    def _look_after_drains(self) -> set[str]:
        """Give up the drains past the timeout; the pools with a GPU still draining."""
        busy: set[str] = set()
        snapshot = self.cache.ledger
        for name, capacity in self.cache.capacity.items():
            if not annotations_of(capacity.pod).get(keys.DRAINING):
                continue
            since = parse_time(annotations_of(capacity.pod)[keys.DRAINING])
            gpu = snapshot.gpus.get(capacity.gpu) if capacity.gpu else None
            hosting = gpu is not None and gpu.pods > 0
            if hosting and (since is None or self._wall() - since >= self._settings.drain_timeout):
                log.warning("giving up draining %s: pods still on it after the timeout", name)
                self._submit(self._undrain, capacity.pod)
                if self._metrics is not None:
                    self._metrics.drains.labels(result="timed-out").inc()
                continue
            busy.add(capacity.pool)
        return busy

    # API writes (worker threads).

    def _drain(self, move: Move, holder: JSON, pods: list[JSON]) -> None:
        try:
            writer.annotate(self._kube, holder, {keys.DRAINING: rfc3339(self._wall())})
        except ApiError as error:
            log.warning("could not mark %s draining: %s", move.holder, error)
            return
        if self._metrics is not None:
            self._metrics.drains.labels(result="started").inc()
        for evicted, (pod, target) in enumerate(zip(pods, move.targets, strict=True)):
            meta = pod["metadata"]
            note = (
                f"evicted to consolidate GPUs: {move.reason}; this pod's share is planned "
                f"onto {describe(target)}, and its controller recreates it"
            )
            try:
                writer.evict(self._kube, pod)
            except ApiError as error:
                result = "refused" if error.status == 429 else "failed"
                log.warning(
                    "consolidation could not evict %s/%s (%s): %s",
                    meta["namespace"],
                    meta["name"],
                    result,
                    error,
                )
                if self._metrics is not None:
                    self._metrics.consolidation_evictions.labels(result=result).inc()
                if result == "refused":  # the operator's answer to "why is it not packed?"
                    why = (
                        f"consolidation could not move this pod off GPU {move.gpu}: its "
                        "PodDisruptionBudget allows no disruption now; it is tried again "
                        "once its workload's budget window has passed"
                    )
                    writer.event(self._kube, pod, "GPUConsolidationBlocked", why, action="Evicting")
                if evicted == 0:
                    self._undrain(holder)
                return
            if self._metrics is not None:
                self._metrics.consolidation_evictions.labels(result="evicted").inc()
            writer.event(self._kube, pod, "GPUConsolidation", note, action="Evicting")

    def _undrain(self, holder: JSON) -> None:
        try:
            writer.annotate(self._kube, holder, {keys.DRAINING: None})
        except ApiError as error:
            log.warning("could not unmark %s: %s", holder["metadata"]["name"], error)
