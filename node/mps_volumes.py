"""What the MPS CSI driver mounts, for whom, and the mounts themselves.

Every party of a `real-time-mps` GPU mounts an inline `mps.gpupack.io` volume
(`gpupack.mps`). At `NodePublishVolume` the kubelet names the pod; the driver reads it
from the API server and `decide`s:

- an MPS pool's capacity pod (in gpupack's namespace, labelled `gpupack.io/sharing=mps`)
  gets a new directory for its GPU, `<root>/<its UID>` with `pipe/`, `log/` and `shm/`
  (a tmpfs of `shm_size`, the MPS server's shared memory with its clients);
- a pod the scheduler placed on such a GPU (`gpupack.io/enforcement: mps`, and a
  `gpupack.io/capacity-pod` naming an MPS capacity pod on this node, both naming the
  same GPU: a GPU either does not name yet is refused) gets that capacity pod's
  directory, its `pipe/` and `log/` read-only;
- any other pod is refused, with a reason the kubelet puts in its FailedMount event. A
  pod cannot choose the directory: the kubelet says which pod it is, the scheduler alone
  writes the assignment, and the pod's UID must be the one the API server has.

`MpsVolumes` does it: recursive bind mounts of the GPU's directory onto the kubelet's
target paths, the tmpfs, and on unpublish of the capacity pod's volume, the directory's
removal. A small record per volume (`<root>/.volumes/<volume id>`) says which volumes
own a directory, so this survives a driver restart. Mounting needs CAP_SYS_ADMIN in
the node's mount namespace (a privileged container, `Bidirectional` propagation).
"""

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from gpupack import cuda, keys, mps
from gpupack.capacity import SHARING, runs_mps_daemon
from gpupack.errors import ContractError
from gpupack.objects import JSON, annotations_of, labels_of
from gpupack.quantity import parse_bytes
from node.csi import (
    PodGetter,
    PublishRequest,
    Refused,
    UnpublishRequest,
    check_volume_id,
    requested_pod,
)

log = logging.getLogger(__name__)

MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
MS_NOEXEC: Final = 0x8
MS_RDONLY: Final = 0x1
MS_REMOUNT: Final = 0x20
MS_BIND: Final = 0x1000
MS_REC: Final = 0x4000
MNT_DETACH: Final = 0x2
DEFAULT_SHM_SIZE: Final = "256Mi"
RECORDS: Final = ".volumes"


@dataclass(frozen=True, slots=True)
class Daemon:
    """The capacity pod of an MPS GPU: its directory is created for it."""

    uid: str


@dataclass(frozen=True, slots=True)
class Client:
    """A pod placed on an MPS GPU: it shares the directory of `capacity`'s daemon."""

    uid: str  # the capacity pod's
    capacity: str


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str


Decision = Daemon | Client | Refusal


def _meta(pod: JSON) -> JSON:
    return pod.get("metadata") or {}


def decide(pod: JSON, uid: str, *, node: str, namespace: str, get_pod: PodGetter) -> Decision:
    """Whose MPS directory `pod` (the kubelet says its UID is `uid`) may mount on `node`."""
    meta = _meta(pod)
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != uid:
        return Refusal(f"pod {name} is not the one the kubelet mounts for (UID {uid})")
    if (pod.get("spec") or {}).get("nodeName") != node:
        return Refusal(f"pod {name} is not bound to node {node}")
    labels, annotations = labels_of(pod), annotations_of(pod)
    if meta.get("namespace") == namespace and labels.get(keys.ROLE) == keys.ROLE_CAPACITY:
        if not runs_mps_daemon(pod):
            return Refusal(f"capacity pod {name} is not of an MPS pool ({SHARING} is not mps)")
        return Daemon(uid)
    if cuda.MPS not in cuda.enforced(annotations.get(keys.ENFORCEMENT)):
        return Refusal(
            f"pod {name} is not a real-time-mps pod admitted by gpupack "
            f"({keys.ENFORCEMENT} does not name mps): only those share a GPU's MPS daemon"
        )
    holder = annotations.get(keys.CAPACITY_POD)
    if not holder:
        return Refusal(f"pod {name} has no GPU assigned ({keys.CAPACITY_POD} is not set)")
    capacity = get_pod(namespace, holder)
    if capacity is None or _meta(capacity).get("deletionTimestamp"):
        return Refusal(f"pod {name}: its capacity pod {namespace}/{holder} is gone")
    if not runs_mps_daemon(capacity):
        return Refusal(f"pod {name}: capacity pod {holder} does not run an MPS daemon")
    if (capacity.get("spec") or {}).get("nodeName") != node:
        return Refusal(f"pod {name}: capacity pod {holder} is not on node {node}")
    mine, theirs = annotations.get(keys.GPU_UUID), annotations_of(capacity).get(keys.GPU_UUID)
    if not mine or not theirs:  # fail closed: an unknown GPU is not the capacity pod's
        whose = f"pod {name}" if not mine else f"pod {name}: its capacity pod {holder}"
        return Refusal(f"{whose} names no GPU ({keys.GPU_UUID}) yet")
    if mine != theirs:
        return Refusal(f"pod {name} is assigned GPU {mine}, capacity pod {holder} holds {theirs}")
    return Client(str(_meta(capacity).get("uid", "")), holder)


