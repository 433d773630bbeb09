"""The webhook's pure decision: an admission request in, a Decision (with its patch) out.

No I/O: the Namespace (when the webhook could read it), the policies in force and a
lookup of the workloads' GPURecommendations are passed in (`MutationContext`). The
rules, in order: only CREATE; a pod we already mutated is left alone (so reinvocation
changes nothing), and "already mutated" means it carries this admission's own seal
(`gpupack.seal.reinvoked`), never merely gpupack's annotations; the pod must ask for
exactly one `nvidia.com/gpu` and nothing GPU-like besides; it must be opted in; it must
not be pinned to a node or another scheduler. Then the policy and the share are chosen
(`webhook.share`) and the patch is built (`webhook.rewrite`). User-supplied values of
the scheduler-only and webhook-only annotations are stripped on every path, skipped pods
included. A rewritten pod is sealed (`gpupack.io/seal`) and charged its share as
extended resources on its GPU container (`gpupack.io/gpu-compute-milli`,
`gpupack.io/gpu-memory`), so ResourceQuotas bind. `stamp` adds what is per admission,
not per template: the decision id and the seal, and for a `real-time-mps` pod its MPS
wiring (`webhook.mps`: the CSI volume that holds its GPU's MPS pipes and shared memory,
mounted in each GPU container), for a memory-enforced one the shim's (`webhook.cuda`)."""

import functools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupack import cuda, keys, seal
from gpupack.errors import ContractError
from gpupack.gpu_request import scan_gpus
from gpupack.objects import JSON, PodSpec, annotations_of, labels_of, workload_of
from gpupack.policy import PolicySet, Sharing
from gpupack.pool import metadata_key, scheduling_metadata
from gpupack.quantity import format_compute, format_memory
from gpupack.recommendation import Recommendation
from webhook import mps, scope
from webhook.cuda import wiring as shim_wiring
from webhook.decision import Decision, Demand, Outcome, Reason, stamped
from webhook.policies import BUILTIN_POLICIES, UnknownPolicyError, resolve_policy
from webhook.review import AdmissionRequest
from webhook.rewrite import build_patch, strip_ops, with_identity, with_lists
from webhook.share import OptOutForbidden, allocate, compute_notes, memory_enforced

# (namespace, workload kind, workload name) -> the workload's usable recommendation
RecommendationLookup = Callable[[str, str, str], Recommendation | None]


def no_recommendation(namespace: str, kind: str, name: str) -> Recommendation | None:
    """The lookup without a cluster: no workload has a recommendation."""
    return None


@functools.cache
def process_key() -> bytes:
    """A decision key random to this process, made on first use (no work at import):
    seals made with it are refused by the scheduler, which does not have it."""
    return secrets.token_bytes(32)


@dataclass(frozen=True, slots=True)
class MutationContext:
    namespace: JSON | None = None  # the Namespace object, when the webhook could read it
    policy_set: PolicySet = BUILTIN_POLICIES  # built-ins overlaid by the GPUPolicy objects
    recommendation: RecommendationLookup = no_recommendation
    # The decision key the seal is made with (the chart's Secret; a process-local random
    # key when none was given, whose seals the scheduler then refuses) and the time.
    key: bytes = field(default_factory=process_key)
    now: int = field(default_factory=lambda: int(time.time()))
    mps: bool = True  # the install runs the MPS CSI driver (the chart's mps.enabled)
    # The install runs the memory shim's CSI driver (the chart's memoryEnforcement.enabled):
    # the default for policies that do not say.
    memory_enforcement: bool = False


Planner = Callable[[AdmissionRequest, "MutationContext"], Decision]


def decide(
    request: AdmissionRequest, ctx: MutationContext, plan: Planner | None = None
) -> Decision:
    """The decision for one admission: a pod carrying this admission's own seal is left
    alone; any other gets its plan (`plan_decision`, or `plan`: the same function
    memoized, `webhook.plans`), stamped with this admission's identity (`stamp`)."""
    done = already_mutated(request, ctx)
    if done is not None:
        return done
    return stamp((plan_decision if plan is None else plan)(request, ctx), request, ctx)


