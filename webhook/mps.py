"""A `real-time-mps` pod's MPS wiring: the patch that connects it to its GPU's daemon.

The pod gets the inline CSI volume `gpupack-mps` (`gpupack.mps`), and each GPU container
mounts it twice: the GPU's MPS directory at /run/gpupack/mps (pipes and logs, named by
`CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY`, which `webhook.rewrite.gpu_env`
sets) and its shared memory at /dev/shm. Which GPU's directory the volume holds is the
node agent's business at mount time: it reads the assignment the scheduler wrote.

A container that mounts something of its own at either path loses that mount: an MPS
client whose /dev/shm is not its server's cannot connect, and two mounts at one path
are refused by the API server. The decision's warnings say which mount went. Pure: the
pod in, JSONPatch operations and warnings out.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from gpupack import mps
from gpupack.gpu_request import GpuSlot
from gpupack.objects import JSON, PodSpec
from webhook import patch

_PATHS = frozenset({mps.MOUNT_PATH, mps.SHM_PATH})


@dataclass(frozen=True, slots=True)
class Wiring:
    ops: tuple[JSON, ...]
    warnings: tuple[str, ...]


def _mount_ops(container: JSON, base: str) -> tuple[list[JSON], list[str]]:
    mounts = [m for m in container.get("volumeMounts") or [] if isinstance(m, dict)]
    ours = mps.volume_mounts()
    kept = [m for m in mounts if m.get("mountPath") not in _PATHS and not mps.is_mps_wiring(m)]
    wanted = [*kept, *ours]
    if "volumeMounts" not in container or container.get("volumeMounts") is None:
        return [patch.add(f"{base}/volumeMounts", wanted)], []
    if wanted == container.get("volumeMounts"):
        return [], []
    name = container.get("name")
    warnings = [
        f"container {name}: volume {m.get('name')!r} is no longer mounted at "
        f"{m.get('mountPath')}: CUDA MPS needs gpupack's {m.get('mountPath')} there"
        for m in mounts
        if m.get("mountPath") in _PATHS and m not in ours
    ]
    return [patch.replace(f"{base}/volumeMounts", wanted)], warnings


def wiring(spec: PodSpec, slots: Sequence[GpuSlot]) -> Wiring:
    """The volume and the mounts of every GPU container (the environment is
    `gpu_env`'s). Idempotent: a pod that has them gets no operation."""
    ops, warnings = patch.volume_ops(spec, mps.volume())
    for slot in slots:
        if slot.count <= 0:
            continue
        container = spec[slot.field][slot.index]  # type: ignore[literal-required]
        more, said = _mount_ops(container, patch.pointer("spec", slot.field, slot.index))
        ops += more
        warnings += said
    return Wiring(tuple(ops), tuple(warnings))
