"""What `kubectl gpupack` reports, computed from the cluster's objects (pure).

- `status`: GPUs held by capacity pods against the whole GPUs the fractional pods asked
  for, the saving, each namespace's shares, pods waiting for a GPU and why (their last
  FailedScheduling Event), and pods that escaped gpupack (each holds a whole GPU).
- `what_if`: before anything is opted in, the cluster's whole-GPU pods run through the
  webhook's own decision (`decide`, each namespace treated as opted in) and the capacity
  planner the webhook sizes capacity with (`gpupack.packing.plan`: first fit,
  largest first, per pool, honouring `real-time-mps` exclusivity): how many GPUs and
  GPU nodes they would need under gpupack, per namespace and policy. Pods the webhook
  would leave whole (more than one GPU, MIG, ...) count as they are.

The plan is the webhook's sizing, not a replay of the scheduler: real placement also
obeys each pod's affinity, spread and node fit, so a cluster can need somewhat more GPUs
than planned; never fewer than the compute the shares add up to.
"""

import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from gpupack import cuda, keys
from gpupack.codec import read_original_resources
from gpupack.errors import ContractError
from gpupack.gpu_request import escaped, scan_gpus
from gpupack.objects import JSON, Pod, PodSpec, annotations_of, labels_of
from gpupack.packing import Allocation, plan
from gpupack.policy import PolicySet
from gpupack.quantity import parse_compute, parse_count, parse_memory
from gpupack.runtime.informer import object_key
from gpupack.shares import is_live
from ops.slack import Slack, slack
from webhook.decision import Outcome
from webhook.mutate import MutationContext, decide
from webhook.review import AdmissionRequest

MIB = 1 << 20
DEFAULT_GPU_MEMORY = 80 << 30


def _meta(obj: JSON) -> JSON:
    meta: JSON = obj.get("metadata") or {}
    return meta


def gpus_asked(pod: JSON) -> int:
    """The whole GPUs a pod holds or asks for: what it asked for before gpupack rewrote it
    (its `gpupack.io/original-resources`), else its spec's `nvidia.com/gpu` (0 if none
    or unreadable)."""
    try:
        original = read_original_resources(annotations_of(pod))
        if original is None:
            return scan_gpus(cast(PodSpec, pod.get("spec") or {})).total
    except ContractError:
        return 0
    total = 0
    for resources in (*original.containers.values(), *original.init_containers.values()):
        counts = [
            parse_count(section[keys.NVIDIA_GPU], keys.ORIGINAL_RESOURCES)
            for section in resources.values()
            if isinstance(section, dict) and keys.NVIDIA_GPU in section
        ]
        total += max(counts, default=0)
    return total


@dataclass(slots=True)
class Share:
    """One namespace's fractional pods."""

    pods: int = 0
    gpus_asked: int = 0  # the whole GPUs they would hold without gpupack
    compute: int = 0  # millis
    memory: int = 0  # bytes
    memory_enforced: int = 0  # pods held to their memory share (gpupack.io/enforcement)


@dataclass(frozen=True, slots=True)
class WaitingPod:
    pod: str  # namespace/name
    why: str


@dataclass(slots=True)
class Status:
    held: int = 0  # running capacity pods holding a named GPU
    coming: int = 0  # capacity pods not holding one yet
    in_use: int = 0  # held GPUs with at least one fractional pod
    asked: int = 0  # whole GPUs the fractional pods asked for
    namespaces: dict[str, Share] = field(default_factory=dict)
    waiting: list[WaitingPod] = field(default_factory=list)
    escaped: list[str] = field(default_factory=list)
    slack: Slack = field(default_factory=Slack)

    @property
    def saved(self) -> int:
        return self.asked - self.held - self.coming


def last_scheduling_failure(events: Sequence[JSON], pod: str) -> str:
    """The newest FailedScheduling message about `pod` (namespace/name) among `events`
    (core/v1 Events, as `kubectl get events` lists them)."""
    namespace, _, name = pod.partition("/")
    newest, message = "", ""
    for event in events:
        involved = event.get("involvedObject") or event.get("regarding") or {}
        if (involved.get("name"), involved.get("namespace")) != (name, namespace):
            continue
        if event.get("reason") != "FailedScheduling":
            continue
        when = str(event.get("lastTimestamp") or event.get("eventTime") or "")
        if when >= newest:
            newest, message = when, str(event.get("message") or event.get("note") or "")
    return message


