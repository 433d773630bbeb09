"""Run inside `unshare -rm` (a private user and mount namespace) by test_mps_volumes: the
MPS CSI driver's node side publishes and unpublishes with real mount(2) calls, and this
reports what each party's target path shows. Argument: a scratch directory."""

import errno
import json
import sys
from pathlib import Path
from typing import Any

import grpc

from gpupack import keys
from node.csi import PublishRequest, Refused, UnpublishRequest
from node.mps_volumes import MpsVolumes

NODE, NS = "gpu-1", "gpupack-system"


GPU = "GPU-0b1c2d3e-0000-4000-8000-000000000001"


def pods() -> dict[tuple[str, str], Any]:
    capacity: dict[str, Any] = {
        "metadata": {
            "name": "cap-0",
            "namespace": NS,
            "uid": "cap-uid",
            "labels": {keys.ROLE: keys.ROLE_CAPACITY, "gpupack.io/sharing": "mps"},
            "annotations": {keys.GPU_UUID: GPU},
        },
        "spec": {"nodeName": NODE},
    }
    client: dict[str, Any] = {
        "metadata": {
            "name": "llm-0",
            "namespace": "ml",
            "uid": "llm-uid",
            "annotations": {
                keys.ENFORCEMENT: "mps",
                keys.CAPACITY_POD: "cap-0",
                keys.GPU_UUID: GPU,
            },
        },
        "spec": {"nodeName": NODE},
    }
    intruder: dict[str, Any] = {
        "metadata": {"name": "intruder", "namespace": "ml", "uid": "x-uid"},
        "spec": {"nodeName": NODE},
    }
    return {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p for p in (capacity, client, intruder)
    }


def request(volume: str, target: Path, namespace: str, name: str, uid: str) -> PublishRequest:
    context = {
        "csi.storage.k8s.io/pod.namespace": namespace,
        "csi.storage.k8s.io/pod.name": name,
        "csi.storage.k8s.io/pod.uid": uid,
    }
    return PublishRequest(volume, str(target), False, context)


def mount_points(under: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return sorted(p for p in (line.split()[4] for line in lines) if p.startswith(str(under)))


def refusal(volumes: MpsVolumes, publish: PublishRequest) -> str:
    try:
        volumes.publish(publish)
    except Refused as error:
        return str(error.code.name)
    return "published"


def main(scratch: Path) -> None:
    by_name = pods()
    root, kubelet = scratch / "run-mps", scratch / "kubelet"
    volumes = MpsVolumes(
        root, node=NODE, namespace=NS, get_pod=lambda ns, n: by_name.get((ns, n)), shm_size="4Mi"
    )
    seen: dict[str, Any] = {}
    daemon_target = kubelet / "cap-uid" / "mount"
    client_target = kubelet / "llm-uid" / "mount"
    client = request("csi-client", client_target, "ml", "llm-0", "llm-uid")
    seen["client_before_daemon"] = refusal(volumes, client)

    volumes.publish(request("csi-daemon", daemon_target, NS, "cap-0", "cap-uid"))
    fs_types = {
        line.split()[4]: line.split(" - ")[1].split()[0]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    }
    seen["daemon_shm_type"] = fs_types.get(str(daemon_target / "shm"))
    (daemon_target / "pipe" / "control").write_text("control socket of the daemon")

    volumes.publish(client)
    volumes.publish(client)  # the kubelet may call again
    seen["republish_is_idempotent"] = sorted(mount_points(client_target)) == sorted([
        str(client_target),
        str(client_target / "shm"),
        str(client_target / "pipe"),
        str(client_target / "log"),
    ])  # fmt: skip
    seen["client_sees_daemon_pipe"] = (client_target / "pipe" / "control").read_text()
    for part in ("pipe", "log"):
        try:
            (client_target / part / "planted").write_text("a client's file")
            seen[f"client_writes_{part}"] = "written"
        except OSError as error:
            seen[f"client_writes_{part}"] = errno.errorcode.get(error.errno or 0, str(error))
    (client_target / "shm" / "segment").write_text("written by the client")
    seen["daemon_sees_client_shm"] = (daemon_target / "shm" / "segment").read_text()
    seen["intruder"] = refusal(
        volumes, request("csi-x", kubelet / "x-uid" / "mount", "ml", "intruder", "x-uid")
    )

    volumes.unpublish(UnpublishRequest("csi-client", str(client_target)))
    seen["client_target_after_unpublish"] = "there" if client_target.exists() else "gone"
    volumes.unpublish(UnpublishRequest("csi-daemon", str(daemon_target)))
    volumes.unpublish(UnpublishRequest("csi-daemon", str(daemon_target)))  # idempotent
    seen["daemon_directory_after_unpublish"] = "there" if (root / "cap-uid").exists() else "gone"
    seen["mounts_left"] = mount_points(scratch)
    print(json.dumps(seen))


if __name__ == "__main__":
    assert grpc  # the driver's status codes travel as grpc.StatusCode
    main(Path(sys.argv[1]))
