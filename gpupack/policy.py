"""The policy model and the six built-in policies (DESIGN.md, Policies).

Initial memory allocations stay at or below 12 GiB so that they fit the smallest common
data-centre GPUs (T4: 15 GiB) without knowing the device at admission time.

A policy is data: how much history the recommender looks at, which percentile plus
how much headroom becomes the allocation, the bounds, the allocation a workload gets
before there is any history, whether its GPU may be shared with other workloads, and
how the recommendation is applied (`update_mode`), and whether the scheduler may move
its pods to empty part-used GPUs (`consolidation`). Operators override these with
`GPUPolicy` objects (`policy_from_object`); a built-in applies wherever no valid object
of its name exists (`effective_policies`).
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from gpupack.errors import ContractError
from gpupack.quantity import format_compute, format_memory, parse_compute, parse_memory

GiB: Final = 2**30
DAY: Final = 86_400
MIN_HISTORY_WINDOW: Final = 60
MIN_CONSOLIDATION_WINDOW: Final = 10


class UpdateMode(StrEnum):
    """What the recommendation does to a workload's pods (the spelling of VPA's modes)."""

    OFF = "Off"  # computed and published, never applied: new pods get the initial allocation
    INITIAL = "Initial"  # the webhook applies it to the workload's new pods (the default)
    AUTO = "Auto"  # Initial, plus a rollout restart when running pods drift far from it


class Sharing(StrEnum):
    """How a GPU is shared and how the shares are enforced."""

    SHARED = "shared"  # any workloads of the pool share a GPU; shares are accounting only
    MPS = "mps"  # CUDA MPS limits; a GPU only hosts pods of one workload


# The GPUPolicy field that lets a pod turn memory enforcement off (Policy.allow_memory_opt_out).
OPT_OUT_FIELD: Final = "allowMemoryEnforcementOptOut"


class MemoryEnforcement(StrEnum):
    """Whether a policy's pods are held to their memory share on the GPU (the memory shim,
    and the driver's own limit where a node has it; docs/isolation.md)."""

    ON = "On"
    OFF = "Off"  # the share is the scheduler's accounting only


class ComputeShare(StrEnum):
    """What a policy's pods' compute share (`gpupack.io/gpu-compute`) does on the GPU: the
    memory shim paces their kernel launches (docs/isolation.md, "Compute shares")."""

    OFF = "off"  # the GPU's own time-slicing: pods with work get equal time
    SHARE = "share"  # pods with work get GPU time in proportion to their shares; idle time
    # goes to whoever has work
    CAP = "cap"  # as share, and a pod never runs past its share, even alone


class ConsolidationMode(StrEnum):
    """Whether the scheduler may evict a policy's pods to empty part-used GPUs (the
    trade-off of Karpenter's `consolidationPolicy`: GPUs saved against restarts)."""

    OFF = "Off"  # never moved: a pod keeps its GPU until it ends
    IDLE = "IdleGPUs"  # moved only off GPUs whose shares add up to at most `idle_below`
    ON = "On"  # moved off any GPU whose every share fits on GPUs that stay held


