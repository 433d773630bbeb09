"""What pods hold, read from their annotations: the contract between the components
that write them and those that count them.

A fractional pod holds an `Allocation` (compute, GPU memory, its workload, whether it
needs its GPU to itself); a capacity pod offers one device whose memory the exporter
wrote. The webhook (capacity planning) and the scheduler (the GPU ledger) read pods
with these same functions, so they never disagree about who holds what.
"""

import logging
from collections.abc import Mapping
from typing import Any, Final, cast

from gpupack import codec, cuda, keys
from gpupack.errors import ContractError
from gpupack.objects import JSON, Pod, PodSpec, annotations_of, workload_of
from gpupack.packing import Allocation
from gpupack.policy import BUILTIN, Sharing
from gpupack.pool import metadata_key, scheduling_metadata

log = logging.getLogger(__name__)

TERMINATED: Final = frozenset({"Succeeded", "Failed"})


def is_live(pod: Mapping[str, Any]) -> bool:
    """Neither finished nor being deleted: the one test of a pod that holds or may hold
    what it asked for (a share, a GPU)."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in TERMINATED and not (pod.get("metadata") or {}).get("deletionTimestamp")


def is_running(pod: Mapping[str, Any]) -> bool:
    """Live (`is_live`) and running: its containers started on a node."""
    return is_live(pod) and (pod.get("status") or {}).get("phase") == "Running"


def workload(pod: JSON) -> str:
    """`Kind/name` of the pod's workload, exactly as the admission's `Demand.workload`."""
    name = str((pod.get("metadata") or {}).get("name", ""))
    kind, owner = workload_of(cast(Pod, pod), name)
    return f"{kind}/{owner}"


def is_exclusive(annotations: dict[str, str]) -> bool:
    """A pod whose GPU must not be shared with other workloads (CUDA MPS)."""
    enforcement = annotations.get(keys.ENFORCEMENT)
    if enforcement is not None:
        return cuda.MPS in cuda.enforced(enforcement)
    policy = BUILTIN.get(annotations.get(keys.POLICY, ""))
    return policy is not None and policy.sharing is Sharing.MPS


def is_unenforced(annotations: dict[str, str]) -> bool:
    """A pod whose memory share is not held on the GPU (its `gpupack.io/enforcement`
    does not name memory): it must not share a GPU with pods whose share is. A pod
    without the annotation (written before it existed) keeps the pool it had."""
    enforcement = annotations.get(keys.ENFORCEMENT)
    return enforcement is not None and cuda.MEMORY not in cuda.enforced(enforcement)


def scheduling_of(pod: JSON) -> JSON:
    """The scheduling metadata a fractional pod's capacity pods inherit, marks included."""
    spec = cast(PodSpec, pod.get("spec") or {})
    annotations = annotations_of(pod)
    return scheduling_metadata(
        spec, mps=is_exclusive(annotations), unenforced=is_unenforced(annotations)
    )


def pool_of(pod: JSON) -> str:
    """The pool of a fractional pod: the key of `scheduling_of`."""
    return metadata_key(scheduling_of(pod))


def pod_allocation(pod: JSON) -> Allocation | None:
    """The allocation a fractional pod holds, or None when its annotations do not parse."""
    meta = pod.get("metadata") or {}
    annotations = annotations_of(pod)
    try:
        compute = codec.read_compute(annotations)
        memory = codec.read_memory(annotations)
    except ContractError as error:
        log.warning("ignoring pod %s/%s: %s", meta.get("namespace"), meta.get("name"), error)
        return None
    if compute is None:
        return None
    namespace = str(meta.get("namespace", ""))
    return Allocation(
        key=f"{namespace}/{meta.get('name', '')}",
        compute=compute,
        memory=memory or 0,
        owner=f"{namespace}/{workload(pod)}",
        exclusive=is_exclusive(annotations),
    )


def gpu_memory(pod: JSON) -> int | None:
    """The device memory the exporter wrote on a capacity pod, None when unknown."""
    try:
        return codec.read_memory(annotations_of(pod))
    except ContractError as error:
        log.warning("capacity pod %s: %s", (pod.get("metadata") or {}).get("name"), error)
        return None
