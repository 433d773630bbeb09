"""The one codec for gpupack's label and annotation values (DESIGN.md, The contract).

Every reader takes the whole labels or annotations map and returns None when the key is
absent, the parsed value when it is valid, and raises ContractError (naming the key and
the accepted form) when it is not. Writers return the canonical string; quantities are
written by `gpupack.quantity.format_compute` and `format_memory`.
"""

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from gpupack import keys
from gpupack.errors import ContractError
from gpupack.policy import parse_policy_name
from gpupack.quantity import parse_compute, parse_memory

OPTIMIZE_FORM: Final = f"{keys.OPTIMIZE_ENABLED!r} or {keys.OPTIMIZE_DISABLED!r}"
UUID_FORM: Final = "an NVIDIA GPU UUID such as GPU-4c2f8f3e-1b2a-4d3c-9e8f-0a1b2c3d4e5f"
# One encoder, not one per call: json.dumps with options builds a new JSONEncoder each time.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_GPU_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


def read_optimize(labels: dict[str, str]) -> bool | None:
    """`gpupack.io/optimize`: True for enabled, False for disabled, None when unset."""
    value = labels.get(keys.OPTIMIZE)
    if value is None:
        return None
    if value == keys.OPTIMIZE_ENABLED:
        return True
    if value == keys.OPTIMIZE_DISABLED:
        return False
    raise ContractError(keys.OPTIMIZE, value, OPTIMIZE_FORM)


def read_policy(annotations: dict[str, str]) -> str | None:
    value = annotations.get(keys.POLICY)
    return None if value is None else parse_policy_name(value, keys.POLICY)


def read_compute(annotations: dict[str, str]) -> int | None:
    """`gpupack.io/gpu-compute` in millis of one GPU."""
    value = annotations.get(keys.GPU_COMPUTE)
    return None if value is None else parse_compute(value, keys.GPU_COMPUTE)


def read_memory(annotations: dict[str, str]) -> int | None:
    """`gpupack.io/gpu-memory` in bytes."""
    value = annotations.get(keys.GPU_MEMORY)
    return None if value is None else parse_memory(value, keys.GPU_MEMORY)


def read_gpu_uuid(annotations: dict[str, str]) -> str | None:
    value = annotations.get(keys.GPU_UUID)
    if value is None:
        return None
    if _GPU_UUID.match(value) is None:
        raise ContractError(keys.GPU_UUID, value, UUID_FORM)
    return value


@dataclass(frozen=True, slots=True)
class OriginalResources:
    """What the webhook removed from a pod, so a person (or a tool) can undo the decision.

    `containers` and `init_containers` map a container name to the removed entries of its
    `limits` and `requests`, values as the user wrote them. `scheduler_name` is the pod's
    schedulerName before the mutation (None when it was unset).
    """

    containers: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    init_containers: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    scheduler_name: str | None = None


def write_original_resources(original: OriginalResources) -> str:
    doc: dict[str, Any] = {}
    if original.containers:
        doc["containers"] = original.containers
    if original.init_containers:
        doc["initContainers"] = original.init_containers
    if original.scheduler_name is not None:
        doc["schedulerName"] = original.scheduler_name
    return _CANONICAL.encode(doc)


def read_original_resources(annotations: dict[str, str]) -> OriginalResources | None:
    value = annotations.get(keys.ORIGINAL_RESOURCES)
    if value is None:
        return None
    accepted = 'JSON like {"containers":{"NAME":{"limits":{"nvidia.com/gpu":"1"}}}}'
    try:
        doc = json.loads(value)
    except ValueError as exc:
        raise ContractError(keys.ORIGINAL_RESOURCES, value, accepted, str(exc)) from None
    if not isinstance(doc, dict):
        raise ContractError(keys.ORIGINAL_RESOURCES, value, accepted)
    containers = doc.get("containers", {})
    init_containers = doc.get("initContainers", {})
    scheduler_name = doc.get("schedulerName")
    if not isinstance(containers, dict) or not isinstance(init_containers, dict):
        raise ContractError(keys.ORIGINAL_RESOURCES, value, accepted)
    if scheduler_name is not None and not isinstance(scheduler_name, str):
        raise ContractError(keys.ORIGINAL_RESOURCES, value, accepted)
    return OriginalResources(containers, init_containers, scheduler_name)


def rfc3339(moment: float) -> str:
    """A Unix time as Kubernetes writes times (`2026-01-02T03:04:05Z`)."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: object) -> float | None:
    """An RFC 3339 time as Unix seconds; None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