def status(
    pods: Sequence[JSON],
    namespaces: Mapping[str, JSON],
    events: Sequence[JSON],
    *,
    system_namespace: str = keys.SYSTEM_NAMESPACE,
    excluded: Collection[str] = ("kube-system",),
) -> Status:
    report = Status()
    in_use: set[str] = set()
    holding: list[JSON] = []  # running capacity pods with a GPU
    bound: list[JSON] = []  # fractional pods on a GPU
    for pod in (p for p in pods if is_live(p)):
        meta, spec = _meta(pod), pod.get("spec") or {}
        annotations = annotations_of(pod)
        if meta.get("namespace") == system_namespace and (
            labels_of(pod).get(keys.ROLE) == keys.ROLE_CAPACITY
        ):
            running = (pod.get("status") or {}).get("phase") == "Running"
            if running and annotations.get(keys.GPU_UUID):
                report.held += 1
                holding.append(pod)
            else:
                report.coming += 1
            continue
        if spec.get("schedulerName") == keys.SCHEDULER_NAME and keys.DECISION in annotations:
            share = report.namespaces.setdefault(str(meta.get("namespace")), Share())
            share.pods += 1
            asked = max(1, gpus_asked(pod))  # a fractional pod asked for one at least
            share.gpus_asked += asked
            report.asked += asked
            if cuda.MEMORY in cuda.enforced(annotations.get(keys.ENFORCEMENT)):
                share.memory_enforced += 1
            try:
                share.compute += parse_compute(annotations.get(keys.GPU_COMPUTE, "0"), "compute")
                share.memory += parse_memory(annotations.get(keys.GPU_MEMORY, "0"), "memory")
            except ContractError:
                pass
            if spec.get("nodeName"):
                if annotations.get(keys.GPU_UUID):
                    in_use.add(annotations[keys.GPU_UUID])
                    bound.append(pod)
            else:
                why = last_scheduling_failure(events, object_key(pod)) or "not tried yet"
                report.waiting.append(WaitingPod(object_key(pod), why))
            continue
        namespace = namespaces.get(str(meta.get("namespace")))
        if escaped(pod, namespace, {system_namespace, *excluded}):
            report.escaped.append(object_key(pod))
    report.in_use = len(in_use)
    report.slack = slack(holding, bound)
    return report


# What-if.


@dataclass(slots=True)
class Group:
    """The pods of one namespace and policy (policy "" for those left whole)."""

    pods: int = 0
    gpus_now: int = 0
    compute: int = 0
    memory: int = 0


@dataclass(slots=True)
class WhatIf:
    gpus_now: int = 0  # whole GPUs the pods hold or ask for today
    gpus_needed: int = 0  # under gpupack: planned GPUs plus the pods left whole
    nodes_now: int = 0  # GPU nodes those pods run on today
    nodes_needed: int = 0  # GPU nodes for gpus_needed, at the nodes' GPUs per node
    groups: dict[tuple[str, str], Group] = field(default_factory=dict)
    whole: list[tuple[str, str]] = field(default_factory=list)  # (pod, why left whole)
    oversized: list[str] = field(default_factory=list)


def what_if(
    pods: Sequence[JSON],
    namespaces: Mapping[str, JSON],
    nodes: Mapping[str, JSON],
    policies: PolicySet,
    *,
    system_namespace: str = keys.SYSTEM_NAMESPACE,
    excluded: Collection[str] = ("kube-system",),
    default_gpu_memory: int = DEFAULT_GPU_MEMORY,
) -> WhatIf:
    """The cluster's whole-GPU pods, decided and planned as if their namespaces opted in."""
    report = WhatIf()
    pools: dict[str, list[Allocation]] = defaultdict(list)
    pool_memory: dict[str, int] = {}
    used_nodes: set[str] = set()
    gpus_per_node: list[int] = []
    whole_gpus = 0
    for pod in (p for p in pods if is_live(p)):
        meta, spec = _meta(pod), pod.get("spec") or {}
        namespace = str(meta.get("namespace", ""))
        if namespace in {system_namespace, *excluded}:
            continue
        if spec.get("schedulerName") == keys.SCHEDULER_NAME:
            continue  # already gpupack's
        try:
            scan = scan_gpus(cast(PodSpec, spec))
        except ContractError:
            continue
        if scan.total == 0:
            continue
        node_name = spec.get("nodeName")
        if node_name:
            used_nodes.add(node_name)
        report.gpus_now += scan.total
        decision = decide(_request(pod, namespace), _context(namespaces.get(namespace), policies))
        if decision.outcome is not Outcome.MUTATED or decision.demand is None:
            group = report.groups.setdefault((namespace, ""), Group())
            group.pods += 1
            group.gpus_now += scan.total
            whole_gpus += scan.total
            report.whole.append((object_key(pod), decision.message))
            continue
        demand = decision.demand
        group = report.groups.setdefault((namespace, decision.policy or ""), Group())
        group.pods += 1
        group.gpus_now += scan.total
        group.compute += demand.compute
        group.memory += demand.memory
        pools[demand.pool].append(
            Allocation(
                object_key(pod),
                demand.compute,
                demand.memory,
                f"{namespace}/{demand.workload}",
                demand.exclusive,
            )
        )
        memory = _gpu_memory(nodes.get(node_name or ""), default_gpu_memory)
        pool_memory[demand.pool] = min(pool_memory.get(demand.pool, memory), memory)
    planned = 0
    for pool, allocations in pools.items():
        result = plan([], allocations, new_gpu_memory=pool_memory[pool])
        planned += len(result.bins)
        report.oversized.extend(result.oversized)
    for name in used_nodes:
        count = _allocatable_gpus(nodes.get(name))
        if count:
            gpus_per_node.append(count)
    report.gpus_needed = planned + whole_gpus
    report.nodes_now = len(used_nodes)
    per_node = min(gpus_per_node) if gpus_per_node else 0
    report.nodes_needed = math.ceil(report.gpus_needed / per_node) if per_node else report.nodes_now
    return report


