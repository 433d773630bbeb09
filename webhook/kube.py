"""The API calls the webhook makes, as a Protocol: the verbs its RBAC grants.

list and watch (namespaces, capacity and fractional pods, GPUPolicies,
GPURecommendations, for the informers) and get (a Namespace the cache may have stale).
It creates nothing: capacity pods are the scheduler's.
`gpupack.runtime.transport.Transport` is the real one; tests pass the in-memory fake of
`tests/fakes.py`.
"""

from collections.abc import Mapping
from typing import Protocol

from gpupack.objects import JSON
from gpupack.runtime.api import WatchStream


class KubeClient(Protocol):
    """Paths are absolute (`/api/v1/pods`)."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON: ...

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream: ...

    def get(self, path: str, *, timeout: float | None = None) -> JSON: ...

    def close(self) -> None: ...  # release connections; the client is not used afterwards