@dataclass(frozen=True, slots=True)
class Consolidation:
    """A policy's consolidation: the mode and the disruption budget it spends."""

    mode: ConsolidationMode = ConsolidationMode.OFF
    idle_below: float = 0.25  # IdleGPUs: booked compute and memory at most this fraction
    evictions: int = 1  # per workload in any `window_seconds`
    window_seconds: int = 600
    allow_mps: bool = False  # real-time-mps pods are moved only when this says so
    # A workload is moved only while at least this many of its pods run: a server of one
    # replica is down while its pod moves; one of two keeps serving (its
    # PodDisruptionBudget, honoured by the Eviction API, says how many must stay).
    min_replicas: int = 1

    def __post_init__(self) -> None:
        if self.min_replicas < 1:
            raise ContractError(
                "consolidation.minReplicas", self.min_replicas, "a whole number of 1 or more"
            )
        if not 0 < self.idle_below <= 1:
            raise ContractError("consolidation.idleBelow", self.idle_below, "a fraction in (0, 1]")
        if self.evictions < 1:
            raise ContractError(
                "consolidation.evictionsPerWindow", self.evictions, "a whole number of 1 or more"
            )
        if self.window_seconds < MIN_CONSOLIDATION_WINDOW:
            raise ContractError(
                "consolidation.windowSeconds",
                self.window_seconds,
                f"at least {MIN_CONSOLIDATION_WINDOW} seconds",
            )


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    history_window_seconds: int
    percentile: float  # 0 < p <= 100
    compute_headroom: float  # fraction added on top of the percentile, 0.2 = +20 %
    memory_headroom: float
    min_compute: int  # millis of one GPU
    max_compute: int
    min_memory: int  # bytes
    max_memory: int | None  # None: up to the device's memory
    initial_compute: int  # before any history
    initial_memory: int
    sharing: Sharing = Sharing.SHARED
    update_mode: UpdateMode = UpdateMode.INITIAL
    consolidation: Consolidation = Consolidation()
    # None: the install's default (the chart's memoryEnforcement.enabled).
    memory_enforcement: MemoryEnforcement | None = None
    # Whether a pod may turn enforcement off with gpupack.io/memory-enforcement: off. Off by
    # default: an unenforced pod could fill its GPU, so only an operator may allow it.
    allow_memory_opt_out: bool = False
    # Off by default until measured on a GPU (docs/isolation.md, "Compute shares").
    compute: ComputeShare = ComputeShare.OFF

    def __post_init__(self) -> None:
        key = f"policy {self.name}"
        moves = self.consolidation.mode is not ConsolidationMode.OFF
        if self.sharing is Sharing.MPS and moves and not self.consolidation.allow_mps:
            raise ContractError(
                f"{key} consolidation.mode",
                self.consolidation.mode.value,
                "Off for an mps policy, unless consolidation.allowMPS is true (moving a "
                "real-time-mps pod restarts a latency-critical server)",
            )
        if self.sharing is Sharing.MPS and self.compute is not ComputeShare.OFF:
            raise ContractError(
                f"{key} compute",
                self.compute.value,
                "off for an mps policy (MPS holds its pods to their compute share itself)",
            )
        if not 1 <= self.min_compute <= self.initial_compute <= self.max_compute <= 1000:
            raise ContractError(key, self, "1 <= min_compute <= initial_compute <= max <= 1000")
        max_memory = self.max_memory if self.max_memory is not None else self.initial_memory
        if not 0 < self.min_memory <= self.initial_memory <= max_memory:
            raise ContractError(key, self, "0 < min_memory <= initial_memory <= max_memory")
        if not 0 < self.percentile <= 100:
            raise ContractError(key, self.percentile, "a percentile in (0, 100]")
        if self.history_window_seconds < MIN_HISTORY_WINDOW:
            raise ContractError(
                key, self.history_window_seconds, f"at least {MIN_HISTORY_WINDOW} seconds"
            )
        if self.compute_headroom < 0 or self.memory_headroom < 0:
            raise ContractError(key, self, "headrooms of 0 or more (0.2 = +20 %)")

    def clamp_compute(self, millis: int) -> int:
        return max(self.min_compute, min(self.max_compute, millis))

    def clamp_memory(self, nbytes: int) -> int:
        upper = self.max_memory if self.max_memory is not None else nbytes
        return max(self.min_memory, min(upper, nbytes))


# The built-ins' consolidation (docs/scheduler.md, "What the bill depends on"): pods that
# tolerate a restart are moved to empty GPUs and nodes, at most two pods of a workload in
# ten minutes (two replicas often share a GPU, and emptying it moves both); a real-time
# server only while another replica of it keeps serving; training (loses progress) and
# real-time-mps (one fault ends every client) never.
MOVED: Final = Consolidation(ConsolidationMode.ON, evictions=2)
MOVED_IF_REPLICATED: Final = Consolidation(ConsolidationMode.ON, evictions=2, min_replicas=2)

