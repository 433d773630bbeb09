"""The API calls the scheduler makes, as a Protocol: the verbs its RBAC grants.

list and watch (nodes and pods, for the informers), get, create and update (the Lease;
Bindings, Events, evictions and capacity pods are creates), patch (the assignment
annotations with a resourceVersion precondition, the PodScheduled condition, the
autoscaler annotations) and delete (capacity pods). `gpupack.runtime.transport.Transport`
is the real one; tests pass an in-memory fake (`tests/fakes.py`).
"""

from collections.abc import Mapping
from typing import Protocol

from gpupack.kube import JSON
from gpupack.runtime.api import WatchStream
from gpupack.runtime.transport import MERGE_PATCH, STRATEGIC_PATCH

__all__ = ["MERGE_PATCH", "STRATEGIC_PATCH", "Kube"]


class Kube(Protocol):
    """Paths are absolute (`/api/v1/pods`)."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON: ...

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream: ...

    def get(self, path: str) -> JSON: ...

    def create(self, path: str, body: JSON) -> JSON: ...

    def patch(self, path: str, body: JSON, content_type: str = MERGE_PATCH) -> JSON: ...

    def update(self, path: str, body: JSON) -> JSON: ...

    def delete(self, path: str, body: JSON | None = None) -> JSON: ...
