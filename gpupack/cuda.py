"""GPU memory enforcement: where a shared pod meets the memory shim, and what it is told.

A shared pod's memory share is held two ways (docs/isolation.md):

- **the shim** (`libgpupack-cuda.so`, cuda-shim/): the node agent's CSI driver
  `cuda.gpupack.io` gives each such pod one directory, mounted read-only at `MOUNT_PATH`
  in every container, with `GPUPACK_CUDA_DIR` naming it: the library, an `ld.so.preload`
  naming it (mounted over the container's `/etc/ld.so.preload`, so every process loads
  it), `limit` (the share in bytes, written from the pod's sealed `gpupack.io/gpu-memory`)
  and `budget` (what the pod's processes hold, shared by all its containers: the one
  file they write, on a writable mount of its own; `gpupack.budget` reads it);
- **the driver's own limit** on nodes that have it (driver >= r615, the NVIDIA container
  toolkit's memory-limit hook, cgroup v2): `NVIDIA_GPU_MEMORY_LIMIT` and
  `NVIDIA_GPU_MEMORY_REQUEST` (MiB) on each GPU container.

`gpupack.io/enforcement` names what applies, as a comma-separated list in a fixed order:
`mps` (CUDA MPS limits), `memory` (the shim and the driver's limit), and `compute` or
`compute-cap` (the shim paces the pod's launches to its compute share, `COMPUTE`), or
`accounting` when none does (only the scheduler's books hold the share). Pure and standard
library only: the webhook, the node agent and the scheduler agree on these.
"""

from typing import Final

from gpupack import keys
from gpupack.objects import JSON

DRIVER: Final = f"cuda.{keys.DOMAIN}"  # the CSI driver that serves the shim
VOLUME: Final = "gpupack-cuda"  # the volume's name in a pod
MOUNT_PATH: Final = "/run/gpupack/cuda"  # the pod's directory in each GPU container
LIBRARY: Final = "libgpupack-cuda.so"
PRELOAD: Final = "ld.so.preload"  # in the directory: the one line naming the library
PRELOAD_PATH: Final = "/etc/ld.so.preload"  # where the dynamic loader reads it
LIMIT: Final = "limit"
BUDGET: Final = "budget"
# Compute shares (cuda-shim/compute.c): the pod's share and mode ("300 share"), and the
# GPU's file its pods pace by, one per GPU, linked into each of their directories.
COMPUTE: Final = "compute"
GPU_TIME: Final = "gpu-time"
GPU_TIME_BYTES: Final = 64 + 128 * 64  # a header, then 128 slots of 64 bytes
LIBRARY_PATH: Final = f"{MOUNT_PATH}/{LIBRARY}"
BUDGET_PATH: Final = f"{MOUNT_PATH}/{BUDGET}"
GPU_TIME_PATH: Final = f"{MOUNT_PATH}/{GPU_TIME}"
ENV_DIR: Final = "GPUPACK_CUDA_DIR"  # the shim's directory, set on every container it holds
# Where the node agent's image keeps the library it hands out.
IMAGE_LIBRARY: Final = f"/opt/gpupack/lib/{LIBRARY}"
ENV_PRELOAD: Final = "LD_PRELOAD"  # where the shim goes when a container brings its own file

# NVIDIA's per-container memory limit (container toolkit >= 1.20.1, driver >= r615).
ENV_MEMORY_LIMIT: Final = "NVIDIA_GPU_MEMORY_LIMIT"
ENV_MEMORY_REQUEST: Final = "NVIDIA_GPU_MEMORY_REQUEST"
ENV_VARIABLES: Final = (ENV_MEMORY_LIMIT, ENV_MEMORY_REQUEST)

# `gpupack.io/enforcement`'s words.
ACCOUNTING: Final = "accounting"
MPS: Final = "mps"
MEMORY: Final = "memory"
COMPUTE_SHARE: Final = "compute"  # GPU time in proportion to the share, idle time to any
COMPUTE_CAP: Final = "compute-cap"  # and never past the share
COMPUTE_WORDS: Final = {COMPUTE_SHARE: "share", COMPUTE_CAP: "cap"}  # the `compute` file's mode

# The pod annotation that opts one workload out of memory enforcement.
OPT_OUT_VALUE: Final = "off"


def enforcement_value(*, mps: bool, memory: bool, compute: str | None = None) -> str:
    """The annotation's value for what applies to a pod; `compute` is `COMPUTE_SHARE`,
    `COMPUTE_CAP` or None (pacing rides on the shim: only with `memory`)."""
    if compute is not None and (compute not in COMPUTE_WORDS or not memory):
        raise ValueError(f"compute pacing {compute!r} needs the shim (memory) and a known mode")
    words = [word for word, on in ((MPS, mps), (MEMORY, memory)) if on]
    return ",".join([*words, *([compute] if compute else [])]) or ACCOUNTING


def compute_mode(applies: frozenset[str]) -> str | None:
    """The `compute` file's mode (share, cap) for what `enforced` named, or None."""
    for word, mode in COMPUTE_WORDS.items():
        if word in applies:
            return mode
    return None


def compute_file(millis: int, mode: str) -> str:
    """The pod's `compute` file: its share in millis of a GPU and the mode."""
    return f"{millis} {mode}\n"


def enforced(value: str | None) -> frozenset[str]:
    """The mechanisms an `gpupack.io/enforcement` value names (none for accounting)."""
    if not value:
        return frozenset()
    return frozenset(word.strip() for word in value.split(",") if word.strip() != ACCOUNTING)


def volume() -> JSON:
    """The inline CSI volume of a pod the shim holds (the driver decides what it holds)."""
    return {"name": VOLUME, "csi": {"driver": DRIVER}}


def volume_mounts(*, preload: bool = True, compute: bool = False) -> list[JSON]:
    """The pod's directory, read-only (the library, `limit`, `compute`); its `budget`, and
    with `compute` its GPU's `gpu-time`, the files the pod's processes write, each on a
    mount of its own; and its `ld.so.preload` over the container's (read-only)."""
    mounts: list[JSON] = [
        {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True},
        {"name": VOLUME, "mountPath": BUDGET_PATH, "subPath": BUDGET},
    ]
    if compute:
        mounts.append({"name": VOLUME, "mountPath": GPU_TIME_PATH, "subPath": GPU_TIME})
    if preload:
        mounts.append(
            {"name": VOLUME, "mountPath": PRELOAD_PATH, "subPath": PRELOAD, "readOnly": True}
        )
    return mounts


def directory_environment() -> JSON:
    """`GPUPACK_CUDA_DIR` as the webhook sets it on every container the shim holds: an
    image's own ENV (or an envFrom) can then not point the shim at another directory."""
    return {"name": ENV_DIR, "value": MOUNT_PATH}


def under_shim_path(path: object) -> bool:
    """A mount path at or below the shim's directory, which is gpupack's alone."""
    return isinstance(path, str) and (path == MOUNT_PATH or path.startswith(f"{MOUNT_PATH}/"))


def memory_environment(memory: int) -> list[JSON]:
    """The driver's own limit: the share in MiB, as both limit and request (rounded down,
    at least 1)."""
    mib = str(max(1, memory >> 20))
    return [{"name": name, "value": mib} for name in ENV_VARIABLES]


def is_cuda_wiring(volume_or_mount: JSON) -> bool:
    """A volume or mount gpupack added for the shim (by name)."""
    return volume_or_mount.get("name") == VOLUME