def _request(pod: JSON, namespace: str) -> AdmissionRequest:
    return AdmissionRequest(
        uid=f"what-if/{object_key(pod)}",
        operation="CREATE",
        namespace=namespace,
        name=str(_meta(pod).get("name", "")),
        dry_run=True,
        pod=_as_created(pod),
    )


def _as_created(pod: JSON) -> Pod:
    """The pod as its admission would have carried it: no node, default scheduler."""
    spec = dict(pod.get("spec") or {})
    spec.pop("nodeName", None)
    return cast(
        Pod, {"apiVersion": "v1", "kind": "Pod", "metadata": dict(_meta(pod)), "spec": spec}
    )


def _context(namespace: JSON | None, policies: PolicySet) -> MutationContext:
    """The namespace as if labelled gpupack.io/optimize=enabled (its annotations kept)."""
    meta = _meta(namespace or {})
    opted_in = {
        "metadata": {
            "name": meta.get("name", ""),
            "labels": {**(meta.get("labels") or {}), keys.OPTIMIZE: keys.OPTIMIZE_ENABLED},
            "annotations": dict(meta.get("annotations") or {}),
        }
    }
    return MutationContext(namespace=opted_in, policy_set=policies)


def _gpu_memory(node: JSON | None, default: int) -> int:
    value = labels_of(node or {}).get(keys.GFD_MEMORY_MIB, "")
    return int(value) * MIB if value.isdigit() else default


def _allocatable_gpus(node: JSON | None) -> int:
    value = ((node or {}).get("status") or {}).get("allocatable", {}).get(keys.NVIDIA_GPU, "0")
    return int(value) if str(value).isdigit() else 0


def what_if_json(result: WhatIf) -> JSON:
    return {
        "gpusToday": result.gpus_now,
        "gpusNeeded": result.gpus_needed,
        "gpuNodesToday": result.nodes_now,
        "gpuNodesNeeded": result.nodes_needed,
        "groups": [
            {
                "namespace": namespace,
                "policy": policy or None,
                "pods": group.pods,
                "gpusToday": group.gpus_now,
                "compute": group.compute,
                "memoryBytes": group.memory,
            }
            for (namespace, policy), group in sorted(result.groups.items())
        ],
        "stayWhole": [{"pod": pod, "why": why} for pod, why in result.whole],
        "oversized": result.oversized,
    }


def why_pending(pod: JSON, events: Sequence[JSON], capacity: Sequence[JSON]) -> list[str]:
    """Lines that say why `pod` waits, from its own state, its last FailedScheduling
    Event and the capacity pods of its pool."""
    key, spec = object_key(pod), pod.get("spec") or {}
    annotations = annotations_of(pod)
    phase = (pod.get("status") or {}).get("phase", "")
    if spec.get("nodeName"):
        gpu = annotations.get(keys.GPU_UUID, "")
        return [
            f"{key} is not pending: bound to {spec['nodeName']}"
            + (f", GPU {gpu}" if gpu else "")
            + f" ({phase})"
        ]
    if spec.get("schedulerName") != keys.SCHEDULER_NAME:
        return [
            f"{key} is not gpupack's: it names scheduler "
            f"{spec.get('schedulerName') or 'default-scheduler'!r}; gpupack never rewrote it "
            "(not opted in, or its admission did not reach the webhook)"
        ]
    lines = [
        f"{key} waits for a GPU share: {annotations.get(keys.GPU_COMPUTE, '?')} compute, "
        f"{annotations.get(keys.GPU_MEMORY, '?')} memory (policy "
        f"{annotations.get(keys.POLICY, '?')})"
    ]
    failure = last_scheduling_failure(events, key)
    lines.append(
        f"last FailedScheduling: {failure}"
        if failure
        else "kube-scheduler has not reported on it yet"
    )
    if keys.SEAL not in annotations:
        lines.append("it carries no gpupack.io/seal: the scheduler will not place it; re-create it")
    pool = _pool_of(pod)
    mine = [c for c in capacity if labels_of(c).get(keys.POOL) == pool] if pool else []
    if mine:
        held = sum(1 for c in mine if annotations_of(c).get(keys.GPU_UUID))
        pending = [
            _meta(c).get("name") for c in mine if (c.get("status") or {}).get("phase") == "Pending"
        ]
        lines.append(f"its pool {pool}: {len(mine)} capacity pods, {held} holding a GPU")
        if pending:
            lines.append(
                f"capacity pods pending (no GPU node with room; an autoscaler may be adding "
                f"one): {', '.join(str(name) for name in pending)}"
            )
    elif pool:
        lines.append(
            f"its pool {pool} has no capacity pod yet: the scheduler creates one when nothing fits"
        )
    return lines


def _pool_of(pod: JSON) -> str:
    from gpupack.shares import pool_of  # noqa: PLC0415

    try:
        return pool_of(pod)
    except (ContractError, KeyError, TypeError):
        return ""
