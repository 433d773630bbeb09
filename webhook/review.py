"""AdmissionReview in and out: parsing with clear errors, and pure response builders.

Parsing never raises anything but ReviewError, whose status is 400 or 413 and whose
message says what was wrong with the request; the server turns it into that HTTP status.
"""

import base64
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gpupack.objects import JSON, Pod

MAX_BODY_BYTES: Final = 3 * 2**20
API_VERSION: Final = "admission.k8s.io/v1"


class ReviewError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    uid: str
    operation: str
    namespace: str
    name: str  # may be empty at CREATE when the pod uses generateName
    dry_run: bool
    pod: Pod
    username: str = ""
    old_pod: Pod | None = None  # the pod before an UPDATE (e.g. of its ephemeral containers)


def _require(doc: JSON, field: str, where: str) -> Any:
    if field not in doc:
        raise ReviewError(400, f"{where}.{field} is missing")
    return doc[field]


def _show(value: object, limit: int = 120) -> str:
    """A value for an error message, bounded: a scalar's repr cut at `limit` characters;
    a list or object only as its type (a hostile, deeply nested value must not cost a
    RecursionError or a megabyte of message)."""
    if isinstance(value, (list, dict)):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_review(body: bytes) -> AdmissionRequest:
    """Validate an `admission.k8s.io/v1` AdmissionReview carrying a Pod."""
    if len(body) > MAX_BODY_BYTES:
        raise ReviewError(413, f"request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES}")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ReviewError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ReviewError(400, "request body must be a JSON object (an AdmissionReview)")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != "AdmissionReview":
        raise ReviewError(
            400,
            f"expected apiVersion {API_VERSION!r} and kind 'AdmissionReview', got "
            f"{_show(doc.get('apiVersion'))} and {_show(doc.get('kind'))}",
        )
    request = _require(doc, "request", "AdmissionReview")
    if not isinstance(request, dict):
        raise ReviewError(400, "AdmissionReview.request must be an object")
    uid = _require(request, "uid", "request")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(400, "request.uid must be a non-empty string")
    kind = request.get("kind") or {}
    if not isinstance(kind, dict) or kind.get("kind") != "Pod" or kind.get("group", "") != "":
        raise ReviewError(400, f"only core/v1 Pods are handled; request.kind is {_show(kind)}")
    operation = request.get("operation")
    if not isinstance(operation, str):
        raise ReviewError(400, "request.operation must be a string such as 'CREATE'")
    pod = request.get("object")
    if not isinstance(pod, dict):
        raise ReviewError(400, "request.object must be the Pod being admitted")
    if pod.get("kind", "Pod") != "Pod":
        raise ReviewError(400, f"request.object is a {_show(pod.get('kind'))}, not a Pod")
    for field in ("metadata", "spec"):
        if field in pod and not isinstance(pod[field], dict):
            raise ReviewError(400, f"request.object.{field} must be an object")
    spec = pod.get("spec") or {}
    for field in ("containers", "initContainers", "ephemeralContainers"):
        if field in spec and not isinstance(spec[field], list):
            raise ReviewError(400, f"request.object.spec.{field} must be a list")
        for index, container in enumerate(spec.get(field) or []):
            if not isinstance(container, dict):
                raise ReviewError(400, f"request.object.spec.{field}[{index}] must be an object")
    old = request.get("oldObject")
    if old is not None and not isinstance(old, dict):
        raise ReviewError(400, "request.oldObject must be the Pod before the update")
    user = request.get("userInfo") or {}
    meta = pod.get("metadata") or {}
    return AdmissionRequest(
        uid=uid,
        operation=operation,
        namespace=str(request.get("namespace") or meta.get("namespace") or ""),
        name=str(request.get("name") or meta.get("name") or ""),
        dry_run=request.get("dryRun") is True,
        pod=pod,  # type: ignore[arg-type]
        username=str(user.get("username", "")) if isinstance(user, dict) else "",
        old_pod=old,  # type: ignore[arg-type]
    )


def allow(uid: str, patch: list[JSON] | None = None, warnings: list[str] | None = None) -> JSON:
    """An allowing AdmissionReview response, with a JSONPatch when there is one."""
    response: JSON = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def deny(uid: str, message: str, code: int = 400) -> JSON:
    """A denying response; `message` is what `kubectl` shows the user."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "response": {
            "uid": uid,
            "allowed": False,
            "status": {"code": code, "message": message, "reason": "BadRequest"},
        },
    }
