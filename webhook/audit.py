"""The audit log: one JSON line per admission, to stdout and optionally a file.

`audit_line` is pure (request, decision, capacity outcome, latency, time -> dict);
`AuditLog` only writes. `kubectl gpupack decisions` reads these lines back, so the
field names here are a public format: add fields, never rename them.
"""

import sys
import threading
from datetime import datetime
from typing import TextIO

import orjson

from gpupack import keys
from gpupack.objects import JSON
from gpupack.quantity import format_compute, format_memory
from gpupack.recommendation import Recommendation
from webhook.decision import CapacityOutcome, Decision
from webhook.review import AdmissionRequest

AUDIT_MARKER = "gpupack.audit/v1"  # lets `decisions` find our lines among other log output


def recommendation_fields(rec: Recommendation) -> JSON:
    """The recommendation an admission applied: which object, and what it said."""
    return {
        "name": rec.name,
        "compute": format_compute(rec.compute),
        "memory": format_memory(rec.memory),
        "confidence": round(rec.confidence, 3),
        "lastChange": rec.last_change,
    }


def audit_line(
    request: AdmissionRequest,
    decision: Decision,
    capacity: CapacityOutcome | None,
    latency_seconds: float,
    now: datetime,
) -> JSON:
    meta = request.pod.get("metadata") or {}
    line: JSON = {
        "audit": AUDIT_MARKER,
        "time": now.isoformat(timespec="milliseconds"),
        "decision": request.uid,
        "uid": request.uid,
        "namespace": request.namespace,
        "pod": request.name or meta.get("name") or "",
        "generateName": meta.get("generateName", ""),
        "ownerKind": decision.owner_kind,
        "ownerName": decision.owner_name,
        "operation": request.operation,
        "dryRun": request.dry_run,
        "user": request.username,
        "outcome": decision.outcome.value,
        "reason": decision.reason.value,
        "message": decision.message,
        "policy": decision.policy,
        "policySource": decision.policy_source,
        "policyOrigin": decision.policy_origin,
        "gpuRequest": decision.gpu_request,
        "compute": None if decision.compute is None else format_compute(decision.compute),
        "memory": None if decision.memory is None else format_memory(decision.memory),
        "allocationSource": decision.allocation_source,
        "capacity": None,
        "patchOps": len(decision.patch),
        "latencyMs": round(latency_seconds * 1000, 3),
    }
    if decision.recommendation is not None:
        line["recommendation"] = recommendation_fields(decision.recommendation)
    if decision.demand is not None:
        line["pool"] = decision.demand.pool
    if keys.ENFORCEMENT in decision.annotations:
        line["enforcement"] = decision.annotations[keys.ENFORCEMENT]
    if decision.stripped:
        line["stripped"] = list(decision.stripped)
    if decision.warnings:
        line["warnings"] = list(decision.warnings)
    if capacity is not None:
        # The plan: its pool, the GPUs it holds or has coming, how many it lacks.
        line["capacity"] = {"action": capacity.verdict, **capacity.extra}
        if capacity.detail:
            line["capacity"]["detail"] = capacity.detail
    return line


class AuditLog:
    """Writes audit lines; one line per write, flushed, safe from several threads."""

    def __init__(self, stream: TextIO | None = None, path: str | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self._lock = threading.Lock()

    def write(self, line: JSON) -> None:
        text = orjson.dumps(line, default=str, option=orjson.OPT_APPEND_NEWLINE).decode()
        with self._lock:
            self._stream.write(text)
            self._stream.flush()
            if self._file is not None:
                self._file.write(text)
                self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