# --- mounts ---------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class Mounter:
    """mount(2) and umount2(2), as the driver uses them."""

    def __init__(self) -> None:
        self._libc = _libc()

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"{what}: {os.strerror(code)}")

    def bind(self, source: Path, target: Path) -> None:
        """Recursively: the tmpfs inside comes along."""
        self._check(
            self._libc.mount(
                str(source).encode(), str(target).encode(), None, MS_BIND | MS_REC, None
            ),
            f"bind {source} on {target}",
        )

    def read_only(self, path: Path) -> None:
        """`path` (inside a bind mount) bound onto itself and made read-only: a client
        connects to the daemon's sockets and pipes there (which a read-only mount allows)
        but cannot create, replace or remove anything in it."""
        self._check(
            self._libc.mount(str(path).encode(), str(path).encode(), None, MS_BIND, None),
            f"bind {path} on itself",
        )
        self._check(
            self._libc.mount(
                None, str(path).encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None
            ),
            f"remount {path} read-only",
        )

    def tmpfs(self, target: Path, size: int) -> None:
        options = f"size={size},mode=1777".encode()
        self._check(
            self._libc.mount(
                b"tmpfs", str(target).encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options
            ),
            f"mount tmpfs on {target}",
        )

    def mounted(self, path: Path) -> bool:
        """Whether `path` is a mount point (a bind mount from the same filesystem too,
        which `os.path.ismount` cannot tell)."""
        wanted = os.path.realpath(path)
        try:
            lines = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return os.path.ismount(path)
        return any(_unescape(line.split()[4]) == wanted for line in lines if line.count(" ") >= 4)

    def unmount(self, target: Path) -> None:
        result = self._libc.umount2(str(target).encode(), MNT_DETACH)
        if result != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
            self._check(result, f"unmount {target}")


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def shm_bytes(quantity: str) -> int:
    """The shared memory's size, a Kubernetes quantity (`256Mi`), in bytes. Positive: a
    tmpfs of size 0 has no limit. ValueError (a ContractError) naming the accepted form."""
    size = parse_bytes(quantity, "--shm-size")
    if size <= 0:
        raise ContractError("--shm-size", quantity, "a positive size such as 256Mi")
    return size


class MpsVolumes:
    """The driver's node side: publish and unpublish, idempotent as CSI asks."""

    def __init__(
        self,
        root: Path,
        *,
        node: str,
        namespace: str,
        get_pod: PodGetter,
        shm_size: str = DEFAULT_SHM_SIZE,
        mounter: Mounter | None = None,
    ) -> None:
        self._root = root
        self._node = node
        self._namespace = namespace
        self._get_pod = get_pod
        self._shm_size = shm_bytes(shm_size)
        self._mounter = mounter or Mounter()

    def directory(self, uid: str) -> Path:
        return self._root / uid

    def publish(self, request: PublishRequest) -> None:
        pod = requested_pod(request, self._get_pod, mps.DRIVER)
        namespace, name, uid = request.pod
        decision = decide(
            pod, uid, node=self._node, namespace=self._namespace, get_pod=self._get_pod
        )
        if isinstance(decision, Refusal):
            log.warning("refused %s for %s/%s: %s", mps.DRIVER, namespace, name, decision.reason)
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, decision.reason)
        target = Path(request.target_path)
        directory = self.directory(decision.uid)
        if isinstance(decision, Daemon):
            self._create(directory)
        elif not self._mounter.mounted(directory / mps.SHM):
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"the MPS daemon of capacity pod {decision.capacity} has not started on "
                f"this node yet; the kubelet will try again",
            )
        self._record(request.volume_id, decision.uid if isinstance(decision, Daemon) else "")
        target.mkdir(parents=True, exist_ok=True)
        if not self._mounter.mounted(target):
            self._mounter.bind(directory, target)
            if isinstance(decision, Client):  # the daemon's pipes and logs: read-only
                for part in (mps.PIPE, mps.LOG):
                    self._mounter.read_only(target / part)
        log.info(
            "published the MPS directory of %s for %s/%s",
            decision.uid,
            namespace,
            name,
            extra={"target": str(target)},
        )

    def unpublish(self, request: UnpublishRequest) -> None:
        check_volume_id(request.volume_id)
        target = Path(request.target_path)
        if self._mounter.mounted(target):
            self._mounter.unmount(target)
        with contextlib.suppress(FileNotFoundError):
            target.rmdir()
        record = self._root / RECORDS / request.volume_id
        with contextlib.suppress(FileNotFoundError):
            owner = record.read_text().strip()
            if owner:  # the capacity pod's volume: its GPU's directory goes with it
                self._remove(self.directory(owner))
            record.unlink()

    def _create(self, directory: Path) -> None:
        for sub in (mps.PIPE, mps.LOG, mps.SHM):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        shm = directory / mps.SHM
        if not self._mounter.mounted(shm):
            self._mounter.tmpfs(shm, self._shm_size)

    def _remove(self, directory: Path) -> None:
        shm = directory / mps.SHM
        if self._mounter.mounted(shm):
            self._mounter.unmount(shm)
        shutil.rmtree(directory, ignore_errors=True)
        log.info("removed the MPS directory %s", directory)

    def _record(self, volume_id: str, owner: str) -> None:
        records = self._root / RECORDS
        records.mkdir(parents=True, exist_ok=True)
        (records / volume_id).write_text(owner)
