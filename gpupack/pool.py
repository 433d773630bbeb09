"""The pool key: pods whose inherited scheduling metadata is equal share capacity pods.

A capacity pod inherits the workload's nodeSelector, node affinity, tolerations,
priorityClassName and runtimeClassName (docs/architecture.md). The key is
a stable hash of exactly those fields, plus a mark for `real-time-mps` pods (their GPUs
run an MPS daemon and must never take other pods) and one for pods whose memory share is
not enforced on the GPU (an unenforced pod could fill the GPU under enforced neighbours:
they never share one), so the webhook and the scheduler agree on it across processes,
restarts and releases. Order that Kubernetes treats as a
set (tolerations, map keys) does not change the key.
"""

import hashlib
import json
from typing import Any, Final

from gpupack.keys import RESOURCE_COMPUTE, RESOURCE_MEMORY
from gpupack.mps import SHARING_MPS
from gpupack.objects import JSON, PodSpec

KEY_LENGTH: Final = 16  # hex characters; fits in a label value and a pod name
# Not a pod field: an MPS pool's metadata says so, which gives it a key of its own (its
# GPUs run an MPS daemon and take only MPS pods) and tells `capacity_pod` what to build.
SHARING: Final = "sharing"
# Not a pod field either: the mark of a pool whose pods' memory is not enforced.
MEMORY: Final = "memory"
UNENFORCED: Final = "unenforced"
# A rewritten pod tolerates each share gpupack charges it (`<resource> Exists
# NoSchedule`): the webhook writes them, as the API server's ExtendedResourceToleration
# (GKE and other managed clusters run it) would when it runs again after the webhook. No
# node has such a taint, so they say nothing about where the pod may go, and the pod the
# webhook plans from has none: they are not part of the pool (the `nvidia.com/gpu` one,
# written by the plugin before the webhook runs, is).
# In the order the plugin adds them (sorted by name).
CHARGED: Final = tuple(sorted((RESOURCE_COMPUTE, RESOURCE_MEMORY)))


def charged_toleration(resource: str) -> JSON:
    """The toleration ExtendedResourceToleration gives a pod for extended resource
    `resource`, and the webhook for each share it charges."""
    return {"key": resource, "operator": "Exists", "effect": "NoSchedule"}


def _charged(toleration: JSON) -> bool:
    return (
        toleration.get("key") in CHARGED
        and toleration.get("operator") == "Exists"
        and toleration.get("effect") == "NoSchedule"
    )


def scheduling_metadata(spec: PodSpec, *, mps: bool = False, unenforced: bool = False) -> JSON:
    """The fields of a pod spec that a capacity pod inherits, with empty values dropped;
    with `mps`, the mark of an MPS pool; with `unenforced`, that of a pool whose memory
    shares are not enforced."""
    inherited: JSON = {}
    if spec.get("nodeSelector"):
        inherited["nodeSelector"] = dict(spec["nodeSelector"])
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity")
    if node_affinity:
        inherited["affinity"] = {"nodeAffinity": node_affinity}
    tolerations = [t for t in spec.get("tolerations") or () if not _charged(t)]
    if tolerations:
        inherited["tolerations"] = tolerations
    for field in ("priorityClassName", "runtimeClassName"):
        value = spec.get(field)
        if value:
            inherited[field] = value
    if mps:
        inherited[SHARING] = SHARING_MPS
    if unenforced:
        inherited[MEMORY] = UNENFORCED
    return inherited


def is_mps(inherited: JSON) -> bool:
    """Scheduling metadata of an MPS pool."""
    return inherited.get(SHARING) == SHARING_MPS


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _canonical(value: Any) -> str:
    return _ENCODER.encode(value)


_MEMO_SIZE: Final = 4096
_memo: dict[str, str] = {}  # repr of the metadata -> key; the admission hot path


def pool_key(spec: PodSpec, *, mps: bool = False, unenforced: bool = False) -> str:
    """Stable hex digest of the inherited scheduling metadata (and the marks)."""
    return metadata_key(scheduling_metadata(spec, mps=mps, unenforced=unenforced))


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
