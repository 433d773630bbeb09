"""What the memory shim's CSI driver (`cuda.gpupack.io`) gives a pod, and to whom.

Every memory-enforced pod mounts one inline `cuda.gpupack.io` volume (`gpupack.cuda`).
At `NodePublishVolume` the kubelet names the pod; the driver reads it from the API
server and `decide`s: a pod bound to this node, with the UID the kubelet gave, whose
sealed `gpupack.io/enforcement` names `memory` and whose `gpupack.io/gpu-memory` parses,
gets its directory; any other is refused, with a reason the kubelet puts in its
FailedMount event. A pod cannot choose its limit: the webhook wrote and sealed it, the
trust-boundary policies keep it from changing, and the driver reads it from the API
server, never from the volume's attributes.

The directory is the kubelet's target path itself, filled with plain files, so the
driver mounts nothing (root to write under the kubelet's pod directories, no
CAP_SYS_ADMIN). The library (a copy of the node agent's), `ld.so.preload` naming it and
`limit` (the share in bytes) are root's; the pod mounts the directory read-only, so not
even a root container changes them. `budget` (zeroed, `gpupack.budget.BYTES` long) is the
one file the pod's processes write, through a mount of its own (0666: every container of
the pod, whatever its user). The kubelet bind-mounts both into each container, so they
share one budget. Unpublish empties and removes it.

A pod paced to its compute share (`gpupack.io/enforcement` names `compute` or
`compute-cap`) gets `compute` too (its sealed `gpupack.io/gpu-compute` in millis and the
mode, root's), and `gpu-time`, the file the pods of its GPU (`gpupack.io/gpu-uuid`) pace
by: a hard link to the one the GPU's other published pods have (the kubelet's pod
directories are one filesystem), so one inode is shared through each pod's writable
mount of it; the GPU's first pod gets a new one, and `gpu` beside it names the GPU, so a
restarted driver finds the file again. A pod with no GPU UUID gets a file of its own: its
launches are paced as if alone on its GPU (the log says so).

A second publish (the kubelet publishes again after it restarts) keeps the budget, and
where its processes already use another layout of it (a node agent upgraded under a
running pod), keeps the library and preload file they came with too: the pod's new
processes must keep the budget as its old ones do.
"""

import contextlib
import errno
import logging
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from gpupack import budget as budget_file
from gpupack import codec, cuda, keys
from gpupack.errors import ContractError
from gpupack.objects import JSON, annotations_of
from node.csi import (
    PodGetter,
    PublishRequest,
    Refused,
    UnpublishRequest,
    check_volume_id,
    requested_pod,
)

log = logging.getLogger(__name__)

READ_ONLY: Final = 0o644
SHARED: Final = 0o666
GPU: Final = "gpu"  # beside a paced pod's `gpu-time`: the UUID of the GPU it is the file of
_GPU_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")  # NVML's UUIDs: GPU-..., MIG-...


@dataclass(frozen=True, slots=True)
class Limit:
    """A pod the shim holds: its memory share in bytes, and, when the shim paces its
    launches, its compute share (millis), the mode (`share`, `cap`) and its GPU."""

    bytes: int
    compute: int | None = None
    mode: str | None = None
    gpu: str | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str


