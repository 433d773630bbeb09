"""A memory-enforced pod's shim wiring: the patch that loads libgpupack-cuda.so in it.

The pod gets the inline CSI volume `gpupack-cuda` (`gpupack.cuda`), and each of its
containers and init containers (not only the one that asked for the GPU: the budget is
the pod's, and a sidecar whose image sets `NVIDIA_VISIBLE_DEVICES=all` reaches GPUs
too) mounts it three times: the pod's directory at /run/gpupack/cuda read-only (the
library and the limit: a root container can change neither), its `budget` over the
same path writable (the one file the pod's processes write, shared by every container),
and its `ld.so.preload` over the container's `/etc/ld.so.preload`, read-only, so the
dynamic loader loads the shim into every process, whatever its environment. A pod paced
to its compute share mounts its GPU's `gpu-time` writable too, the file the GPU's pods
pace by. Each gets
`GPUPACK_CUDA_DIR=/run/gpupack/cuda`, so an image's ENV cannot point the shim elsewhere.

A container that mounts a file of its own at /etc/ld.so.preload keeps it: the shim goes
into its `LD_PRELOAD` instead, ahead of anything there (a process that clears its
environment then runs without the shim; the warning says so). A container that mounts
something at or below /run/gpupack/cuda loses that mount, and one that sets its own
GPUPACK_CUDA_DIR loses that value: the path is gpupack's. Pure: the pod in, JSONPatch
operations and warnings out (what `stamp` adds after the plan's patch, which gives every
GPU container an `env` list, and after `webhook.mps`'s mounts).
"""

from dataclasses import dataclass
from typing import Any, cast

from gpupack import cuda
from gpupack.gpu_request import CONTAINER_FIELDS, scan_gpus
from gpupack.objects import JSON, PodSpec
from webhook import patch


@dataclass(frozen=True, slots=True)
class Wiring:
    ops: tuple[JSON, ...]
    warnings: tuple[str, ...]


def _own_preload(mounts: list[JSON]) -> bool:
    return any(
        m.get("mountPath") == cuda.PRELOAD_PATH and not cuda.is_cuda_wiring(m) for m in mounts
    )


def _mount_ops(container: JSON, base: str, *, compute: bool) -> tuple[list[JSON], list[str]]:
    mounts = [m for m in container.get("volumeMounts") or [] if isinstance(m, dict)]
    name = container.get("name")
    own = _own_preload(mounts)
    ours = cuda.volume_mounts(preload=not own, compute=compute)
    kept = [
        m
        for m in mounts
        if not cuda.under_shim_path(m.get("mountPath")) and not cuda.is_cuda_wiring(m)
    ]
    wanted = [*kept, *ours]
    warnings = [
        f"container {name}: volume {m.get('name')!r} is no longer mounted at "
        f"{m.get('mountPath')}: the memory shim needs gpupack's directory at {cuda.MOUNT_PATH}"
        for m in mounts
        if cuda.under_shim_path(m.get("mountPath")) and not cuda.is_cuda_wiring(m)
    ]
    if container.get("volumeMounts") is None:
        return [patch.add(f"{base}/volumeMounts", wanted)], warnings
    if wanted == container.get("volumeMounts"):
        return [], warnings
    return [patch.replace(f"{base}/volumeMounts", wanted)], warnings


def _preload_env_ops(container: JSON, base: str) -> tuple[list[JSON], list[str]]:
    """The shim ahead of the container's own LD_PRELOAD, for a container that mounts its
    own /etc/ld.so.preload."""
    name = container.get("name")
    env = [e for e in container.get("env") or [] if isinstance(e, dict)]
    said = (
        f"container {name} mounts its own {cuda.PRELOAD_PATH}: kept, and the memory shim "
        f"is loaded through {cuda.ENV_PRELOAD} instead (a process that clears its "
        "environment runs without it)"
    )
    index = next((i for i, e in enumerate(env) if e.get("name") == cuda.ENV_PRELOAD), None)
    if index is None:  # the plan's patch gave every GPU container an env list
        return [
            patch.add(f"{base}/env/-", {"name": cuda.ENV_PRELOAD, "value": cuda.LIBRARY_PATH})
        ], [said]
    current = env[index]
    if "valueFrom" in current:
        return [], [
            f"container {name} mounts its own {cuda.PRELOAD_PATH} and takes "
            f"{cuda.ENV_PRELOAD} from elsewhere: the memory shim is not loaded there"
        ]
    value = str(current.get("value") or "")
    if cuda.LIBRARY_PATH in value.replace(" ", ":").split(":"):
        return [], [said]
    joined = f"{cuda.LIBRARY_PATH}:{value}" if value else cuda.LIBRARY_PATH
    return [patch.replace(f"{base}/env/{index}", {"name": cuda.ENV_PRELOAD, "value": joined})], [
        said
    ]


def _directory_env_ops(container: JSON, base: str) -> tuple[list[JSON], list[str]]:
    """`GPUPACK_CUDA_DIR` set to gpupack's directory (the container has an env list)."""
    env = [e for e in container.get("env") or [] if isinstance(e, dict)]
    wanted = cuda.directory_environment()
    index = next((i for i, e in enumerate(env) if e.get("name") == cuda.ENV_DIR), None)
    if index is None:
        return [patch.add(f"{base}/env/-", wanted)], []
    if env[index] == wanted:
        return [], []
    return [patch.replace(f"{base}/env/{index}", wanted)], [
        f"container {container.get('name')}: its {cuda.ENV_DIR} is replaced by "
        f"{cuda.MOUNT_PATH}: the memory shim's directory is gpupack's"
    ]


def _gpu_containers(spec: PodSpec) -> set[tuple[str, int]]:
    """The containers the plan's patch gave an env list (those that asked for the GPU)."""
    return {(slot.field, slot.index) for slot in scan_gpus(spec).slots if slot.count > 0}


def wiring(spec: PodSpec, *, compute: bool = False) -> Wiring:
    """The volume, and the mounts and environment (LD_PRELOAD too, where a container
    brings its own preload file) of every container and init container; with `compute`
    (the pod is paced to its compute share) the GPU's `gpu-time` file too. Idempotent: a
    pod that has them gets no operation."""
    ops, warnings = patch.volume_ops(spec, cuda.volume())
    with_env = _gpu_containers(spec)  # the plan's patch gave these an env list
    for field in CONTAINER_FIELDS:
        containers = cast(list[Any], spec.get(field) or [])
        for index, container in enumerate(containers):
            if not isinstance(container, dict):
                continue
            base = patch.pointer("spec", field, index)
            more, said = _mount_ops(container, base, compute=compute)
            ops += more
            warnings += said
            listed = container
            if (field, index) not in with_env and container.get("env") is None:
                listed = {**container, "env": []}
                ops.append(patch.add(f"{base}/env", []))
            more, said = _directory_env_ops(listed, base)
            ops += more
            warnings += said
            mounts = [m for m in container.get("volumeMounts") or [] if isinstance(m, dict)]
            if _own_preload(mounts):
                more, said = _preload_env_ops(listed, base)
                ops += more
                warnings += said
    return Wiring(tuple(ops), tuple(warnings))
