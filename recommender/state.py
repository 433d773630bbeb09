"""What the recommender knows about each workload, and the objects it writes: pure.

A workload is the controlling owner `gpupack.objects.workload_of` names (a Deployment
behind its ReplicaSet, a StatefulSet, a Job, an operator's kind, or a bare Pod) in one
namespace: the same key the webhook looks its recommendation up by. `Workload` holds its
history and what was last published; `status_of` builds the GPURecommendation status
(target, confidence, when and why it changed, the checkpoint); `policy_status` says
whether a GPUPolicy object is in force. The controller does the I/O around these.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

from gpupack import keys
from gpupack.codec import parse_time, read_compute, read_memory, rfc3339
from gpupack.errors import ContractError
from gpupack.objects import JSON, Pod, annotations_of, workload_of
from gpupack.policy import BUILTIN, DEFAULT_POLICY, Policy
from gpupack.quantity import format_compute, format_memory
from gpupack.recommendation import Recommendation, object_name, recommendation_object
from recommender.recommend import History, Running, Target

LIVE_PHASES: Final = frozenset({"Pending", "Running"})


@dataclass(frozen=True, slots=True, order=True)
class WorkloadKey:
    namespace: str
    kind: str
    name: str

    @property
    def object_name(self) -> str:
        return object_name(self.kind, self.name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


def managed(pod: JSON) -> bool:
    """A pod the webhook admitted as fractional (it carries the decision id)."""
    return keys.DECISION in annotations_of(pod) and not (pod.get("metadata") or {}).get(
        "deletionTimestamp"
    )


def key_of(pod: JSON) -> WorkloadKey:
    meta = pod.get("metadata") or {}
    kind, name = workload_of(cast(Pod, pod), str(meta.get("name", "")))
    return WorkloadKey(str(meta.get("namespace", "")), kind, name)


def policy_of(pod: JSON, policies: Mapping[str, Policy]) -> Policy:
    """The policy the webhook chose for the pod (its annotation), else the default."""
    name = annotations_of(pod).get(keys.POLICY, "")
    return policies.get(name) or policies.get(DEFAULT_POLICY) or BUILTIN[DEFAULT_POLICY]


def allocation_of(pod: JSON) -> tuple[int | None, int | None]:
    """(compute millis, memory bytes) the pod was given; None where unreadable."""
    annotations = annotations_of(pod)
    try:
        compute = read_compute(annotations)
    except ContractError:
        compute = None
    try:
        memory = read_memory(annotations)
    except ContractError:
        memory = None
    return compute, memory


def running_of(pods: Iterable[JSON], memory_used: Mapping[str, int]) -> Running | None:
    """What the workload's live pods have; `memory_used` maps pod name to the GPU memory
    it uses now. None when no live pod has a readable allocation."""
    count, compute, memory, used = 0, 0, 0, None
    for pod in pods:
        if (pod.get("status") or {}).get("phase") not in LIVE_PHASES:
            continue
        pod_compute, pod_memory = allocation_of(pod)
        if pod_compute is None or pod_memory is None:
            continue
        count += 1
        compute, memory = max(compute, pod_compute), max(memory, pod_memory)
        name = str((pod.get("metadata") or {}).get("name", ""))
        if name in memory_used:
            used = max(used or 0, memory_used[name])
    if count == 0:
        return None
    return Running(pods=count, compute=compute, memory=memory, memory_used=used)


@dataclass
class Workload:
    """One workload's history and what was last published for it."""

    key: WorkloadKey
    history: History
    policy: str = ""
    target: Target | None = None
    last_change: float | None = None
    reason: str = ""
    running: Running | None = None
    last_rollout: float | None = None
    rollout_message: str = ""
    written: JSON = field(default_factory=dict)  # the status last written (or loaded)

    def update(self, target: Target | None, policy: str, now: float) -> bool:
        """Record a new target; True when compute, memory or policy changed."""
        self.target = target
        if target is None:
            return False
        published = self.written
        changed = (
            published.get("compute") != format_compute(target.compute)
            or published.get("memory") != format_memory(target.memory)
            or published.get("policy") != policy
        )
        self.policy = policy
        if changed or self.last_change is None:
            self.last_change = now
            self.reason = target.reason
        return changed


def recommendation_of(workload: Workload) -> Recommendation | None:
    target = workload.target
    if target is None or workload.last_change is None:
        return None
    key = workload.key
    return Recommendation(
        namespace=key.namespace,
        kind=key.kind,
        workload=key.name,
        policy=workload.policy,
        compute=target.compute,
        memory=target.memory,
        confidence=target.confidence,
        last_change=rfc3339(workload.last_change),
        reason=workload.reason,
    )


def object_of(workload: Workload) -> JSON | None:
    """The complete GPURecommendation object to write, None while there is no target."""
    rec = recommendation_of(workload)
    if rec is None:
        return None
    history = workload.history
    extra: dict[str, Any] = {
        "samples": history.samples,
        "history": history.checkpoint(),
    }
    if history.first_sample is not None and history.last_sample is not None:
        extra["firstSample"] = rfc3339(history.first_sample)
        extra["lastSample"] = rfc3339(history.last_sample)
    if workload.running is not None:
        extra["running"] = {
            "pods": workload.running.pods,
            "compute": format_compute(workload.running.compute),
            "memory": format_memory(workload.running.memory),
        }
    if workload.last_rollout is not None:
        extra["lastRollout"] = rfc3339(workload.last_rollout)
    if workload.rollout_message:
        extra["rolloutMessage"] = workload.rollout_message
    return recommendation_object(rec, extra)


def restore(obj: JSON) -> Workload:
    """A workload from its GPURecommendation object. Raises ValueError (or
    ContractError) when the checkpoint does not parse."""
    meta = obj.get("metadata") or {}
    target = (obj.get("spec") or {}).get("targetRef") or {}
    kind, name = target.get("kind"), target.get("name")
    if not isinstance(kind, str) or not isinstance(name, str) or not kind or not name:
        raise ValueError(f"spec.targetRef: expected {{kind, name}}, got {target!r}")
    status = obj.get("status") or {}
    history = History.from_checkpoint(status.get("history") or {})
    workload = Workload(WorkloadKey(str(meta.get("namespace", "")), kind, name), history)
    workload.policy = str(status.get("policy", ""))
    workload.last_change = parse_time(status.get("lastChange"))
    workload.reason = str(status.get("reason", ""))
    workload.last_rollout = parse_time(status.get("lastRollout"))
    workload.rollout_message = str(status.get("rolloutMessage", ""))
    workload.written = dict(status)
    return workload


def policy_status(obj: JSON, invalid: Mapping[str, str]) -> JSON:
    """The status a GPUPolicy object should carry: valid or not (`invalid` is
    `PolicySet.invalid`, which parsed it already), and what applies."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    generation = meta.get("generation")
    if name in invalid:
        fallback = (
            f"the built-in {name} applies"
            if name in BUILTIN
            else "pods naming it get their auto-detected policy"
        )
        status: JSON = {"valid": "False", "message": f"{invalid[name]}; {fallback}"}
    else:
        status = {"valid": "True", "message": "in force"}
    if isinstance(generation, int):
        status["observedGeneration"] = generation
    return status
