"""Whose MPS directory a pod may mount (`decide`, pure), and the mounts themselves, done
for real in a private mount namespace (`unshare`) with the pods of a small cluster."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupack import keys
from node.mps_volumes import Client, Daemon, Refusal, decide, shm_bytes

NODE, NS = "gpu-1", "gpupack-system"
GPU = "GPU-0c1d2e3f-aaaa-bbbb-cccc-000000000001"


def capacity(name: str = "gpupack-capacity-p-0", uid: str = "cap-uid", **over: Any) -> Any:
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "labels": {keys.ROLE: keys.ROLE_CAPACITY, "gpupack.io/sharing": "mps"},
            "annotations": {keys.GPU_UUID: GPU},
        },
        "spec": {"nodeName": NODE},
    }
    pod["metadata"].update(over.pop("metadata", {}))
    pod["spec"].update(over)
    return pod


def client(uid: str = "pod-uid", **annotations: str) -> Any:
    return {
        "metadata": {
            "name": "llm-0",
            "namespace": "ml",
            "uid": uid,
            "annotations": {
                keys.ENFORCEMENT: "mps",
                keys.CAPACITY_POD: "gpupack-capacity-p-0",
                keys.GPU_UUID: GPU,
                **annotations,
            },
        },
        "spec": {"nodeName": NODE},
    }


def getter(*pods: Any) -> Any:
    by_name = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    return lambda namespace, name: by_name.get((namespace, name))


def decision(pod: Any, *others: Any, uid: str | None = None) -> Any:
    uid = pod["metadata"]["uid"] if uid is None else uid
    return decide(pod, uid, node=NODE, namespace=NS, get_pod=getter(pod, *others))


def test_an_mps_capacity_pod_gets_a_directory_of_its_own() -> None:
    assert decision(capacity()) == Daemon("cap-uid")


def test_a_pod_placed_on_an_mps_gpu_gets_its_capacity_pods_directory() -> None:
    assert decision(client(), capacity()) == Client("cap-uid", "gpupack-capacity-p-0")


@pytest.mark.parametrize(
    ("pod", "others", "reason"),
    [
        pytest.param(client(), [capacity()], "not the one the kubelet", id="another-uid"),
        pytest.param(
            capacity(metadata={"labels": {keys.ROLE: keys.ROLE_CAPACITY}}),
            [],
            "not of an MPS pool",
            id="capacity-pod-of-a-shared-pool",
        ),
        pytest.param(
            client(**{keys.ENFORCEMENT: "accounting"}),
            [capacity()],
            "not a real-time-mps pod admitted by gpupack",
            id="not-an-mps-pod",
        ),
        pytest.param(
            client(**{keys.CAPACITY_POD: ""}), [capacity()], "no GPU assigned", id="unplaced"
        ),
        pytest.param(client(), [], "is gone", id="capacity-pod-gone"),
        pytest.param(
            client(),
            [capacity(metadata={"deletionTimestamp": "2026-11-24T10:00:00Z"})],
            "is gone",
            id="capacity-pod-deleting",
        ),
        pytest.param(
            client(),
            [capacity(nodeName="gpu-2")],
            "not on node gpu-1",
            id="capacity-pod-elsewhere",
        ),
        pytest.param(
            client(**{keys.GPU_UUID: "GPU-other"}),
            [capacity()],
            "is assigned GPU GPU-other",
            id="another-gpu",
        ),
        pytest.param(
            client(**{keys.GPU_UUID: ""}), [capacity()], "names no GPU", id="no-gpu-of-its-own"
        ),
        pytest.param(
            client(),
            [capacity(metadata={"annotations": {}})],
            "its capacity pod gpupack-capacity-p-0 names no GPU",
            id="capacity-names-no-gpu",
        ),
    ],
)
def test_every_other_pod_is_refused_with_a_reason(pod: Any, others: list[Any], reason: str) -> None:
    uid = "someone-else" if reason.startswith("not the one") else None
    refused = decision(pod, *others, uid=uid)
    assert isinstance(refused, Refusal)
    assert reason in refused.reason


def test_a_pod_on_another_node_is_refused() -> None:
    pod = client()
    pod["spec"]["nodeName"] = "gpu-2"
    refused = decision(pod, capacity())
    assert isinstance(refused, Refusal)
    assert "not bound to node gpu-1" in refused.reason


def test_a_user_pod_in_gpupacks_namespace_without_the_capacity_role_is_a_client() -> None:
    pod = capacity(metadata={"labels": {}, "annotations": {}})
    refused = decision(pod)
    assert isinstance(refused, Refusal)
    assert "not a real-time-mps pod" in refused.reason


@pytest.mark.parametrize(
    ("quantity", "size"),
    [("256Mi", 256 * 2**20), ("1Gi", 2**30), ("65536Ki", 64 * 2**20), ("4096", 4096)],
)
def test_sizes_are_read_as_kubernetes_writes_them(quantity: str, size: int) -> None:
    assert shm_bytes(quantity) == size


@pytest.mark.parametrize("quantity", ["", "0", "-1Mi", "1GB", "Mi"])
def test_a_bad_size_names_the_accepted_form(quantity: str) -> None:
    with pytest.raises(ValueError, match=r"--shm-size: invalid value .*; accepted: "):
        shm_bytes(quantity)


# --- the mounts, for real ---------------------------------------------------------------

SCENARIO = Path(__file__).with_name("mps_mount_scenario.py")


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    probe = subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True, text=True, check=False, timeout=30
    )
    if probe.returncode != 0:
        return f"cannot create a private mount namespace: {probe.stderr.strip()}"
    return None


def test_a_daemon_and_its_clients_share_pipes_and_shared_memory_and_nothing_is_left(
    tmp_path: Path,
) -> None:
    reason = _can_unshare()
    if reason is not None:
        pytest.skip(reason)
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, str(SCENARIO), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["client_before_daemon"] == "UNAVAILABLE"
    assert seen["daemon_shm_type"] == "tmpfs"
    assert seen["client_sees_daemon_pipe"] == "control socket of the daemon"
    assert seen["client_writes_pipe"] == "EROFS"
    assert seen["client_writes_log"] == "EROFS"
    assert seen["daemon_sees_client_shm"] == "written by the client"
    assert seen["republish_is_idempotent"] is True
    assert seen["intruder"] == "FAILED_PRECONDITION"
    assert seen["client_target_after_unpublish"] == "gone"
    assert seen["daemon_directory_after_unpublish"] == "gone"
    assert seen["mounts_left"] == []