def already_mutated(request: AdmissionRequest, ctx: MutationContext) -> Decision | None:
    """The decision for a pod this admission already rewrote (reinvocation), else None.

    A pod whose seal verifies but was issued more than `seal.REINVOCATION` seconds from
    `ctx.now` is denied: its sealed annotations were copied from another pod. Replicas
    issue and check seals by the API server's clock (`ClusterPort.now`), so a
    reinvocation reaching another replica is as fresh there; only a replica that has not
    reached the API server yet keeps its node's time, which the message names too.
    Stripping the seal, as for any other user-written gpupack annotation, would leave a
    pod that gpupack-scheduler never places; a denial is seen at once, and the pod's
    controller tries again."""
    pod = request.pod
    spec: PodSpec = pod.get("spec") or {}
    annotations = annotations_of(pod)
    if not (
        request.operation == "CREATE"
        and keys.SEAL in annotations
        and spec.get("schedulerName") == keys.SCHEDULER_NAME
    ):
        return None
    try:
        issued = seal.verify(ctx.key, request.namespace, annotations)
    except seal.SealError:
        return None  # not gpupack's seal: stripped with the rest of the user's values
    owner_kind, owner_name = workload_of(pod, request.name)
    if abs(ctx.now - issued) > seal.REINVOCATION:
        return Decision(
            Outcome.DENIED,
            Reason.STALE_SEAL,
            f"gpupack: the pod carries a gpupack seal issued {ctx.now - issued:+d} s from now "
            f"(more than {seal.REINVOCATION} s): its gpupack.io annotations were copied from "
            "another pod (remove them). Seals keep the API server's time; a webhook replica "
            "that has not reached the API server keeps its node's (check the nodes' time "
            "sync)",
            owner_kind=owner_kind,
            owner_name=owner_name,
        )
    return Decision(
        Outcome.SKIPPED,
        Reason.ALREADY_MUTATED,
        f"already mutated (decision {annotations.get(keys.DECISION)}, sealed)",
        owner_kind=owner_kind,
        owner_name=owner_name,
    )


def stamp(decision: Decision, request: AdmissionRequest, ctx: MutationContext) -> Decision:
    """A planned rewrite made this admission's: its decision id (the admission's uid) and
    the seal over it and the planned annotations, issued now with the decision key; and,
    for a `real-time-mps` pod, the MPS wiring of its own volumes (`webhook.mps`). That
    is per pod, not per template: the API server gives each pod's service-account token
    volume a name of its own before the webhook sees it."""
    if decision.outcome is not Outcome.MUTATED:
        return decision
    uid = request.uid
    sealed = {keys.DECISION: uid, **decision.annotations}
    sealed[keys.SEAL] = seal.seal(ctx.key, request.namespace, sealed, ctx.now)
    demand = decision.demand
    if demand is not None:  # as `replace(demand, decision_id=uid)`, at a fraction of its cost
        demand = Demand(
            uid,
            demand.pool,
            demand.scheduling,
            demand.compute,
            demand.memory,
            demand.namespace,
            demand.workload,
            demand.exclusive,
        )
    ops, warnings = with_identity(decision.patch, uid, sealed[keys.SEAL]), decision.warnings
    applies = cuda.enforced(sealed[keys.ENFORCEMENT])
    if applies:
        spec: PodSpec = request.pod.get("spec") or {}
        if cuda.MPS in applies:
            wired = mps.wiring(spec, decision.slots)
            ops, warnings = ops + wired.ops, warnings + wired.warnings
            spec = with_lists(spec, wired.ops)
        if cuda.MEMORY in applies:
            shim = shim_wiring(spec, compute=cuda.compute_mode(applies) is not None)
            ops, warnings = ops + shim.ops, warnings + shim.warnings
    return stamped(decision, ops, sealed, demand, warnings)


