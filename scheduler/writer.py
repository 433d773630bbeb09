"""Every write the scheduler makes, as small functions over the `Kube` transport.

- `bind`: the Binding, carrying the assignment annotations, with the pod's uid and
  resourceVersion as preconditions (a pod changed since we read it is a Conflict, never
  a wrong booking). It succeeds or the caller releases the reservation.
- `event`: an events.k8s.io/v1 Event on any object.
- `requeue`: a status condition that moves a refused pod out of kube-scheduler's
  unschedulable queue.
- capacity pods: delete with uid and resourceVersion preconditions, and the hosting
  label and autoscaler annotations (`scheduler.capacity_pods` creates them).
- `evict`: through the Eviction API, so PodDisruptionBudgets are honoured.
"""

import logging
from typing import Final

from gpupack import keys
from gpupack.objects import JSON
from gpupack.runtime import events
from gpupack.runtime.api import ApiError, retry
from scheduler.kube import STRATEGIC_PATCH, Kube
from scheduler.ledger import Request
from scheduler.translate import request_of

log = logging.getLogger(__name__)

REPORTING_CONTROLLER: Final = "gpupack.io/scheduler"
DO_NOT_EVICT: Final = {keys.CA_SAFE_TO_EVICT: "false", keys.KARPENTER_DO_NOT_DISRUPT: "true"}


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


class Changed(Exception):
    """The pod changed between filter and bind in a way that voids the reservation."""


def bind(kube: Kube, pod: JSON, node: str, uuid: str, holder: str, request: Request) -> None:
    """Bind the pod and write its assignment in one write: a Binding carries the
    annotations onto the pod, with the pod's uid and the resourceVersion it was filtered
    at as preconditions, so the pod is never bound without its GPU nor annotated without
    its node. On a Conflict the pod is read again, and the Binding repeated at its new
    version only if it is the same pod, still unbound, asking for what was reserved
    (kube-scheduler touches pending pods; a changed share must not be booked as the old
    one). Raises ApiError, or Changed."""
    meta = pod["metadata"]
    path = _pod_path(meta["namespace"], meta["name"])

    def assign(version: str) -> None:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": version,
                "annotations": {keys.GPU_UUID: uuid, keys.CAPACITY_POD: holder},
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        retry(lambda: kube.create(path + "/binding", binding))

    try:
        assign(meta["resourceVersion"])
    except ApiError as error:
        if error.status != 409:
            raise
        fresh = retry(lambda: kube.get(path))
        fresh_meta = fresh.get("metadata") or {}
        if fresh_meta.get("uid") != meta.get("uid"):
            raise Changed(f"{meta['name']} was deleted and created again") from None
        if (fresh.get("spec") or {}).get("nodeName"):
            raise Changed(f"{meta['name']} is already bound") from None
        if request_of(fresh) != request:
            raise Changed(f"{meta['name']}'s GPU share changed since it was placed") from None
        assign(str(fresh_meta.get("resourceVersion", "")))


def requeue(kube: Kube, pod: JSON, when: str) -> None:
    """Ask kube-scheduler to try a refused pod again: set the pod's
    `keys.REQUEUE_CONDITION` (a status patch, `when` its lastTransitionTime). An update
    of the pod moves it out of kube-scheduler's unschedulable queue; nothing the pod asks
    for changes. A pod gone meanwhile is no error."""
    meta = pod["metadata"]
    condition = {
        "type": keys.REQUEUE_CONDITION,
        "status": "True",
        "lastTransitionTime": when,
        "reason": "GPUWithRoom",
        "message": "a GPU this pod may use has room; gpupack asked kube-scheduler to try again",
    }
    body = {"status": {"conditions": [condition]}}  # merged by condition type
    try:
        kube.patch(_pod_path(meta["namespace"], meta["name"]) + "/status", body, STRATEGIC_PATCH)
    except ApiError as error:
        if error.status != 404:
            raise


def event(
    kube: Kube,
    regarding: JSON,
    reason: str,
    note: str,
    *,
    warning: bool = False,
    action: str = "Scheduling",
    instance: str = "",
) -> None:
    """Record an Event as the scheduler (`gpupack.runtime.events`); never raises."""
    events.event(
        kube,
        regarding,
        reason,
        note,
        controller=REPORTING_CONTROLLER,
        instance=instance or "gpupack-scheduler",
        action=action,
        warning=warning,
    )


def delete_capacity(kube: Kube, pod: JSON) -> bool:
    """Delete a capacity pod only if it is still the one we judged empty; False when it
    changed or is gone."""
    meta = pod["metadata"]
    options = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
    }
    try:
        kube.delete(_pod_path(meta["namespace"], meta["name"]), options)
    except ApiError as error:
        if error.status in (404, 409):
            return False
        raise
    return True


def mark_hosting(kube: Kube, pod: JSON, hosting: bool) -> None:
    """Add (hosting) or remove (empty) the autoscalers' do-not-evict annotations and the
    `gpupack.io/hosting` label, which the chart's admission policy and
    PodDisruptionBudget read to refuse deleting or evicting the pod."""
    meta = pod["metadata"]
    values: dict[str, str | None] = dict(DO_NOT_EVICT) if hosting else dict.fromkeys(DO_NOT_EVICT)
    label = {keys.HOSTING: "true" if hosting else None}
    body = {"metadata": {"annotations": values, "labels": label}}
    kube.patch(_pod_path(meta["namespace"], meta["name"]), body)


def annotate(kube: Kube, pod: JSON, values: dict[str, str | None]) -> None:
    """Set (or, with None, remove) annotations of a pod; setting one is conditional on
    the resourceVersion we judged it at (a pod replaced under the same name, or changed
    since, is not written by mistake: the next round judges it again)."""
    meta = pod["metadata"]
    body: JSON = {"metadata": {"annotations": values}}
    if any(v is not None for v in values.values()):
        body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
    kube.patch(_pod_path(meta["namespace"], meta["name"]), body)


def hosting(pod: JSON) -> bool:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    marked = (meta.get("labels") or {}).get(keys.HOSTING) == "true"
    return marked and all(annotations.get(k) == v for k, v in DO_NOT_EVICT.items())


def evict(kube: Kube, pod: JSON) -> None:
    meta = pod["metadata"]
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
    }
    kube.create(_pod_path(meta["namespace"], meta["name"]) + "/eviction", body)
