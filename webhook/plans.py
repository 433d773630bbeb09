"""The decision's plan, memoized per pod template: `decide(request, ctx, plan=PlanCache())`.

A ReplicaSet or a Job (not an indexed one) creates its pods from one template. The API
server sends each to the webhook as nearly the same object: generateName set, name
empty, and only two things of its own, added before any webhook runs: the name of its
service-account token volume (`kube-api-access-<random>`, in `spec.volumes` and each
container's `volumeMounts`) and the time in `metadata.managedFields`. No plan reads
those (`webhook.mutate.plan_decision`; the MPS wiring, which reads a pod's volumes, is
`stamp`'s, per admission), so the key leaves them out. A StatefulSet's pods carry their
names, an indexed Job's their index and a DaemonSet's their node's affinity: each is a
template of its own, planned afresh.

Plans are equal whenever everything the plan reads is: the request's operation,
namespace and name, the pod but for the fields above, the Namespace object the webhook
sees, the policies in force, the workload's recommendation and the MPS setting. That is
the key, compared by value (the pod and the Namespace as their JSON bytes), so a changed
label, annotation, policy or recommendation is a different plan, never a stale one. The
plan never reads the decision key or the time, so it is not keyed on them.

Bounded: the least recently used plans go first. The policies in force are compared by
identity (each change makes a new `PolicySet`): a new set drops every plan. Not
thread-safe; the webhook decides on its event loop.
"""

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Final, cast

import orjson

from gpupack.objects import JSON, workload_of
from gpupack.policy import PolicySet
from webhook.decision import Decision
from webhook.mutate import MutationContext, Planner, plan_decision
from webhook.review import AdmissionRequest

DEFAULT_SIZE: Final = 1024  # templates; a few KB each


PER_POD_METADATA: Final = frozenset({"managedFields"})
PER_POD_SPEC: Final = frozenset({"volumes"})
PER_POD_CONTAINER: Final = frozenset({"volumeMounts"})
CONTAINER_LISTS: Final = ("containers", "initContainers", "ephemeralContainers")


def template(pod: JSON) -> JSON:
    """The pod without what the API server makes different for each pod of one template
    and no plan reads: its volumes, its containers' volume mounts, its managed fields.
    A shallow copy; the pod is not changed."""
    out = dict(pod)
    meta = pod.get("metadata")
    if isinstance(meta, dict):
        out["metadata"] = {k: v for k, v in meta.items() if k not in PER_POD_METADATA}
    spec = pod.get("spec")
    if isinstance(spec, dict):
        spec = {k: v for k, v in spec.items() if k not in PER_POD_SPEC}
        for field in CONTAINER_LISTS:
            containers = spec.get(field)
            if isinstance(containers, list):
                spec[field] = [
                    {k: v for k, v in c.items() if k not in PER_POD_CONTAINER}
                    if isinstance(c, dict)
                    else c
                    for c in containers
                ]
        out["spec"] = spec
    return out


class PlanCache:
    """`plan_decision`, memoized; a drop-in `plan` for `webhook.mutate.decide`."""

    def __init__(
        self,
        size: int = DEFAULT_SIZE,
        plan: Planner = plan_decision,
        counted: Callable[[bool], None] | None = None,  # called with hit or not
    ) -> None:
        if size < 1:
            raise ValueError(f"a plan cache holds at least one plan, not {size}")
        self._size = size
        self._plan = plan
        self._counted = counted
        self._plans: OrderedDict[Hashable, Decision] = OrderedDict()
        self._policies: PolicySet | None = None

    def __len__(self) -> int:
        return len(self._plans)

    def __call__(self, request: AdmissionRequest, ctx: MutationContext) -> Decision:
        if ctx.policy_set is not self._policies:
            self._plans.clear()
            self._policies = ctx.policy_set
        try:
            key = self._key(request, ctx)
        except orjson.JSONEncodeError:  # nothing orjson.loads gives; planned, not kept
            return self._plan(request, ctx)
        plan = self._plans.get(key)
        if self._counted is not None:
            self._counted(plan is not None)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        plan = self._plans[key] = self._plan(request, ctx)
        if len(self._plans) > self._size:
            self._plans.popitem(last=False)
        return plan

    @staticmethod
    def _key(request: AdmissionRequest, ctx: MutationContext) -> Hashable:
        kind, name = workload_of(request.pod, request.name)
        return (
            request.operation,
            request.namespace,
            request.name,
            orjson.dumps(template(cast(JSON, request.pod))),
            orjson.dumps(ctx.namespace),
            ctx.recommendation(request.namespace, kind, name),
            ctx.mps,
        )
