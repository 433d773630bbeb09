"""The capacity pod as every component reads it: its names, labels and annotations.

Standard-library only and part of the contract: the scheduler creates capacity pods
(their manifest is `scheduler.manifest`'s), the webhook and `kubectl gpupack` reports
count them per pool, the node agent serves an MPS pool's daemon pod. How many a pool
lacks is `gpupack.packing`'s.

Names are `gpupack-capacity-<pool>-<n>` with the lowest free n: two writers racing for
the same pool (a restarted extender and its predecessor's creates still in flight)
choose the same names, and the API server's AlreadyExists turns the second create into
a no-op instead of a duplicate GPU.
"""

import re
from collections.abc import Iterable
from typing import Final

from gpupack import keys, mps
from gpupack.objects import JSON, labels_of

NAME_PREFIX: Final = "gpupack-capacity"
CONTAINER_NAME: Final = "capacity"
DEFAULT_IMAGE: Final = "registry.k8s.io/pause:3.10"
GPUPACK_IMAGE: Final = "ghcr.io/gpupack/gpupack"  # MPS pools' capacity pods run gpupack's
CREATED_FOR: Final = f"{keys.DOMAIN}/created-for"  # which workload first asked for the GPU
# The requirements it was made with (`scheduler.manifest.Where.key`): which waiting pods
# it is coming for.
PLACEMENT: Final = f"{keys.DOMAIN}/placement"
SHARING: Final = f"{keys.DOMAIN}/sharing"  # label on an MPS pool's capacity pods: "mps"


def default_mps_image(version: str) -> str:
    """gpupack's own image at `version`: what an MPS pool's capacity pods run."""
    return f"{GPUPACK_IMAGE}:{version}"


def capacity_name(pool: str, index: int) -> str:
    return f"{NAME_PREFIX}-{pool}-{index}"


def capacity_index(pool: str, name: str) -> int | None:
    """n for `gpupack-capacity-<pool>-<n>`, None for any other name."""
    match = re.fullmatch(rf"{re.escape(NAME_PREFIX)}-{re.escape(pool)}-(0|[1-9][0-9]*)", name)
    return int(match[1]) if match else None


def capacity_names(pool: str, used: Iterable[str], count: int) -> tuple[str, ...]:
    """`count` names for new capacity pods: the lowest indices not in `used`."""
    taken = {i for name in used if (i := capacity_index(pool, name)) is not None}
    names: list[str] = []
    index = 0
    while len(names) < count:
        if index not in taken:
            names.append(capacity_name(pool, index))
        index += 1
    return tuple(names)


def runs_mps_daemon(pod: JSON) -> bool:
    """A capacity pod of an MPS pool (labelled so by `scheduler.manifest.capacity_pod`):
    it runs its GPU's MPS control daemon and shares that GPU's MPS directory with the pods
    placed on it."""
    return labels_of(pod).get(SHARING) == mps.SHARING_MPS


def placement_of(pod: JSON) -> str:
    """The placement key a capacity pod was made with ("" when none)."""
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(PLACEMENT, ""))