BUILTIN: Final[dict[str, Policy]] = {
    p.name: p
    for p in (
        Policy(
            name="real-time",
            description="model serving, latency-sensitive inference",
            history_window_seconds=14 * DAY,
            percentile=99.0,
            compute_headroom=0.30,
            memory_headroom=0.25,
            min_compute=100,
            max_compute=1000,
            min_memory=1 * GiB,
            max_memory=None,
            initial_compute=500,
            initial_memory=8 * GiB,
            consolidation=MOVED_IF_REPLICATED,
        ),
        Policy(
            name="real-time-mps",
            description="low-latency, high-throughput inference with CUDA MPS",
            history_window_seconds=14 * DAY,
            percentile=99.0,
            compute_headroom=0.30,
            memory_headroom=0.25,
            min_compute=100,
            max_compute=1000,
            min_memory=1 * GiB,
            max_memory=None,
            initial_compute=500,
            initial_memory=8 * GiB,
            sharing=Sharing.MPS,
        ),
        Policy(
            name="near-real-time",
            description="inference with stable load",
            history_window_seconds=7 * DAY,
            percentile=95.0,
            compute_headroom=0.15,
            memory_headroom=0.15,
            min_compute=100,
            max_compute=1000,
            min_memory=1 * GiB,
            max_memory=None,
            initial_compute=400,
            initial_memory=8 * GiB,
            consolidation=MOVED,
        ),
        Policy(
            name="batch",
            description="offline scoring, batch inference",
            history_window_seconds=28 * DAY,
            percentile=90.0,
            compute_headroom=0.05,
            memory_headroom=0.10,
            min_compute=50,
            max_compute=1000,
            min_memory=1 * GiB,
            max_memory=None,
            initial_compute=250,
            initial_memory=6 * GiB,
            consolidation=MOVED,
        ),
        Policy(
            name="training",
            description="training, fine-tuning",
            history_window_seconds=7 * DAY,
            percentile=90.0,
            compute_headroom=0.10,
            memory_headroom=0.10,
            min_compute=250,
            max_compute=1000,
            min_memory=4 * GiB,
            max_memory=None,
            initial_compute=1000,
            initial_memory=12 * GiB,
        ),
        Policy(
            name="build",
            description="notebooks, experimentation",
            history_window_seconds=1 * DAY,
            percentile=75.0,
            compute_headroom=0.20,
            memory_headroom=0.20,
            min_compute=50,
            max_compute=500,
            min_memory=1 * GiB,
            max_memory=24 * GiB,
            initial_compute=200,
            initial_memory=4 * GiB,
            consolidation=MOVED,
        ),
    )
}
DEFAULT_POLICY: Final = "near-real-time"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
NAME_FORM: Final = "a policy name (lowercase DNS label), one of the GPUPolicy objects or built-ins"


def parse_policy_name(value: object, key: str) -> str:
    """A syntactically valid policy name; whether it exists is the caller's question."""
    if not isinstance(value, str) or _NAME.match(value.strip()) is None:
        raise ContractError(key, value, NAME_FORM)
    return value.strip()


# -- GPUPolicy objects ---------------------------------------------------------------------

API_VERSION: Final = "gpupack.io/v1alpha1"
KIND: Final = "GPUPolicy"
PLURAL: Final = "gpupolicies"


def _field(spec: Mapping[str, Any], name: str, where: str, required: bool = True) -> Any:
    if name not in spec or spec[name] is None:
        if required:
            raise ContractError(f"{where}.{name}", None, "a value (the field is required)")
        return None
    return spec[name]


def _number(spec: Mapping[str, Any], name: str, where: str, form: str) -> float:
    value = _field(spec, name, where)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractError(f"{where}.{name}", value, form)
    return float(value)


