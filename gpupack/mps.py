"""CUDA MPS wiring: where a GPU's MPS control daemon and its clients meet.

A `real-time-mps` GPU runs one MPS control daemon, in the capacity pod that holds the
GPU, for as long as that pod lives. Daemon and clients must share two directories: the
pipe directory (the control daemon's named pipes and the server's sockets, named by
`CUDA_MPS_PIPE_DIRECTORY`) and `/dev/shm` (the server and its clients exchange work
through shared memory). Pods cannot share a directory without the node, so gpupack's
node agent serves a CSI driver, `mps.gpupack.io`, and every party mounts an inline
ephemeral volume of it:

- in the capacity pod, the driver creates the GPU's directory on the node
  (`HOST_ROOT/<capacity pod UID>`: `pipe/`, `log/`, and `shm/`, a tmpfs) and mounts it;
- in a client pod, the driver mounts the directory of the capacity pod the scheduler
  assigned it (the `gpupack.io/capacity-pod` annotation, which only the scheduler may
  write), and refuses any other pod.

A CSI volume is allowed by the `restricted` Pod Security level, where a `hostPath` is
not: users' MPS pods need no privilege. The pod identity comes from the kubelet
(`podInfoOnMount`), so a pod cannot name another GPU's directory.

Pure and standard-library only: the webhook (client pods), the capacity builder (daemon
pods) and the driver agree on these names and shapes.
"""

from typing import Final

from gpupack import keys
from gpupack.objects import JSON

DRIVER: Final = f"mps.{keys.DOMAIN}"  # the CSI driver's name
# The word for MPS sharing: the `gpupack.io/sharing` label of an MPS pool's capacity pods
# and the `gpupack.io/enforcement` annotation of the pods MPS enforces.
SHARING_MPS: Final = "mps"

VOLUME: Final = "gpupack-mps"  # the volume's name in every pod that mounts it
MOUNT_PATH: Final = "/run/gpupack/mps"  # where the GPU's directory appears in a container
PIPE: Final = "pipe"  # the GPU directory's subdirectories: the daemon's pipes,
LOG: Final = "log"  # its logs,
PIPE_DIRECTORY: Final = f"{MOUNT_PATH}/{PIPE}"
LOG_DIRECTORY: Final = f"{MOUNT_PATH}/{LOG}"
SHM: Final = "shm"  # and the shared memory, mounted at /dev/shm
SHM_PATH: Final = "/dev/shm"  # noqa: S108 (the container's, which MPS needs shared)
HOST_ROOT: Final = "/run/gpupack/mps"  # on the node: one directory per MPS capacity pod

ENV_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
ENV_LOG_DIRECTORY: Final = "CUDA_MPS_LOG_DIRECTORY"

DAEMON_COMMAND: Final = "gpupack-mps-daemon"  # the capacity pod's command in MPS pools
DAEMON_DRIVER_CAPABILITIES: Final = "compute,utility"  # the runtime mounts nvidia-cuda-mps-control


def volume() -> JSON:
    """The inline CSI volume every MPS party mounts (the driver decides what it holds)."""
    return {"name": VOLUME, "csi": {"driver": DRIVER}}


def volume_mounts() -> list[JSON]:
    """The GPU's MPS directory, and its shared memory at /dev/shm."""
    return [
        {"name": VOLUME, "mountPath": MOUNT_PATH},
        {"name": VOLUME, "mountPath": SHM_PATH, "subPath": SHM},
    ]


def environment() -> list[JSON]:
    """Where the CUDA runtime (and the daemon) find the pipes and write the logs."""
    return [
        {"name": ENV_PIPE_DIRECTORY, "value": PIPE_DIRECTORY},
        {"name": ENV_LOG_DIRECTORY, "value": LOG_DIRECTORY},
    ]


def is_mps_wiring(volume_or_mount: JSON) -> bool:
    """A volume or mount gpupack added for MPS (by name)."""
    return volume_or_mount.get("name") == VOLUME
