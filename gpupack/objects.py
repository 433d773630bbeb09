"""Kubernetes objects as the API server sends them: plain dicts, typed with TypedDict.

Only the fields gpupack reads are declared; everything else passes through untouched.
(The client's generated model classes are slow and lossy for patches, so we avoid them.)
"""

from typing import Any, NotRequired, TypedDict

JSON = dict[str, Any]


class ObjectMeta(TypedDict, total=False):
    name: str
    generateName: str
    namespace: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[JSON]
    deletionTimestamp: str


class Resources(TypedDict, total=False):
    limits: dict[str, Any]
    requests: dict[str, Any]


class Container(TypedDict, total=False):
    name: str
    image: str
    env: list[JSON]
    resources: Resources
    restartPolicy: str  # "Always" marks a native sidecar among initContainers


class PodSpec(TypedDict, total=False):
    containers: list[Container]
    initContainers: list[Container]
    nodeName: str
    schedulerName: str
    nodeSelector: dict[str, str]
    affinity: JSON
    tolerations: list[JSON]
    priorityClassName: str
    runtimeClassName: str


class Pod(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PodSpec
    status: JSON


class OwnerReference(TypedDict):
    apiVersion: str
    kind: str
    name: str
    uid: NotRequired[str]
    controller: NotRequired[bool]


def labels_of(obj: Pod | JSON) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else {}


def annotations_of(obj: Pod | JSON) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def controller_of(obj: Pod | JSON) -> JSON | None:
    """The controlling owner reference, or the first owner when none is marked controller."""
    meta = obj.get("metadata") or {}
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    if not isinstance(owners, list) or not owners:
        return None
    valid = [o for o in owners if isinstance(o, dict)]
    for owner in valid:
        if owner.get("controller") is True:
            return owner
    return valid[0] if valid else None


def controller_kind(obj: Pod | JSON) -> str | None:
    """The kind of the owner marked `controller: true` (the one that recreates the pod),
    or None; unlike `controller_of`, an owner that is not the controller does not count."""
    owner = controller_of(obj)
    return str(owner.get("kind", "")) if owner and owner.get("controller") is True else None


def workload_of(pod: Pod, pod_name: str) -> tuple[str, str]:
    """(kind, name) of the workload: the controlling owner, a Deployment behind its
    ReplicaSet when the pod-template-hash label shows it, or the pod itself."""
    owner = controller_of(pod)
    if owner is None:
        meta = pod.get("metadata") or {}
        return "Pod", pod_name or str(meta.get("generateName", ""))
    kind, name = str(owner.get("kind", "")), str(owner.get("name", ""))
    template_hash = labels_of(pod).get("pod-template-hash")
    if kind == "ReplicaSet" and template_hash and name.endswith("-" + template_hash):
        return "Deployment", name[: -len(template_hash) - 1]
    return kind, name


def selects(selector: JSON | None, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) selects `labels`. A null
    selector selects nothing, an empty one everything (as pod affinity reads them)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or ()
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True
