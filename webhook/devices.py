"""No GPU a container was not given: the pure decision behind `POST /devices`.

The NVIDIA container toolkit hands a container the GPUs its `NVIDIA_VISIBLE_DEVICES`
names, read from the container's environment: the image's `ENV` (every CUDA base image
says `all`), `envFrom`, or the pod spec; with the variable unset, an image that sets
`CUDA_VERSION` gets every GPU too. A variable in the container's `env` wins over all of
these. So every container the kubelet gives no GPU (no `nvidia.com/*` resource, no DRA
claim) and that names no devices itself gets `NVIDIA_VISIBLE_DEVICES=void`: the toolkit
then injects nothing. Containers given a GPU keep what the device plugin (or DRA) sets;
gpupack's fractional containers carry their own downward-API variable (`webhook.mutate`).

A variable a container already sets is left as written: the admission policy
`gpupack-pods` refuses every value but `void`, `none` and gpupack's own. Ephemeral
containers already on the pod are immutable; only those being added are given the
variable. The chart sends this path every pod outside the exempt namespaces where the
API server has no MutatingAdmissionPolicy (which does the same, in the API server).
"""

from collections.abc import Iterator, Mapping
from typing import Final

from gpupack.objects import JSON

# A pod as admission sends it: untrusted, so every field is checked before it is used.
AnyPod = Mapping[str, object]

DEVICE_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICES: Final = "void"
GPU_RESOURCE_PREFIX: Final = "nvidia.com/"
CONTAINER_FIELDS: Final = ("initContainers", "containers", "ephemeralContainers")


def given_a_gpu(container: JSON) -> bool:
    """Whether the kubelet gives the container a GPU: an `nvidia.com/*` resource in its
    limits or requests (whole GPUs, MIG slices, renamed time-sliced GPUs), or a DRA
    claim, whose driver sets the devices it prepared."""
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return False
    for field in ("limits", "requests"):
        amounts = resources.get(field)
        if isinstance(amounts, dict) and any(
            isinstance(name, str) and name.startswith(GPU_RESOURCE_PREFIX) for name in amounts
        ):
            return True
    return bool(resources.get("claims"))


def names_devices(container: JSON) -> bool:
    """Whether the container's `env` sets NVIDIA_VISIBLE_DEVICES itself."""
    env = container.get("env")
    return isinstance(env, list) and any(
        isinstance(variable, dict) and variable.get("name") == DEVICE_ENV for variable in env
    )


def _containers(pod: AnyPod, field: str) -> list[object]:
    """The pod's `field` list as sent (indices are what the patch addresses)."""
    spec = pod.get("spec")
    containers = spec.get(field) if isinstance(spec, dict) else None
    return containers if isinstance(containers, list) else []


def _names(pod: AnyPod | None, field: str) -> set[str]:
    if pod is None:
        return set()
    return {str(c.get("name")) for c in _containers(pod, field) if isinstance(c, dict)}


def unguarded(pod: AnyPod, old: AnyPod | None = None) -> Iterator[tuple[str, int, JSON]]:
    """(field, index, container) for each container that would reach GPUs through its
    image: given no GPU and naming no devices. With `old` (an update of ephemeral
    containers), only the containers `old` does not have."""
    for field in CONTAINER_FIELDS:
        existing = _names(old, field)
        for index, container in enumerate(_containers(pod, field)):
            if not isinstance(container, dict) or container.get("name") in existing:
                continue
            if not given_a_gpu(container) and not names_devices(container):
                yield field, index, container


def device_env_patch(pod: AnyPod, old: AnyPod | None = None) -> list[JSON]:
    """The JSONPatch that gives every unguarded container `NVIDIA_VISIBLE_DEVICES=void`;
    empty when there is none."""
    variable = {"name": DEVICE_ENV, "value": NO_DEVICES}
    patch: list[JSON] = []
    for field, index, container in unguarded(pod, old):
        path = f"/spec/{field}/{index}/env"
        if isinstance(container.get("env"), list):
            patch.append({"op": "add", "path": f"{path}/-", "value": variable})
        else:
            patch.append({"op": "add", "path": path, "value": [variable]})
    return patch
