"""Events (events.k8s.io/v1) on any object: the trace a person finds with `kubectl
describe` or `kubectl get events`. One writer for every gpupack component, each naming
itself as the reporting controller.

Best effort: a failed write is logged, never raised, since an Event must never fail the
work it describes. Names follow client-go's (the object's name and a timestamp), so two
Events never collide.
"""

import datetime
import logging
import time
from typing import Protocol

from gpupack.objects import JSON

log = logging.getLogger(__name__)


class Creates(Protocol):
    def create(self, path: str, body: JSON) -> JSON: ...


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event(
    kube: Creates,
    regarding: JSON,
    reason: str,
    note: str,
    *,
    controller: str,
    instance: str,
    action: str,
    warning: bool = False,
) -> None:
    """Record an Event about `regarding` (an object, or at least its apiVersion, kind and
    metadata), reported by `controller` (`gpupack.io/<component>`) from `instance`."""
    from gpupack.runtime.api import ApiError  # noqa: PLC0415 - keeps this module light

    meta = regarding.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    body = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        # generateName must itself be a valid name ("pod." is refused): name it as
        # client-go does.
        "metadata": {
            "name": f"{meta.get('name', 'gpupack')}.{time.time_ns():x}",
            "namespace": namespace,
        },
        "eventTime": _now(),
        "reportingController": controller,
        "reportingInstance": instance,
        "action": action,
        "reason": reason,
        "note": note[:1024],
        "type": "Warning" if warning else "Normal",
        "regarding": {
            "apiVersion": regarding.get("apiVersion", "v1"),
            "kind": regarding.get("kind", "Pod"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            **({"uid": meta["uid"]} if meta.get("uid") else {}),
        },
    }
    try:
        kube.create(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body)
    except ApiError as error:
        log.warning("could not record event %s on %s: %s", reason, meta.get("name"), error)
