"""The pool key: pods whose inherited scheduling metadata is equal share capacity pods.

A capacity pod inherits the workload's nodeSelector, node affinity, tolerations,
priorityClassName and runtimeClassName (DESIGN.md, Capacity pods). The key is a stable
hash of exactly those fields, so the webhook and the scheduler agree on it across
processes, restarts and releases. Order that Kubernetes treats as a set (tolerations,
map keys) does not change the key.
"""

import hashlib
import json
from typing import Any, Final

from gpupack.kube import JSON, PodSpec

KEY_LENGTH: Final = 16  # hex characters; fits in a label value and a pod name


def scheduling_metadata(spec: PodSpec) -> JSON:
    """The fields of a pod spec that a capacity pod inherits, with empty values dropped."""
    inherited: JSON = {}
    if spec.get("nodeSelector"):
        inherited["nodeSelector"] = dict(spec["nodeSelector"])
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity")
    if node_affinity:
        inherited["affinity"] = {"nodeAffinity": node_affinity}
    if spec.get("tolerations"):
        inherited["tolerations"] = list(spec["tolerations"])
    for field in ("priorityClassName", "runtimeClassName"):
        value = spec.get(field)
        if value:
            inherited[field] = value
    return inherited


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def pool_key(spec: PodSpec) -> str:
    """Stable hex digest of the inherited scheduling metadata."""
    inherited = scheduling_metadata(spec)
    if "tolerations" in inherited:
        inherited["tolerations"] = sorted(inherited["tolerations"], key=_canonical)
    digest = hashlib.sha256(_canonical(inherited).encode()).hexdigest()
    return digest[:KEY_LENGTH]