def policy_from_object(obj: Mapping[str, Any]) -> Policy:
    """The Policy a `GPUPolicy` object describes. Raises ContractError naming the field
    (`GPUPolicy gpupack-system/batch spec.minCompute`) and the accepted form."""
    meta = obj.get("metadata") or {}
    name = parse_policy_name(meta.get("name"), f"{KIND} metadata.name")
    where = f"{KIND} {meta.get('namespace', '')}/{name} spec".replace(" /", " ")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ContractError(where, spec, "an object with the policy's fields")
    window = _field(spec, "historyWindowSeconds", where)
    if isinstance(window, bool) or not isinstance(window, int):
        raise ContractError(f"{where}.historyWindowSeconds", window, "a whole number of seconds")
    max_memory = _field(spec, "maxMemory", where, required=False)
    sharing = _field(spec, "sharing", where, required=False) or Sharing.SHARED.value
    mode = _field(spec, "updateMode", where, required=False) or UpdateMode.INITIAL.value
    if sharing not in set(Sharing):
        raise ContractError(f"{where}.sharing", sharing, " or ".join(Sharing))
    if mode not in set(UpdateMode):
        raise ContractError(f"{where}.updateMode", mode, ", ".join(UpdateMode))
    description = _field(spec, "description", where, required=False)
    memory = _field(spec, "memoryEnforcement", where, required=False)
    if memory is not None and memory not in set(MemoryEnforcement):
        raise ContractError(f"{where}.memoryEnforcement", memory, " or ".join(MemoryEnforcement))
    compute = _field(spec, "compute", where, required=False) or ComputeShare.OFF.value
    if compute not in set(ComputeShare):
        raise ContractError(f"{where}.compute", compute, ", ".join(ComputeShare))
    consolidation = _consolidation(_field(spec, "consolidation", where, required=False), where)
    opt_out = _field(spec, OPT_OUT_FIELD, where, required=False)
    if opt_out is None:
        opt_out = False
    if not isinstance(opt_out, bool):
        raise ContractError(f"{where}.{OPT_OUT_FIELD}", opt_out, "true or false")
    return Policy(
        name=name,
        description=str(description) if description is not None else "",
        history_window_seconds=window,
        percentile=_number(spec, "percentile", where, "a number in (0, 100]"),
        compute_headroom=_number(spec, "computeHeadroom", where, "a fraction: 0.2 = +20 %"),
        memory_headroom=_number(spec, "memoryHeadroom", where, "a fraction: 0.2 = +20 %"),
        min_compute=parse_compute(_field(spec, "minCompute", where), f"{where}.minCompute"),
        max_compute=parse_compute(_field(spec, "maxCompute", where), f"{where}.maxCompute"),
        min_memory=parse_memory(_field(spec, "minMemory", where), f"{where}.minMemory"),
        max_memory=parse_memory(max_memory, f"{where}.maxMemory") if max_memory else None,
        initial_compute=parse_compute(
            _field(spec, "initialCompute", where), f"{where}.initialCompute"
        ),
        initial_memory=parse_memory(_field(spec, "initialMemory", where), f"{where}.initialMemory"),
        sharing=Sharing(sharing),
        update_mode=UpdateMode(mode),
        consolidation=consolidation,
        memory_enforcement=MemoryEnforcement(memory) if memory is not None else None,
        allow_memory_opt_out=opt_out,
        compute=ComputeShare(compute),
    )


