"""The `GPURecommendation` object: what the recommender publishes and the webhook reads.

One object per workload (the controlling owner `workload_of` names: Deployment,
StatefulSet, Job, CronJob, an operator's kind, or a bare Pod), in the workload's
namespace, named deterministically from the workload (`object_name`) so that the
webhook finds it with one cache lookup and two recommenders cannot create two.

    spec:   {targetRef: {kind, name}}
    status: {policy, compute, memory, confidence, samples, firstSample, lastSample,
             lastChange, reason, running: {pods, compute, memory}, lastRollout,
             history: <the recommender's checkpoint, opaque to everyone else>}

`compute` and `memory` are written in the annotation forms (`250m`, `3Gi`). Everything
here is pure: parsing (`recommendation_from_object`) fails with a ContractError naming
the field, and the webhook treats such an object as absent.
"""

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpupack.errors import ContractError
from gpupack.quantity import format_compute, format_memory, parse_compute, parse_memory

API_VERSION: Final = "gpupack.io/v1alpha1"
KIND: Final = "GPURecommendation"
PLURAL: Final = "gpurecommendations"
MAX_NAME: Final = 253
_UNSAFE = re.compile(r"[^a-z0-9.-]")


def object_name(kind: str, name: str) -> str:
    """`deployment-web`: the workload's kind, lowercased, and its name; past 253
    characters (or with characters a name may not hold) a hash keeps it unique."""
    candidate = f"{kind.lower()}-{name}"
    if len(candidate) <= MAX_NAME and not _UNSAFE.search(candidate):
        return candidate
    digest = hashlib.sha256(f"{kind}/{name}".encode()).hexdigest()[:10]
    safe = _UNSAFE.sub("-", candidate)[: MAX_NAME - len(digest) - 1].strip("-.")
    return f"{safe}-{digest}"


def list_path(namespace: str | None = None) -> str:
    """The collection path, cluster-wide or in one namespace."""
    if namespace is None:
        return f"/apis/{API_VERSION}/{PLURAL}"
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A workload's recommended allocation, as the webhook applies it."""

    namespace: str
    kind: str  # the workload's kind
    workload: str  # the workload's name
    policy: str  # the policy it was computed with
    compute: int  # millis of one GPU
    memory: int  # bytes
    confidence: float  # 0..1, grows with the history behind it
    last_change: str  # RFC 3339: when compute or memory last changed
    reason: str  # why it has this value, for people

    @property
    def name(self) -> str:
        return object_name(self.kind, self.workload)

    def describe(self) -> str:
        """`GPURecommendation ml/deployment-web (confidence 0.83)`, for the audit log."""
        return f"{KIND} {self.namespace}/{self.name} (confidence {self.confidence:.2f})"


def recommendation_from_object(obj: Mapping[str, Any]) -> Recommendation | None:
    """The recommendation an object holds; None while it has no target yet. Raises
    ContractError naming the bad field."""
    meta = obj.get("metadata") or {}
    where = f"{KIND} {meta.get('namespace', '')}/{meta.get('name', '')}"
    target = (obj.get("spec") or {}).get("targetRef") or {}
    kind, workload = target.get("kind"), target.get("name")
    if not isinstance(kind, str) or not kind or not isinstance(workload, str) or not workload:
        raise ContractError(f"{where} spec.targetRef", target, "{kind: <Kind>, name: <name>}")
    status = obj.get("status") or {}
    if status.get("compute") is None or status.get("memory") is None:
        return None
    confidence = status.get("confidence", 0.0)
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        raise ContractError(f"{where} status.confidence", confidence, "a number in 0..1")
    return Recommendation(
        namespace=str(meta.get("namespace", "")),
        kind=kind,
        workload=workload,
        policy=str(status.get("policy", "")),
        compute=parse_compute(status["compute"], f"{where} status.compute"),
        memory=parse_memory(status["memory"], f"{where} status.memory"),
        confidence=max(0.0, min(1.0, float(confidence))),
        last_change=str(status.get("lastChange", "")),
        reason=str(status.get("reason", "")),
    )


def recommendation_status(rec: Recommendation) -> dict[str, Any]:
    """The status fields the webhook reads, in their written form."""
    return {
        "policy": rec.policy,
        "compute": format_compute(rec.compute),
        "memory": format_memory(rec.memory),
        "confidence": round(rec.confidence, 3),
        "lastChange": rec.last_change,
        "reason": rec.reason,
    }


def recommendation_object(rec: Recommendation, extra_status: Mapping[str, Any]) -> dict[str, Any]:
    """A complete object for `rec`; `extra_status` adds the recommender's own fields
    (samples, running, history, ...)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": rec.name,
            "namespace": rec.namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpupack-recommender"},
        },
        "spec": {"targetRef": {"kind": rec.kind, "name": rec.workload}},
        "status": {**extra_status, **recommendation_status(rec)},
    }
