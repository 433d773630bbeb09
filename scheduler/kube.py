"""The API calls the extender makes, as a Protocol: the verbs its RBAC grants.

list and watch (nodes and pods, for the informers), get (a pod again after a Conflict,
kube-scheduler's Lease), create (Bindings carrying the assignment, Events, evictions,
capacity pods), patch (the autoscalers' annotations on capacity pods, the
`gpupack.io/node` label on GPU nodes where Karpenter runs) and delete (capacity pods).
`gpupack.runtime.transport.Transport` is the real one; tests pass in-memory fakes.
"""

from collections.abc import Mapping
from typing import Protocol

from gpupack.objects import JSON
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

    def delete(self, path: str, body: JSON | None = None) -> JSON: ...
