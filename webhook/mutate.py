"""The webhook's pure decision: an admission request in, a Decision (with its patch) out.

No I/O: the Namespace (when the webhook could read it), the policies in force and a
lookup of the workloads' GPURecommendations are passed in (`MutationContext`). The
rules, in order: only CREATE; a pod we already mutated is left alone (so reinvocation
changes nothing), and "already mutated" means it carries this admission's own seal
(`gpupack.seal.reinvoked`), never merely gpupack's annotations; the pod must ask for
exactly one `nvidia.com/gpu` and nothing GPU-like besides; it must be opted in; it must
not be pinned to a node or another scheduler. Then the policy and the allocation are
chosen and the patch is built. The allocation, per dimension: a pinned annotation; else
the workload's recommendation when it was computed for the pod's policy and that
policy's updateMode is not Off (clamped to the policy's bounds); else the policy's
initial allocation; memory capped at the GPU the nodeSelector picks. User-supplied
values of the scheduler-only and webhook-only annotations are stripped on every path,
skipped pods included. A rewritten pod is sealed (`gpupack.io/seal`) and charged its
share as extended resources on its GPU container (`gpupack.io/gpu-compute-milli`,
`gpupack.io/gpu-memory`), so ResourceQuotas bind. A `real-time-mps` pod also gets its
MPS limits and wiring (`webhook.mps`): the CSI volume that holds its GPU's MPS pipes
and shared memory, mounted in each GPU container."""

import math
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, cast

from gpupack import cuda, keys, seal
from gpupack import mps as gpupack_mps
from gpupack.codec import OriginalResources, read_compute, read_memory, write_original_resources
from gpupack.errors import ContractError
from gpupack.gpu_request import GpuScan, GpuSlot, scan_gpus
from gpupack.objects import JSON, Container, Pod, PodSpec, annotations_of, labels_of, workload_of
from gpupack.policy import (
    OPT_OUT_FIELD,
    MemoryEnforcement,
    Policy,
    PolicySet,
    Sharing,
    UpdateMode,
)
from gpupack.pool import metadata_key, scheduling_metadata
from gpupack.quantity import MEMORY_FORM, format_compute, format_memory
from gpupack.recommendation import Recommendation
from webhook import mps, patch, scope
from webhook.cuda import wiring as shim_wiring
from webhook.decision import Decision, Demand, Outcome, Reason, stamped
from webhook.policies import BUILTIN_POLICIES, PolicyChoice, UnknownPolicyError, resolve_policy
from webhook.review import AdmissionRequest

MIB = 2**20
VISIBLE_DEVICES_FIELD = f"metadata.annotations['{keys.GPU_UUID}']"


# (namespace, workload kind, workload name) -> the workload's usable recommendation
RecommendationLookup = Callable[[str, str, str], Recommendation | None]


def no_recommendation(namespace: str, kind: str, name: str) -> Recommendation | None:
    """The lookup without a cluster: no workload has a recommendation."""
    return None


PROCESS_KEY: Final = secrets.token_bytes(32)
# The annotations written per admission, not per plan: the decision id and the seal.
IDENTITY: Final = (keys.DECISION, keys.SEAL)


@dataclass(frozen=True, slots=True)
class MutationContext:
    namespace: JSON | None = None  # the Namespace object, when the webhook could read it
    policy_set: PolicySet = BUILTIN_POLICIES  # built-ins overlaid by the GPUPolicy objects
    recommendation: RecommendationLookup = no_recommendation
    # The decision key the seal is made with (the chart's Secret; a process-local random
    # key when none was given, whose seals the scheduler then refuses) and the time.
    key: bytes = PROCESS_KEY
    now: int = field(default_factory=lambda: int(time.time()))
    mps: bool = True  # the install runs the MPS CSI driver (the chart's mps.enabled)
    # The install runs the memory shim's CSI driver (the chart's memoryEnforcement.enabled):
    # the default for policies that do not say.
    memory_enforcement: bool = False


