"""The recommender's loop: usage in, GPURecommendation objects out (the I/O shell).

While it leads, every `interval` seconds it collects per-pod usage (the exporters, or
Prometheus), charges each sample to the pod's workload (the informer of gpupack's pods
says which, and with which policy and allocation), recomputes each workload's target
with `recommend`, and writes the workload's GPURecommendation when the target changed,
or at least every `checkpoint_interval` seconds while samples arrive: the object's
`status.history` is the checkpoint a new leader restores (`load`), so a restart loses
at most one checkpoint interval of history, and nothing on a clean shutdown (`flush`).

It also writes each GPUPolicy object's status (valid or not, and what applies), deletes
the recommendations of workloads that have been gone longer than their history window,
and, for policies with `updateMode: Auto`, restarts a Deployment or StatefulSet whose
running pods drifted far from the recommendation (at most once per cooldown).
"""

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from gpupack import keys
from gpupack.codec import rfc3339
from gpupack.objects import JSON
from gpupack.policy import API_VERSION as POLICY_API
from gpupack.policy import DEFAULT_POLICY, Policy, PolicySet, UpdateMode, effective_policies
from gpupack.policy import PLURAL as POLICY_PLURAL
from gpupack.quantity import format_compute, format_memory
from gpupack.recommendation import API_VERSION, KIND, list_path
from gpupack.runtime import events
from gpupack.runtime.api import ApiError
from gpupack.runtime.transport import JSON_PATCH, MERGE_PATCH, Body
from recommender.metrics import RecommenderMetrics
from recommender.recommend import History, Target, drift, recommend
from recommender.state import (
    Workload,
    WorkloadKey,
    key_of,
    managed,
    object_of,
    policy_of,
    policy_status,
    restore,
    running_of,
)
from recommender.usage import UsageSource

log = logging.getLogger(__name__)

MANAGED_BY: Final = ("app.kubernetes.io/managed-by", "gpupack-recommender")
ROLLABLE: Final = {"Deployment": "deployments", "StatefulSet": "statefulsets"}


class Store(Protocol):
    """The reads the loop makes of a cache (`gpupack.runtime.informer.Informer`)."""

    def get(self, key: str) -> JSON | None: ...

    def items(self) -> list[JSON]: ...


class Kube(Protocol):
    """The writes the recommender makes (its RBAC: GPURecommendations, GPUPolicy status,
    and with rollouts on, Deployments and StatefulSets). The reads are its informers."""

    def create(self, path: str, body: JSON) -> JSON: ...

    def patch(self, path: str, body: Body, content_type: str = MERGE_PATCH) -> JSON: ...

    def delete(self, path: str, body: JSON | None = None) -> JSON: ...


@dataclass(frozen=True, slots=True)
class Settings:
    namespace: str = keys.SYSTEM_NAMESPACE  # where the GPUPolicy objects live
    interval: float = 60.0  # seconds between usage collections
    checkpoint_interval: float = 300.0  # longest a history goes unsaved while it grows
    rollout_drift: float = 0.5  # updateMode Auto: restart when 1.5x apart
    rollout_cooldown: float = 3600.0  # at most one restart per workload per this long
    identity: str = "gpupack-recommender"  # this replica, as its Events name it


@dataclass(frozen=True, slots=True)
class TickResult:
    samples: int
    unmatched: int
    errors: tuple[str, ...]
    written: int
    changed: int
    rollouts: int