def _consolidation(value: Any, where: str) -> Consolidation:
    """`spec.consolidation` of a GPUPolicy; absent: Off."""
    if value is None:
        return Consolidation()
    where = f"{where}.consolidation"
    if not isinstance(value, Mapping):
        raise ContractError(where, value, "an object: {mode, idleBelow, evictionsPerWindow, ...}")
    mode = value.get("mode", ConsolidationMode.OFF.value)
    if mode not in set(ConsolidationMode):
        raise ContractError(f"{where}.mode", mode, ", ".join(ConsolidationMode))
    default = Consolidation()
    idle = value.get("idleBelow", default.idle_below)
    if isinstance(idle, bool) or not isinstance(idle, int | float):
        raise ContractError(f"{where}.idleBelow", idle, "a fraction in (0, 1]")
    whole: dict[str, int] = {}
    for name, fallback in (
        ("evictionsPerWindow", default.evictions),
        ("windowSeconds", default.window_seconds),
        ("minReplicas", default.min_replicas),
    ):
        number = value.get(name, fallback)
        if isinstance(number, bool) or not isinstance(number, int):
            raise ContractError(f"{where}.{name}", number, "a whole number")
        whole[name] = number
    allow = value.get("allowMPS", False)
    if not isinstance(allow, bool):
        raise ContractError(f"{where}.allowMPS", allow, "true or false")
    try:
        return Consolidation(
            ConsolidationMode(mode),
            float(idle),
            whole["evictionsPerWindow"],
            whole["windowSeconds"],
            allow,
            whole["minReplicas"],
        )
    except ContractError as error:
        field = error.key.split(".")[-1]
        raise ContractError(f"{where}.{field}", error.value, error.accepted) from None


def consolidation_spec(consolidation: Consolidation) -> dict[str, Any]:
    """`spec.consolidation` of a GPUPolicy object."""
    return {
        "mode": consolidation.mode.value,
        "idleBelow": consolidation.idle_below,
        "evictionsPerWindow": consolidation.evictions,
        "windowSeconds": consolidation.window_seconds,
        "allowMPS": consolidation.allow_mps,
        "minReplicas": consolidation.min_replicas,
    }


def policy_spec(policy: Policy) -> dict[str, Any]:
    """The `spec` of the GPUPolicy object that describes `policy` (the chart's defaults)."""
    spec: dict[str, Any] = {
        "description": policy.description,
        "historyWindowSeconds": policy.history_window_seconds,
        "percentile": policy.percentile,
        "computeHeadroom": policy.compute_headroom,
        "memoryHeadroom": policy.memory_headroom,
        "minCompute": format_compute(policy.min_compute),
        "maxCompute": format_compute(policy.max_compute),
        "initialCompute": format_compute(policy.initial_compute),
        "minMemory": format_memory(policy.min_memory),
        "initialMemory": format_memory(policy.initial_memory),
        "sharing": policy.sharing.value,
        "updateMode": policy.update_mode.value,
        "consolidation": consolidation_spec(policy.consolidation),
        OPT_OUT_FIELD: policy.allow_memory_opt_out,
    }
    if policy.max_memory is not None:
        spec["maxMemory"] = format_memory(policy.max_memory)
    return spec


@dataclass(frozen=True, slots=True)
class PolicySet:
    """The policies in force: built-ins overlaid by the valid GPUPolicy objects.

    `invalid` maps the name of each GPUPolicy object that does not parse to why; where
    that name is a built-in, the built-in applies in its place.
    """

    policies: Mapping[str, Policy]
    invalid: Mapping[str, str]
    from_objects: frozenset[str]  # names that come from a valid object

    def source(self, name: str) -> str:
        if name in self.from_objects:
            return "GPUPolicy"
        if name in self.invalid:
            return f"built-in (GPUPolicy {name} is invalid: {self.invalid[name]})"
        return "built-in"


def effective_policies(objects: Iterable[Mapping[str, Any]]) -> PolicySet:
    """Built-ins, replaced or extended by every GPUPolicy object that parses."""
    policies: dict[str, Policy] = dict(BUILTIN)
    invalid: dict[str, str] = {}
    named: set[str] = set()
    for obj in objects:
        try:
            policy = policy_from_object(obj)
        except ContractError as exc:
            name = str((obj.get("metadata") or {}).get("name", ""))
            invalid[name] = str(exc)
            continue
        policies[policy.name] = policy
        named.add(policy.name)
    return PolicySet(policies, invalid, frozenset(named))
