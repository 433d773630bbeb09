"""The GPUs DRA gave capacity pods on this node: read from the API server.

Where NVIDIA's DRA driver manages a node's GPUs and a DeviceClass maps `nvidia.com/gpu`
to its devices (Kubernetes 1.37, `DRAExtendedResource`), kube-scheduler gives a capacity
pod its GPU through a ResourceClaim it makes for the pod, named in the pod's
`status.extendedResourceClaimStatus`. The claim's allocation names the device (driver,
pool, name); the node's ResourceSlices give that device's `uuid` attribute
(`exporter.discovery.claim_gpu_uuids`). An allocated claim does not change while its pod
lives, so each answer is kept until the pod's claim is gone.
"""

from collections.abc import Collection, Mapping
from typing import Final, Protocol

from exporter.discovery import claim_gpu_uuids
from gpupack import keys
from gpupack.objects import JSON
from gpupack.runtime.api import ApiError

DRA_API: Final = f"/apis/{keys.DRA_API}"


class Reader(Protocol):
    def get(self, path: str, *, timeout: float | None = None) -> JSON: ...

    def list(self, path: str, params: Mapping[str, str]) -> JSON: ...


class ClaimReader:
    """`exporter.agent.ClaimGpus` over the API: `get` the claim (gpupack's namespace),
    `list` the node's ResourceSlices."""

    def __init__(self, kube: Reader, node: str) -> None:
        self._kube = kube
        self._node = node
        self._known: dict[tuple[str, str], tuple[str, ...]] = {}

    def uuids(
        self, namespace: str, claim: str, requests: tuple[str, ...]
    ) -> tuple[tuple[str, ...], str]:
        known = self._known.get((namespace, claim))
        if known is not None:
            return known, ""
        try:
            obj = self._kube.get(f"{DRA_API}/namespaces/{namespace}/resourceclaims/{claim}")
            slices = self._kube.list(
                f"{DRA_API}/resourceslices", {"fieldSelector": f"spec.nodeName={self._node}"}
            )
        except ApiError as error:
            return (), f"reading its ResourceClaim {claim} and this node's ResourceSlices: {error}"
        uuids, why = claim_gpu_uuids(obj, requests, slices.get("items") or ())
        if uuids:
            self._known[(namespace, claim)] = uuids
        return uuids, why

    def keep_only(self, claims: Collection[tuple[str, str]]) -> None:
        """Forget the answers of claims no capacity pod on the node names any more."""
        for key in [k for k in self._known if k not in claims]:
            del self._known[key]
