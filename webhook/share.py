"""A pod's share of its GPU, as arithmetic: how much compute and memory it gets, and what
holds it there.

Pure. Per dimension, the allocation is a pinned annotation; else the workload's
recommendation when it was computed for the pod's policy and that policy's updateMode is
not Off (clamped to the policy's bounds); else the policy's initial allocation; memory
capped at the GPU the nodeSelector picks (`allocate`). Whether the memory share is
enforced: the pod's annotation, the policy, the install (`memory_enforced`). A
`real-time-mps` share's MPS client limits (`mps_limits`). The patch that writes all this
is `webhook.rewrite`'s; the rules that decide a pod gets a share are `webhook.mutate`'s.
"""

import math
from dataclasses import dataclass
from typing import Final

from gpupack import cuda, keys
from gpupack.codec import read_compute, read_memory
from gpupack.errors import ContractError
from gpupack.objects import PodSpec
from gpupack.policy import (
    OPT_OUT_FIELD,
    ComputeShare,
    MemoryEnforcement,
    Policy,
    Sharing,
    UpdateMode,
)
from gpupack.quantity import MEMORY_FORM, format_compute, format_memory
from gpupack.recommendation import Recommendation

MIB: Final = 2**20


@dataclass(frozen=True, slots=True)
class PodShare:
    compute: int
    memory: int
    source: str  # "pinned", "policy-initial", "recommendation GPURecommendation ...", notes
    recommendation: Recommendation | None = None  # the recommendation applied, if any


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


def enforcement(policy: Policy, *, memory: bool = False) -> str:
    """The `gpupack.io/enforcement` of a pod of `policy`: what holds it to its share
    (`mps`, `memory`, and with the shim the policy's compute pacing), or `accounting`
    where only the scheduler's books do."""
    return cuda.enforcement_value(
        mps=policy.sharing is Sharing.MPS, memory=memory, compute=compute_word(policy, memory)
    )


def compute_word(policy: Policy, memory: bool) -> str | None:
    """What paces a pod of `policy` to its compute share: the shim does, where it is
    loaded (`memory`) and the policy's `compute` is not off."""
    if not memory or policy.compute is ComputeShare.OFF:
        return None
    return cuda.COMPUTE_CAP if policy.compute is ComputeShare.CAP else cuda.COMPUTE_SHARE


def compute_notes(policy: Policy, memory: bool) -> tuple[str, ...]:
    """The audit's word on a compute share the policy asks for and the pod cannot get."""
    if memory or policy.compute is ComputeShare.OFF:
        return ()
    return (
        f"compute: {policy.compute.value} (policy {policy.name}) not applied: the shim that "
        "paces launches is loaded only where memory is enforced",
    )


MEMORY_ENFORCEMENT_FORM: Final = f"{cuda.OPT_OUT_VALUE} or on"


class OptOutForbidden(Exception):
    """A pod asks to run its memory share unenforced where its policy does not allow it."""


def memory_enforced(
    annotations: dict[str, str], policy: Policy, installed: bool
) -> tuple[bool, tuple[str, ...]]:
    """Whether a pod of `policy` is held to its memory share on the GPU, and notes for its
    audit line; `installed`: the install runs the shim's CSI driver (the chart's
    memoryEnforcement.enabled), its default for policies that do not say. The policy's
    memoryEnforcement wins over that default, and nothing is enforced where the install
    does not run the driver. The pod's
    `gpupack.io/memory-enforcement: on` always wins; `off` only where the policy's
    allowMemoryEnforcementOptOut is true (an unenforced pod could fill its GPU), else
    OptOutForbidden. Raises ContractError for another annotation value."""
    asked = annotations.get(keys.MEMORY_ENFORCEMENT)
    word = asked.strip().lower() if asked is not None else None
    if word is not None and word not in ("on", cuda.OPT_OUT_VALUE):
        raise ContractError(keys.MEMORY_ENFORCEMENT, asked, MEMORY_ENFORCEMENT_FORM)
    wanted = installed
    if policy.memory_enforcement is not None:
        wanted = policy.memory_enforcement is MemoryEnforcement.ON
    if word == cuda.OPT_OUT_VALUE:
        if wanted and installed and not policy.allow_memory_opt_out:
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
    if wanted and not installed:
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