def plan_decision(request: AdmissionRequest, ctx: MutationContext) -> Decision:
    """Everything about an admission but what `stamp` adds (its identity, and an MPS
    pod's volume wiring): what `decide` answers, from the request's operation, namespace,
    name and pod (never its volumes, volume mounts or managed fields) and the context's
    Namespace, policies, recommendation and MPS setting (never its key or time). Pods of
    one template in one context get the same plan."""
    pod = request.pod
    spec: PodSpec = pod.get("spec") or {}
    annotations = annotations_of(pod)
    owner_kind, owner_name = workload_of(pod, request.name)
    forbidden = keys.SCHEDULER_ONLY + keys.WEBHOOK_ONLY
    stripped = tuple(key for key in forbidden if key in annotations)

    def skip(reason: Reason, message: str) -> Decision:
        return Decision(
            Outcome.SKIPPED,
            reason,
            message,
            patch=tuple(strip_ops(stripped)),
            owner_kind=owner_kind,
            owner_name=owner_name,
            stripped=stripped,
        )

    def deny(reason: Reason, message: str, policy: str | None = None) -> Decision:
        return Decision(
            Outcome.DENIED,
            reason,
            message,
            owner_kind=owner_kind,
            owner_name=owner_name,
            policy=policy,
        )

    if request.operation != "CREATE":
        return skip(Reason.NOT_CREATE, f"operation {request.operation} is not handled")
    try:
        gpus = scan_gpus(spec)
    except ContractError as exc:
        return skip(Reason.INVALID_GPU_REQUEST, str(exc))
    out = scope.gpu_out_of_scope(gpus)
    if out is None:
        try:
            out = scope.opt_in(labels_of(pod), ctx.namespace)
        except ContractError as exc:
            out = (Reason.NOT_OPTED_IN, str(exc))
    out = out or scope.scheduling_out_of_scope(spec)
    if out is not None:
        return skip(*out)

    try:
        choice = resolve_policy(pod, owner_kind, ctx.namespace, ctx.policy_set)
    except ContractError as exc:
        return deny(Reason.INVALID_ANNOTATION, f"gpupack: {exc}")
    except UnknownPolicyError as exc:
        return deny(Reason.UNKNOWN_POLICY, f"gpupack: {exc}")
    if choice.policy.sharing is Sharing.MPS and not ctx.mps:
        return skip(
            Reason.MPS_OFF,
            f"policy {choice.policy.name} shares a GPU through CUDA MPS, which this install "
            "turned off (the chart's mps.enabled): the pod keeps its whole GPU",
        )
    recommendation = ctx.recommendation(request.namespace, owner_kind, owner_name)
    try:
        allocation = allocate(annotations, spec, choice.policy, recommendation)
        memory, memory_notes = memory_enforced(annotations, choice.policy, ctx.memory_enforcement)
        memory_notes += compute_notes(choice.policy, memory)
    except ContractError as exc:
        return deny(Reason.INVALID_ANNOTATION, f"gpupack: {exc}", choice.policy.name)
    except OptOutForbidden as exc:
        return deny(Reason.OPT_OUT_FORBIDDEN, str(exc), choice.policy.name)

    written, ops = build_patch(
        pod, spec, annotations, gpus, choice, allocation, stripped, memory=memory
    )
    slot = next(s for s in gpus.slots if s.count > 0)
    workload = f"{owner_kind}/{owner_name}"
    scheduling = scheduling_metadata(
        spec, mps=choice.policy.sharing is Sharing.MPS, unenforced=not memory
    )
    return Decision(
        Outcome.MUTATED,
        Reason.MUTATED,
        f"shares a GPU: {format_compute(allocation.compute)} compute, "
        f"{format_memory(allocation.memory)} memory ({choice.policy.name}); "
        f"enforcement {written[keys.ENFORCEMENT]}",
        patch=ops,
        annotations=written,
        policy=choice.policy.name,
        policy_source=choice.source,
        policy_origin=choice.origin,
        compute=allocation.compute,
        memory=allocation.memory,
        allocation_source=allocation.source,
        recommendation=allocation.recommendation,
        gpu_request={"container": slot.name, "count": slot.count, "in": list(slot.where)},
        owner_kind=owner_kind,
        owner_name=owner_name,
        stripped=stripped,
        warnings=choice.warnings + memory_notes,
        slots=gpus.slots,
        demand=Demand(
            decision_id="",  # the admission's, stamped
            pool=metadata_key(scheduling),
            scheduling=scheduling,
            compute=allocation.compute,
            memory=allocation.memory,
            namespace=request.namespace,
            workload=workload,
            exclusive=choice.policy.sharing is Sharing.MPS,
        ),
    )