@dataclass(frozen=True, slots=True)
class PodShare:
    compute: int
    memory: int
    source: str  # "pinned", "policy-initial", "recommendation GPURecommendation ...", notes
    recommendation: Recommendation | None = None  # the recommendation applied, if any


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
    ops, warnings = _with_identity(decision.patch, uid, sealed[keys.SEAL]), decision.warnings
    applies = cuda.enforced(sealed[keys.ENFORCEMENT])
    if applies:
        spec: PodSpec = request.pod.get("spec") or {}
        if cuda.MPS in applies:
            wired = mps.wiring(spec, scan_gpus(spec).slots)
            ops, warnings = ops + wired.ops, warnings + wired.warnings
            spec = with_lists(spec, wired.ops)
        if cuda.MEMORY in applies:
            shim = shim_wiring(spec)
            ops, warnings = ops + shim.ops, warnings + shim.warnings
    return stamped(decision, ops, sealed, demand, warnings)


def with_lists(spec: PodSpec, ops: tuple[JSON, ...]) -> PodSpec:
    """`spec` as `ops` leave it, for ops that set whole lists (`/spec/volumes`,
    `/spec/<containers>/<i>/volumeMounts`, as `webhook.mps` writes them). A copy: the
    request's pod is never changed."""
    out: dict[str, Any] = dict(spec)
    for op in ops:
        tokens = op["path"].split("/")[2:]
        if len(tokens) == 1:
            out[tokens[0]] = op["value"]
        elif len(tokens) == 3:
            field_name, index, key = tokens
            containers = list(out[field_name])
            containers[int(index)] = {**containers[int(index)], key: op["value"]}
            out[field_name] = containers
    return cast(PodSpec, out)


def _with_identity(ops: tuple[JSON, ...], decision: str, sealed: str) -> tuple[JSON, ...]:
    """The plan's patch writing the decision id and the seal too, keeping the annotation
    ops in key order: into the annotations map the plan adds when the pod had none (one
    op, as before), else one `add` each around the plan's own (an `add` replaces a
    user's value: the plan stripped these keys by leaving them to it). The plan's ops
    are shared by every admission of its template and are never changed."""
    start = end = -1
    for index, op in enumerate(ops):
        path = op["path"]
        if path.startswith(OURS):
            end = index
            if start < 0:
                start = index
        elif op["op"] == "add" and path in ("/metadata/annotations", "/metadata"):
            value = dict(op["value"])
            inner = value if path != "/metadata" else dict(value["annotations"])
            inner[keys.DECISION], inner[keys.SEAL] = decision, sealed
            if path == "/metadata":
                value["annotations"] = inner
            return (*ops[:index], patch.add(path, value), *ops[index + 1 :])
    first, last = patch.add(DECISION_PATH, decision), patch.add(SEAL_PATH, sealed)
    if start < 0:
        return (*ops, first, last)
    return (*ops[:start], first, *ops[start : end + 1], last, *ops[end + 1 :])


def _annotation(key: str) -> str:
    return patch.pointer("metadata", "annotations", key)


OURS: Final = _annotation("gpupack.io/")  # the pointers of gpupack's annotations start so
DECISION_PATH: Final = _annotation(keys.DECISION)
SEAL_PATH: Final = _annotation(keys.SEAL)


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
        memory, memory_notes = memory_enforced(annotations, choice.policy, ctx)
    except ContractError as exc:
        return deny(Reason.INVALID_ANNOTATION, f"gpupack: {exc}", choice.policy.name)
    except OptOutForbidden as exc:
        return deny(Reason.OPT_OUT_FORBIDDEN, str(exc), choice.policy.name)

    written, ops = build_patch(
        request, spec, annotations, gpus, choice, allocation, stripped, memory=memory
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


def device_memory_hint(spec: PodSpec) -> int | None:
    """Per-GPU memory when the pod's nodeSelector pins GFD's `nvidia.com/gpu.memory` (MiB)."""
    value = (spec.get("nodeSelector") or {}).get(keys.GFD_MEMORY_MIB)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value) * MIB
    return None


