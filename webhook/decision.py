"""The values the webhook's decision produces: what happened to a pod, and why.

`Decision` is the output of the pure core (`webhook.mutate.decide`); `Demand` is the part
of it the webhook's capacity planner reads (`webhook.capacity`); `CapacityOutcome` is
that planner's answer: whether the pod's pool holds it, or how many GPUs it lacks (the
webhook creates no capacity pods). The audit line is built from all three.
"""

from dataclasses import dataclass, field
from enum import StrEnum

from gpupack.gpu_request import GpuSlot
from gpupack.objects import JSON
from gpupack.recommendation import Recommendation


class Outcome(StrEnum):
    MUTATED = "mutated"
    SKIPPED = "skipped"
    DENIED = "denied"


class Reason(StrEnum):
    """A closed set of reasons: the audit log's `reason` and the metrics' label."""

    MUTATED = "mutated"
    NOT_CREATE = "not-create"
    NO_GPU = "no-gpu"
    OPTED_OUT = "opted-out"
    NOT_OPTED_IN = "not-opted-in"
    MULTIPLE_GPUS = "multiple-gpus"
    OTHER_GPU_RESOURCE = "other-gpu-resource"
    NODE_NAME_SET = "node-name-set"
    OTHER_SCHEDULER = "other-scheduler"
    ALREADY_MUTATED = "already-mutated"
    STALE_SEAL = "stale-seal"  # a seal of ours, issued too far from now: denied
    INVALID_GPU_REQUEST = "invalid-gpu-request"
    INVALID_ANNOTATION = "invalid-annotation"
    UNKNOWN_POLICY = "unknown-policy"
    INTERNAL_ERROR = "internal-error"
    MPS_OFF = "mps-off"
    OPT_OUT_FORBIDDEN = "opt-out-forbidden"  # memory enforcement off where the policy forbids


@dataclass(frozen=True, slots=True)
class Demand:
    """One fractional pod's claim on its pool, as the capacity manager sees it."""

    decision_id: str  # the admission uid, also written as gpupack.io/decision
    pool: str  # gpupack.pool.pool_key of the pod spec
    scheduling: JSON  # gpupack.pool.scheduling_metadata of the pod spec
    compute: int  # millis of one GPU
    memory: int  # bytes
    namespace: str
    workload: str  # "Kind/name" of the controlling owner, or "Pod/name"
    exclusive: bool  # real-time-mps: the GPU may host only this workload


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    reason: Reason
    message: str  # one sentence a person can act on
    patch: tuple[JSON, ...] = ()
    # The gpupack annotations a rewrite writes (`webhook.rewrite.build_patch`; the decision
    # id and the seal once stamped).
    annotations: dict[str, str] = field(default_factory=dict)
    policy: str | None = None
    policy_source: str | None = None  # "pod-annotation", "namespace-annotation", "auto: ..."
    policy_origin: str | None = None  # "GPUPolicy", "built-in", "built-in (GPUPolicy ... invalid)"
    compute: int | None = None
    memory: int | None = None
    allocation_source: str | None = None  # "pinned", "policy-initial", "recommendation ..."
    recommendation: Recommendation | None = None  # the workload's recommendation, if applied
    gpu_request: JSON | None = None  # {"container": name, "count": 1, "in": "limits"}
    owner_kind: str = ""
    owner_name: str = ""
    stripped: tuple[str, ...] = ()  # scheduler-only annotations removed from user input
    warnings: tuple[str, ...] = ()
    demand: Demand | None = None
    # The pod's GPU containers as the plan scanned them (`scan_gpus`): what `stamp`'s
    # per-pod wiring mounts into, without scanning the pod again.
    slots: tuple[GpuSlot, ...] = ()


@dataclass(frozen=True, slots=True)
class CapacityOutcome:
    """What the capacity plan said for one admission (`webhook.capacity`)."""

    # "sufficient" (the pool's GPUs hold the pod), "needed" (it lacks GPUs; the scheduler
    # creates them), "no-cluster", "not-synced", "error"
    verdict: str
    detail: str = ""
    extra: JSON = field(default_factory=dict)


def stamped(
    decision: Decision,
    patch: tuple[JSON, ...],
    annotations: dict[str, str],
    demand: Demand | None,
    warnings: tuple[str, ...],
) -> Decision:
    """`dataclasses.replace(decision, patch=..., annotations=..., demand=...,
    warnings=...)`, built directly: `replace` walks the fields' metadata on every call, a
    third of stamping an admission. Every other field is carried over (a test holds it
    to `replace` for a decision with every field set)."""
    d = decision
    return Decision(
        d.outcome,
        d.reason,
        d.message,
        patch,
        annotations,
        d.policy,
        d.policy_source,
        d.policy_origin,
        d.compute,
        d.memory,
        d.allocation_source,
        d.recommendation,
        d.gpu_request,
        d.owner_kind,
        d.owner_name,
        d.stripped,
        warnings,
        demand,
        d.slots,
    )