def decide(pod: JSON, uid: str, *, node: str) -> Limit | Refusal:
    """Whether `pod` (the kubelet says its UID is `uid`) gets a shim directory on `node`."""
    meta = pod.get("metadata") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != uid:
        return Refusal(f"pod {name} is not the one the kubelet mounts for (UID {uid})")
    if (pod.get("spec") or {}).get("nodeName") != node:
        return Refusal(f"pod {name} is not bound to node {node}")
    annotations = annotations_of(pod)
    if cuda.MEMORY not in cuda.enforced(annotations.get(keys.ENFORCEMENT)):
        return Refusal(
            f"pod {name} is not held to a GPU memory share by gpupack ({keys.ENFORCEMENT} "
            "does not name memory): only such pods get the memory shim"
        )
    try:
        memory = codec.read_memory(annotations)
    except ContractError as error:
        return Refusal(f"pod {name}: {error}")
    if memory is None:
        return Refusal(f"pod {name} has no {keys.GPU_MEMORY}: no share to hold it to")
    mode = cuda.compute_mode(cuda.enforced(annotations.get(keys.ENFORCEMENT)))
    if mode is None:
        return Limit(memory)
    try:
        compute = codec.read_compute(annotations)
    except ContractError as error:
        return Refusal(f"pod {name}: {error}")
    if compute is None:
        return Refusal(f"pod {name} has no {keys.GPU_COMPUTE}: no compute share to pace it to")
    gpu = annotations.get(keys.GPU_UUID)
    return Limit(memory, compute, mode, gpu if gpu and _GPU_NAME.fullmatch(gpu) else None)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Atomically: a container never reads half a file. The mode is set on the open file
    (`fchmod`), never by path: a name swapped for a symlink between the write and the
    chmod would hand that mode to whatever it points at (another pod's file)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            os.fchmod(stream.fileno(), mode)
        os.replace(temporary, path)  # rename(2) replaces a symlink, never follows it
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _chmod_directory(path: Path, mode: int) -> None:
    """chmod of the directory itself, through a descriptor opened without following a
    symlink (ELOOP, OSError, for one)."""
    handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(handle, mode)
    finally:
        os.close(handle)


def _older_layout(budget: Path) -> str | None:
    """What another version of the shim stamped on a budget in use, or None."""
    try:
        handle = os.open(budget, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:  # ELOOP: a symlink swapped in since; read nothing through it
        if error.errno == errno.ELOOP:
            return None
        raise
    with os.fdopen(handle, "rb") as stream:
        magic = stream.read(len(budget_file.MAGIC))
    if magic in (budget_file.MAGIC, bytes(len(magic))) or not magic:
        return None
    return magic.decode("ascii", "replace")


class CudaVolumes:
    """The driver's node side: publish and unpublish, idempotent as CSI asks.

    `pods_dir` (the kubelet's pod directories): where, after a restart, the driver looks
    for the `gpu-time` file of a GPU its pods already share."""

    def __init__(
        self, library: Path, *, node: str, get_pod: PodGetter, pods_dir: Path | None = None
    ) -> None:
        self._library = library
        self._node = node
        self._get_pod = get_pod
        self._pods_dir = pods_dir
        self._gpu_files: dict[str, Path] = {}  # GPU UUID -> a published pod's `gpu-time`
        self._gpu_lock = threading.Lock()

    def publish(self, request: PublishRequest) -> None:
        pod = requested_pod(request, self._get_pod, cuda.DRIVER)
        namespace, name, uid = request.pod
        decision = decide(pod, uid, node=self._node)
        if isinstance(decision, Refusal):
            log.warning("refused %s for %s/%s: %s", cuda.DRIVER, namespace, name, decision.reason)
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, decision.reason)
        target = Path(request.target_path)
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
        _chmod_directory(target, 0o755)  # every container of the pod reads it
        budget = target / cuda.BUDGET
        if budget.is_symlink():  # not what this driver writes: nothing is read through it
            log.warning("replaced a symlink at the budget of %s/%s", namespace, name)
            budget.unlink()
        older = _older_layout(budget)
        if older:
            log.warning(
                "kept the memory shim of %s/%s as it was: its budget is in use by another "
                "version of the shim (%s)",
                namespace,
                name,
                older,
            )
        else:
            _write(target / cuda.LIBRARY, self._library.read_bytes(), READ_ONLY)
            _write(target / cuda.PRELOAD, f"{cuda.LIBRARY_PATH}\n".encode(), READ_ONLY)
        _write(target / cuda.LIMIT, f"{decision.bytes}\n".encode(), READ_ONLY)
        if not budget.exists():  # a second publish keeps what the pod's processes hold
            _write(budget, bytes(budget_file.BYTES), SHARED)
        if decision.compute is not None and decision.mode is not None:
            self._pace(target, decision.compute, decision.mode, decision.gpu, f"{namespace}/{name}")
        log.info(
            "published the memory shim for %s/%s",
            namespace,
            name,
            extra={"target": str(target), "limit": decision.bytes},
        )

    def _pace(self, target: Path, compute: int, mode: str, gpu: str | None, pod: str) -> None:
        """The pod's `compute` file, and its GPU's `gpu-time`: a hard link to the file the
        GPU's other pods already have, so all of them pace by one file (the kubelet's
        pod directories are one filesystem), or a new one for the GPU's first."""
        _write(target / cuda.COMPUTE, cuda.compute_file(compute, mode).encode(), READ_ONLY)
        path = target / cuda.GPU_TIME
        if path.is_file() and not path.is_symlink():
            return  # a second publish: the pod's processes already pace by it
        path.unlink(missing_ok=True)
        with self._gpu_lock:
            if gpu is not None:
                for source in (self._gpu_files.get(gpu), self._find(gpu)):
                    if source is not None and _link(source, path):
                        self._gpu_files[gpu] = path
                        _write(target / GPU, f"{gpu}\n".encode(), READ_ONLY)
                        return
            _write(path, bytes(cuda.GPU_TIME_BYTES), SHARED)
            if gpu is None:
                log.warning(
                    "%s has no %s: its launches are paced by a file of its own, as if alone "
                    "on its GPU",
                    pod,
                    keys.GPU_UUID,
                )
                return
            self._gpu_files[gpu] = path
            _write(target / GPU, f"{gpu}\n".encode(), READ_ONLY)

    def _find(self, gpu: str) -> Path | None:
        """A published pod's `gpu-time` of `gpu` (after a restart, none is remembered)."""
        if self._pods_dir is None:
            return None
        for named in self._pods_dir.glob(f"*/volumes/kubernetes.io~csi/*/mount/{GPU}"):
            try:
                if named.read_text().strip() == gpu and not named.is_symlink():
                    return named.parent / cuda.GPU_TIME
            except OSError:
                continue
        return None

    def unpublish(self, request: UnpublishRequest) -> None:
        check_volume_id(request.volume_id)
        target = Path(request.target_path)
        shutil.rmtree(target, ignore_errors=True)


def _link(source: Path, path: Path) -> bool:
    """`path` made a hard link to `source` (a regular file, never through a symlink)."""
    try:
        if source.is_symlink() or not source.is_file():
            return False
        os.link(source, path, follow_symlinks=False)
    except OSError as error:
        log.warning("could not link %s to %s: %s", path, source, error)
        return False
    return True