def recommendation_ignored(recommendation: Recommendation, policy: Policy) -> str | None:
    """Why a workload's recommendation does not apply to a pod of `policy`; None if it does."""
    if recommendation.policy != policy.name:
        computed_for = recommendation.policy or "(none)"
        return f"recommendation ignored: computed for policy {computed_for}, pod uses {policy.name}"
    if policy.update_mode is UpdateMode.OFF:
        return f"recommendation ignored: policy {policy.name} has updateMode Off"
    return None


def allocate(
    annotations: dict[str, str],
    spec: PodSpec,
    policy: Policy,
    recommendation: Recommendation | None = None,
) -> PodShare:
    """Per dimension: the pinned value (validated); else the workload's recommendation when
    it applies (`recommendation_ignored`), clamped to the policy's bounds; else the
    policy's initial allocation. Memory that is not pinned is capped at the GPU the
    nodeSelector picks. Never more than the one GPU the pod asked for. Raises
    ContractError for a bad pinned value."""
    pinned_compute = read_compute(annotations)  # 1m..1000m by construction
    pinned_memory = read_memory(annotations)
    device = device_memory_hint(spec)
    if pinned_memory is not None and device is not None and pinned_memory > device:
        raise ContractError(
            keys.GPU_MEMORY,
            annotations[keys.GPU_MEMORY],
            MEMORY_FORM,
            f"more than the {format_memory(device)} of the GPUs the nodeSelector picks",
        )
    notes: list[str] = []
    rec = recommendation
    if rec is not None and (why := recommendation_ignored(rec, policy)) is not None:
        notes.append(why)
        rec = None
    if rec is not None and pinned_compute is not None and pinned_memory is not None:
        notes.append(f"recommendation {rec.describe()} not used: compute and memory are pinned")
        rec = None

    if pinned_compute is not None:
        compute = pinned_compute
    elif rec is not None:
        compute = policy.clamp_compute(rec.compute)
        if compute != rec.compute:
            notes.append(
                f"recommended compute {format_compute(rec.compute)} clamped to "
                f"{format_compute(compute)} (policy {policy.name})"
            )
    else:
        compute = policy.initial_compute
    if pinned_memory is not None:
        memory = pinned_memory
    elif rec is not None:
        memory = policy.clamp_memory(rec.memory)
        if memory != rec.memory:
            notes.append(
                f"recommended memory {format_memory(rec.memory)} clamped to "
                f"{format_memory(memory)} (policy {policy.name})"
            )
    else:
        memory = policy.initial_memory

    sources = []
    if pinned_compute is not None or pinned_memory is not None:
        sources.append("pinned")
    if rec is not None:
        sources.append(f"recommendation {rec.describe()}")
    elif pinned_compute is None or pinned_memory is None:
        sources.append("policy-initial")
    sources.extend(notes)
    if pinned_memory is None and device is not None and memory > device:
        memory = device
        sources.append(f"memory capped at the node selector's {format_memory(device)}")
    return PodShare(compute, memory, ", ".join(sources), rec)


def strip_ops(stripped: Iterable[str]) -> Iterator[JSON]:
    """Remove the annotations `stripped` (user-written values of gpupack's own keys)."""
    return (patch.remove(patch.pointer("metadata", "annotations", k)) for k in stripped)


def _charge_ops(container: Container, slot: GpuSlot, allocation: PodShare) -> list[JSON]:
    """Charge the GPU container its share as the quota's extended resources, in limits and
    requests (an extended resource's request must equal its limit)."""
    charge = {
        keys.RESOURCE_COMPUTE: str(allocation.compute),
        keys.RESOURCE_MEMORY: format_memory(allocation.memory),
    }
    resources = container.get("resources") or {}
    ops: list[JSON] = []
    for section in ("limits", "requests"):
        base = patch.pointer("spec", slot.field, slot.index, "resources", section)
        if isinstance(resources.get(section), dict):
            ops.extend(patch.add(f"{base}/{patch.escape(k)}", v) for k, v in charge.items())
        else:
            ops.append(patch.add(base, dict(charge)))
    return ops


def _env_var(name: str, value: str) -> JSON:
    return {"name": name, "value": value}


