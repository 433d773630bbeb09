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


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _canonical(value: Any) -> str:
    return _ENCODER.encode(value)


_MEMO_SIZE: Final = 4096
_memo: dict[str, str] = {}  # repr of the metadata -> key; the admission hot path


def pool_key(spec: PodSpec) -> str:
    """Stable hex digest of the inherited scheduling metadata."""
    return metadata_key(scheduling_metadata(spec))


def metadata_key(inherited: JSON) -> str:
    """`pool_key` of metadata already taken from a spec with `scheduling_metadata`.

    Memoised by the metadata's repr, which is exact for JSON-like values in a given key
    order (a different order only costs a recomputation, never a different key).
    """
    marker = repr(inherited)
    key = _memo.get(marker)
    if key is None:
        if len(_memo) >= _MEMO_SIZE:
            _memo.clear()
        key = _memo[marker] = _digest(inherited)
    return key


def _digest(inherited: JSON) -> str:
    if "tolerations" in inherited:  # a set to Kubernetes; the caller's list stays as it is
        inherited = {**inherited, "tolerations": sorted(inherited["tolerations"], key=_canonical)}
    digest = hashlib.sha256(_canonical(inherited).encode()).hexdigest()
    return digest[:KEY_LENGTH]
