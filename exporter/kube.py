"""The API calls the node agent makes, as a Protocol: the verbs its RBAC grants.

list and watch (the node's pods) and a JSON merge patch (the GPU annotation on capacity
pods, with a resourceVersion precondition). `gpupack.runtime.transport.Transport` is the
real one; tests pass an in-memory fake.
"""

from collections.abc import Mapping
from typing import Protocol

from gpupack.objects import JSON
from gpupack.runtime.api import WatchStream


class Kube(Protocol):
    """Paths are absolute (`/api/v1/pods`)."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON: ...

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream: ...

    def patch(self, path: str, body: JSON) -> JSON: ...