def gpu_env(policy: Policy, allocation: PodShare, *, memory: bool = False) -> list[JSON]:
    """Environment for the GPU container, in the order it is written: its GPU, and where
    `memory` holds it to its share, the driver's own memory limit (nodes with driver
    r615 or newer and the container toolkit's memory-limit hook enforce it)."""
    env: list[JSON] = [
        {
            "name": keys.ENV_VISIBLE_DEVICES,
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": VISIBLE_DEVICES_FIELD}},
        },
        _env_var(keys.ENV_DRIVER_CAPABILITIES, keys.DEFAULT_DRIVER_CAPABILITIES),
    ]
    if policy.sharing is Sharing.MPS:
        for name, value in mps_limits(allocation.compute, allocation.memory).items():
            env.append(_env_var(name, value))
        env.extend(gpupack_mps.environment())
    if memory:
        env.extend(cuda.memory_environment(allocation.memory))
    return env


def enforcement(policy: Policy, *, memory: bool = False) -> str:
    """The `gpupack.io/enforcement` of a pod of `policy`: what holds it to its share
    (`mps`, `memory`, both), or `accounting` where only the scheduler's books do."""
    return cuda.enforcement_value(mps=policy.sharing is Sharing.MPS, memory=memory)


MEMORY_ENFORCEMENT_FORM: Final = f"{cuda.OPT_OUT_VALUE} or on"


class OptOutForbidden(Exception):
    """A pod asks to run its memory share unenforced where its policy does not allow it."""


def memory_enforced(
    annotations: dict[str, str], policy: Policy, ctx: MutationContext
) -> tuple[bool, tuple[str, ...]]:
    """Whether a pod of `policy` is held to its memory share on the GPU, and notes for its
    audit line. The policy's memoryEnforcement wins over the install's default, and
    nothing is enforced where the install does not run the shim's CSI driver. The pod's
    `gpupack.io/memory-enforcement: on` always wins; `off` only where the policy's
    allowMemoryEnforcementOptOut is true (an unenforced pod could fill its GPU), else
    OptOutForbidden. Raises ContractError for another annotation value."""
    asked = annotations.get(keys.MEMORY_ENFORCEMENT)
    word = asked.strip().lower() if asked is not None else None
    if word is not None and word not in ("on", cuda.OPT_OUT_VALUE):
        raise ContractError(keys.MEMORY_ENFORCEMENT, asked, MEMORY_ENFORCEMENT_FORM)
    wanted = ctx.memory_enforcement
    if policy.memory_enforcement is not None:
        wanted = policy.memory_enforcement is MemoryEnforcement.ON
    if word == cuda.OPT_OUT_VALUE:
        if wanted and ctx.memory_enforcement and not policy.allow_memory_opt_out:
            raise OptOutForbidden(
                f"gpupack: {keys.MEMORY_ENFORCEMENT}: {asked} is not allowed by policy "
                f"{policy.name}: its GPUPolicy's {OPT_OUT_FIELD} is false, so its pods are "
                "held to their GPU memory share (gpupack.io/gpu-memory). Remove the "
                f"annotation, ask for more memory, or have an operator set {OPT_OUT_FIELD}: "
                "true on the policy"
            )
        return False, (f"memory enforcement off ({keys.MEMORY_ENFORCEMENT}: {asked})",)
    if word == "on":
        wanted = True
    if wanted and not ctx.memory_enforcement:
        return False, (
            f"memory enforcement asked for ({keys.MEMORY_ENFORCEMENT}, or policy "
            f"{policy.name}), but this install does not run it (the chart's "
            "memoryEnforcement.enabled): the share is accounting only",
        )
    return wanted, ()


def mps_limits(compute: int, memory: int) -> dict[str, str]:
    """The MPS client limits of a share: its compute as a percentage of the GPU's threads
    (rounded up), its memory as the pinned limit of device 0 (the one the pod sees)."""
    return {
        keys.ENV_MPS_THREAD_PERCENTAGE: str(max(1, math.ceil(compute / 10))),
        keys.ENV_MPS_MEMORY_LIMIT: f"0={max(1, memory // MIB)}M",
    }