class Recommender:
    def __init__(
        self,
        kube: Kube,
        pods: Store,
        policies: Store,
        recommendations: Store,
        source: UsageSource,
        settings: Settings,
        metrics: RecommenderMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._pods = pods
        self._policies = policies
        self._recommendations = recommendations
        self._source = source
        self.settings = settings
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._workloads: dict[WorkloadKey, Workload] = {}
        self._saved: dict[WorkloadKey, float] = {}  # when each history was last written
        self._unsaved: set[WorkloadKey] = set()  # samples added since the last write
        self._errors: frozenset[str] = frozenset()
        self.leading = False

    # -- state ----------------------------------------------------------------------

    def workloads(self) -> dict[WorkloadKey, Workload]:
        with self._lock:
            return dict(self._workloads)

    def policy_set(self) -> PolicySet:
        return effective_policies(self._policies.items())

    def state(self) -> tuple[bool, int, int]:
        """(leading, workloads, invalid policies), for the metrics."""
        with self._lock:
            count = len(self._workloads)
        return self.leading, count, len(self.policy_set().invalid)

    def load(self) -> int:
        """Restore every workload's history from its GPURecommendation (a new leader's
        first step). A checkpoint that does not parse starts that workload afresh."""
        restored: dict[WorkloadKey, Workload] = {}
        for obj in self._recommendations.items():
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if labels.get(MANAGED_BY[0]) != MANAGED_BY[1]:
                continue
            try:
                workload = restore(obj)
            except ValueError as exc:
                meta = obj.get("metadata") or {}
                log.warning(
                    "cannot restore the history of %s/%s; starting it afresh: %s",
                    meta.get("namespace"),
                    meta.get("name"),
                    exc,
                )
                continue
            restored[workload.key] = workload
        now = self._clock()
        with self._lock:
            self._workloads = restored
            self._saved = dict.fromkeys(restored, now)
            self._unsaved = set()
        log.info("restored %d workload histories", len(restored))
        return len(restored)

    # -- one round --------------------------------------------------------------------

    def tick(self) -> TickResult:
        started = time.perf_counter()
        now = self._clock()
        policy_set = self.policy_set()
        policies = policy_set.policies
        collected = self._source.collect()
        self._log_errors(collected.errors)

        by_workload: dict[WorkloadKey, list[JSON]] = defaultdict(list)
        for pod in self._pods.items():
            if managed(pod):
                by_workload[key_of(pod)].append(pod)
        memory_used: dict[str, dict[str, int]] = defaultdict(dict)  # namespace -> pod -> bytes
        samples = unmatched = 0
        with self._lock:
            for usage in collected.usage:
                sampled = self._pods.get(f"{usage.namespace}/{usage.pod}")
                if sampled is None or not managed(sampled):
                    unmatched += 1
                    continue
                key = key_of(sampled)
                workload = self._workloads.get(key)
                if workload is None:
                    workload = Workload(key, History.new(policy_of(sampled, policies)))
                    self._workloads[key] = workload
                workload.history.add(usage.compute, usage.memory, now)
                self._unsaved.add(key)
                samples += 1
                if usage.memory is not None:
                    memory_used[usage.namespace][usage.pod] = usage.memory
            workloads = list(self._workloads.values())

        written = changed = rollouts = 0
        for workload in workloads:
            key = workload.key
            pods = by_workload.get(key, [])
            policy = self._policy_for(workload, pods, policies)
            if not pods and self._expired(workload, policy, now):
                self._forget(workload)
                continue
            workload.running = running_of(pods, memory_used.get(key.namespace, {}))
            target = recommend(workload.history, policy, workload.running)
            previous = workload.target
            is_change = workload.update(target, policy.name, now)
            rolled = self._maybe_roll_out(workload, policy, now)
            due = key in self._unsaved and now - self._saved.get(key, 0.0) >= (
                self.settings.checkpoint_interval
            )
            wanted = is_change or rolled or due or not workload.written
            if target is not None and wanted and self._write(workload, now):
                written += 1
            changed += is_change
            rollouts += rolled
            if is_change:
                log.info(
                    "recommendation changed",
                    extra={"workload": str(key), "policy": policy.name, "reason": workload.reason},
                )
                if target is not None:
                    self._event(
                        recommendation_ref(key),
                        "RecommendationChanged",
                        f"{key.kind} {key.name}: {change_text(previous, target)} "
                        f"({policy.name}): {workload.reason}",
                    )
        self._write_policy_statuses(policy_set)
        result = TickResult(samples, unmatched, collected.errors, written, changed, rollouts)
        if self._metrics is not None:
            self._metrics.samples.inc(samples)
            self._metrics.unmatched.inc(unmatched)
            self._metrics.collect_errors.inc(len(collected.errors))
            self._metrics.changes.inc(changed)
            self._metrics.tick_seconds.observe(time.perf_counter() - started)
        return result

    def flush(self) -> int:
        """Write every history with unsaved samples (a clean shutdown)."""
        now = self._clock()
        count = 0
        for workload in self.workloads().values():
            if workload.key in self._unsaved and self._write(workload, now):
                count += 1
        return count

    def run(self, lost: threading.Event) -> None:
        """The leader's body: restore, then a round every interval until `lost`."""
        self.leading = True
        try:
            self.load()
            while True:
                try:
                    self.tick()
                except Exception:  # one bad round must not end leadership
                    log.exception("recommender round failed")
                if lost.wait(self.settings.interval):
                    break
        finally:
            self.flush()
            self.leading = False

    # -- helpers ----------------------------------------------------------------------

    def _policy_for(
        self, workload: Workload, pods: list[JSON], policies: Mapping[str, Policy]
    ) -> Policy:
        if pods:
            return policy_of(pods[-1], policies)
        return policies.get(workload.policy) or policies[DEFAULT_POLICY]

    def _expired(self, workload: Workload, policy: Policy, now: float) -> bool:
        last = workload.history.last_sample
        return last is None or now - last > policy.history_window_seconds

    def _log_errors(self, errors: tuple[str, ...]) -> None:
        current = frozenset(errors)
        for error in sorted(current - self._errors):
            log.warning("usage collection failed: %s", error)
        for error in sorted(self._errors - current):
            log.info("usage collection recovered: %s", error.split(": ", 1)[0])
        self._errors = current

    def _path(self, key: WorkloadKey) -> str:
        return f"{list_path(key.namespace)}/{key.object_name}"

    def _write(self, workload: Workload, now: float) -> bool:
        obj = object_of(workload)
        if obj is None:
            return False
        key = workload.key
        ops = [
            {"op": "add", "path": "/spec", "value": obj["spec"]},
            {"op": "add", "path": "/status", "value": obj["status"]},
        ]
        try:
            try:
                self._kube.patch(self._path(key), ops, JSON_PATCH)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                self._kube.create(list_path(key.namespace), obj)
        except ApiError as exc:
            log.warning("cannot write the recommendation of %s: %s", key, exc)
            self._count_write("error")
            return False
        workload.written = obj["status"]
        with self._lock:
            self._saved[key] = now
            self._unsaved.discard(key)
        self._count_write("ok")
        return True

    def _count_write(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.writes.labels(result).inc()

    def _forget(self, workload: Workload) -> None:
        key = workload.key
        try:
            self._kube.delete(self._path(key))
        except ApiError as exc:
            if exc.status != 404:
                log.warning("cannot delete the recommendation of %s: %s", key, exc)
                return
        log.info("forgot a workload gone longer than its history window: %s", key)
        with self._lock:
            self._workloads.pop(key, None)
            self._saved.pop(key, None)
            self._unsaved.discard(key)

    def _maybe_roll_out(self, workload: Workload, policy: Policy, now: float) -> bool:
        target, running = workload.target, workload.running
        if policy.update_mode is not UpdateMode.AUTO or target is None or running is None:
            return False
        why = drift(target, running, self.settings.rollout_drift)
        if why is None:
            return False
        published = workload.written
        if published.get("compute") != format_compute(target.compute) or published.get(
            "memory"
        ) != format_memory(target.memory):
            return False  # publish first: the restarted pods must find the new target
        key = workload.key
        plural = ROLLABLE.get(key.kind)
        if plural is None:
            message = (
                f"updateMode Auto: {why}; gpupack restarts only Deployments and "
                f"StatefulSets: the {key.kind}'s next pods get the recommendation"
            )
            changed = message != workload.rollout_message
            workload.rollout_message = message
            return changed
        last = workload.last_rollout
        if last is not None and now - last < self.settings.rollout_cooldown:
            return False
        stamp = rfc3339(now)
        body = {"spec": {"template": {"metadata": {"annotations": {keys.RESTARTED_AT: stamp}}}}}
        path = f"/apis/apps/v1/namespaces/{key.namespace}/{plural}/{key.name}"
        regarding = {
            "apiVersion": "apps/v1",
            "kind": key.kind,
            "metadata": {"name": key.name, "namespace": key.namespace},
        }
        try:
            self._kube.patch(path, body, MERGE_PATCH)
        except ApiError as exc:
            workload.rollout_message = f"cannot restart the {key.kind}: {exc}"
            log.warning("rollout of %s failed: %s", key, exc)
            self._event(regarding, "RestartFailed", workload.rollout_message, warning=True)
            if self._metrics is not None:
                self._metrics.rollouts.labels("error").inc()
            return True
        workload.last_rollout = now
        workload.rollout_message = f"restarted at {stamp}: {why}"
        log.info("restarted a workload onto its recommendation: %s: %s", key, why)
        self._event(
            regarding,
            "RestartedForRecommendation",
            f"restarted onto its GPU recommendation ({format_compute(target.compute)}, "
            f"{format_memory(target.memory)}): {why}",
        )
        if self._metrics is not None:
            self._metrics.rollouts.labels("ok").inc()
        return True

    def _event(self, regarding: JSON, reason: str, note: str, *, warning: bool = False) -> None:
        events.event(
            self._kube,
            regarding,
            reason,
            note,
            controller=REPORTING_CONTROLLER,
            instance=self.settings.identity,
            action="Recommending",
            warning=warning,
        )

    def _write_policy_statuses(self, policy_set: PolicySet) -> None:
        namespace = self.settings.namespace
        for obj in self._policies.items():
            desired = policy_status(obj, policy_set.invalid)
            current = obj.get("status") or {}
            if all(current.get(k) == v for k, v in desired.items()):
                continue
            name = (obj.get("metadata") or {}).get("name", "")
            path = f"/apis/{POLICY_API}/namespaces/{namespace}/{POLICY_PLURAL}/{name}/status"
            try:
                self._kube.patch(path, {"status": desired}, MERGE_PATCH)
            except ApiError as exc:
                log.warning("cannot write the status of GPUPolicy %s: %s", name, exc)
                continue
            if desired["valid"] == "False":
                log.warning("GPUPolicy %s is invalid: %s", name, desired["message"])


REPORTING_CONTROLLER: Final = "gpupack.io/recommender"


def recommendation_ref(key: WorkloadKey) -> JSON:
    """The GPURecommendation of `key`, as an Event's `regarding` needs it."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": key.object_name, "namespace": key.namespace},
    }


def change_text(before: Target | None, after: Target) -> str:
    now = f"{format_compute(after.compute)} compute, {format_memory(after.memory)} memory"
    if before is None:
        return f"recommends {now}"
    was = f"{format_compute(before.compute)}, {format_memory(before.memory)}"
    return f"recommends {now} (was {was})"