def _env_ops(container: Container, base: str, wanted: list[JSON]) -> list[JSON]:
    """Replace our variables where the user set them (keeping their position), append the
    rest; a user's NVIDIA_DRIVER_CAPABILITIES is kept (they may need graphics or video)."""
    env = container.get("env")
    if not env:
        return [patch.add(f"{base}/env", wanted)]
    ops: list[JSON] = []
    last_index = {str(var.get("name")): i for i, var in enumerate(env) if isinstance(var, dict)}
    for var in wanted:
        index = last_index.get(var["name"])
        if index is None:
            ops.append(patch.add(f"{base}/env/-", var))
        elif var["name"] != keys.ENV_DRIVER_CAPABILITIES and env[index] != var:
            ops.append(patch.replace(f"{base}/env/{index}", var))
    return ops


def _set_annotations(pod: Pod, annotations: dict[str, str], wanted: dict[str, str]) -> list[JSON]:
    meta = pod.get("metadata")
    if meta is None:
        return [patch.add("/metadata", {"annotations": wanted})]
    if "annotations" not in meta or meta.get("annotations") is None:
        return [patch.add("/metadata/annotations", wanted)]
    ops = []
    for key, value in wanted.items():  # built in key order by build_patch: deterministic
        path = patch.pointer("metadata", "annotations", key)
        if key not in annotations:
            ops.append(patch.add(path, value))
        elif annotations[key] != value:
            ops.append(patch.replace(path, value))
    return ops


def build_patch(
    request: AdmissionRequest,
    spec: PodSpec,
    annotations: dict[str, str],
    gpus: GpuScan,
    choice: PolicyChoice,
    allocation: PodShare,
    stripped: tuple[str, ...],
    *,
    memory: bool = False,
) -> tuple[dict[str, str], tuple[JSON, ...]]:
    """The annotations a rewrite writes (but `IDENTITY`) and its patch; `memory`: the pod
    is held to its memory share (`memory_enforced`)."""
    ops: list[JSON] = []
    original = OriginalResources(scheduler_name=spec.get("schedulerName"))
    for slot in gpus.slots:
        container = spec[slot.field][slot.index]  # type: ignore[literal-required]
        removed = {}
        for section in slot.where:
            values: dict[str, Any] = container["resources"][section]
            removed[section] = {keys.NVIDIA_GPU: values[keys.NVIDIA_GPU]}
            ops.append(
                patch.remove(
                    patch.pointer(
                        "spec", slot.field, slot.index, "resources", section, keys.NVIDIA_GPU
                    )
                )
            )
        target = original.containers if slot.field == "containers" else original.init_containers
        target[slot.name] = removed
        if slot.count > 0:
            ops.extend(_charge_ops(container, slot, allocation))
    scheduler_path = "/spec/schedulerName"
    if "schedulerName" in spec:
        if spec["schedulerName"] != keys.SCHEDULER_NAME:
            ops.append(patch.replace(scheduler_path, keys.SCHEDULER_NAME))
    else:
        ops.append(patch.add(scheduler_path, keys.SCHEDULER_NAME))
    wanted = {  # in sorted key order, so the ops come out sorted
        keys.ENFORCEMENT: enforcement(choice.policy, memory=memory),
        keys.GPU_COMPUTE: format_compute(allocation.compute),
        keys.GPU_MEMORY: format_memory(allocation.memory),
        keys.ORIGINAL_RESOURCES: write_original_resources(original),
        keys.POLICY: choice.policy.name,
    }
    # A stripped key we write anyway (here or in `stamp`) is replaced (`add` of an
    # existing member), not removed.
    kept = {k: v for k, v in annotations.items() if k not in stripped}
    ops.extend(strip_ops(k for k in stripped if k not in wanted and k not in IDENTITY))
    ops.extend(_set_annotations(request.pod, kept, wanted))
    env = gpu_env(choice.policy, allocation, memory=memory)
    for slot in gpus.slots:
        if slot.count > 0:
            container = spec[slot.field][slot.index]  # type: ignore[literal-required]
            ops.extend(_env_ops(container, patch.pointer("spec", slot.field, slot.index), env))
    return wanted, tuple(ops)
