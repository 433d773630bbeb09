"""Capacity-pod GPU discovery: kubelet's device IDs and NVML's devices in, patches out;
and the pod map it reads (pod JSON -> PodInfo)."""

from typing import Any

import pytest

from exporter.discovery import Patch, device_uuid, plan
from exporter.pods import PodInfo, container_id, pod_info
from exporter.readings import Device
from gpupack import keys

GPU0 = "GPU-11111111-2222-4333-8444-555555555555"
GPU1 = "GPU-11111111-2222-4333-8444-666666666666"
MIG = "MIG-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
GIB = 1 << 30
DEVICES = [
    Device(0, GPU0, "NVIDIA A100-SXM4-80GB", 80 * GIB),
    Device(1, GPU1, "NVIDIA A100-SXM4-80GB", 80 * GIB),
]


def capacity_pod(
    name: str, *, uid: str = "", phase: str = "Running", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "gpupack-system",
            "uid": uid or f"uid-{name}",
            "resourceVersion": "3",
            "labels": {"gpupack.io/role": "capacity", "gpupack.io/pool": "p1"},
            "annotations": annotations or {},
        },
        "spec": {"nodeName": "gpu-1"},
        "status": {"phase": phase},
    }


def infos(*pods: dict[str, Any]) -> list[PodInfo]:
    return [pod_info(p) for p in pods]


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        pytest.param(GPU1, GPU1, id="uuid-strategy"),
        pytest.param("1", GPU1, id="index-strategy"),
        pytest.param(MIG, MIG, id="mig-single-strategy"),
        pytest.param("7", None, id="index-nvml-does-not-list"),
        pytest.param("gpu-one", None, id="neither"),
    ],
)
def test_device_ids_name_a_gpu_by_uuid_or_index(device_id: str, expected: str | None) -> None:
    assert device_uuid(device_id, {d.uuid: d for d in DEVICES}) == expected


def test_a_running_capacity_pod_gets_its_gpu_and_memory() -> None:
    result = plan(infos(capacity_pod("cap-a")), {("gpupack-system", "cap-a"): [GPU1]}, DEVICES)
    assert result.patches == (
        Patch(
            "gpupack-system",
            "cap-a",
            "3",
            {"gpupack.io/gpu-uuid": GPU1, "gpupack.io/gpu-memory": "80Gi"},
        ),
    )
    assert result.problems == ()


def test_annotations_already_right_are_not_rewritten() -> None:
    done = capacity_pod(
        "cap-a", annotations={"gpupack.io/gpu-uuid": GPU1, "gpupack.io/gpu-memory": "80Gi"}
    )
    assert plan(infos(done), {("gpupack-system", "cap-a"): [GPU1]}, DEVICES).patches == ()


def test_kubelet_is_the_truth_when_the_annotation_disagrees() -> None:
    wrong = capacity_pod("cap-a", annotations={"gpupack.io/gpu-uuid": GPU0})
    (patch,) = plan(infos(wrong), {("gpupack-system", "cap-a"): ["1"]}, DEVICES).patches
    assert patch.annotations["gpupack.io/gpu-uuid"] == GPU1


def test_without_nvml_the_uuid_is_written_and_memory_follows_later() -> None:
    pod = capacity_pod("cap-a")
    (first,) = plan(infos(pod), {("gpupack-system", "cap-a"): [GPU0]}, []).patches
    assert dict(first.annotations) == {"gpupack.io/gpu-uuid": GPU0}
    pod["metadata"]["annotations"] = dict(first.annotations)
    (second,) = plan(infos(pod), {("gpupack-system", "cap-a"): [GPU0]}, DEVICES).patches
    assert second.annotations["gpupack.io/gpu-memory"] == "80Gi"


@pytest.mark.parametrize(
    ("allocated", "problem"),
    [
        pytest.param({}, "kubelet lists no nvidia.com/gpu device", id="not-listed"),
        pytest.param({("gpupack-system", "cap-a"): [GPU0, GPU1]}, "2 nvidia.com/gpu", id="two"),
        pytest.param({("gpupack-system", "cap-a"): ["x"]}, "device ID 'x'", id="unknown-id"),
        pytest.param(
            {("gpupack-system", "cap-a"): ["GPU-99999999-2222-4333-8444-555555555555"]},
            "which NVML on this node does not list",
            id="a-gpu-of-another-node",
        ),
    ],
)
def test_what_cannot_be_annotated_is_a_problem_naming_the_pod(
    allocated: dict[tuple[str, str], list[str]], problem: str
) -> None:
    result = plan(infos(capacity_pod("cap-a")), allocated, DEVICES)
    assert result.patches == ()
    (line,) = result.problems
    assert "gpupack-system/cap-a" in line
    assert problem in line


def test_only_running_capacity_pods_in_gpupacks_namespace_are_annotated() -> None:
    pending = capacity_pod("cap-p", phase="Pending")
    impostor = capacity_pod("cap-x")
    impostor["metadata"]["namespace"] = "team-a"  # the label alone conjures nothing
    allocated = {("gpupack-system", "cap-p"): [GPU0], ("team-a", "cap-x"): [GPU1]}
    assert plan(infos(pending, impostor), allocated, DEVICES) == plan([], {}, DEVICES)


def test_pod_info_reads_containers_allocation_and_assignment() -> None:
    pod = {
        "metadata": {
            "name": "trainer-0",
            "namespace": "ml",
            "uid": "u1",
            "resourceVersion": "7",
            "annotations": {
                "gpupack.io/gpu-compute": "300m",
                "gpupack.io/gpu-memory": "12Gi",
                "gpupack.io/gpu-uuid": GPU0,
                "gpupack.io/decision": "d-1",
            },
        },
        "spec": {"schedulerName": "gpupack-scheduler", "containers": [{"name": "main"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "main", "containerID": "containerd://" + "a" * 64},
                {"name": "side", "containerID": "cri-o://" + "b" * 64},
                {"name": "waiting"},
            ],
            "initContainerStatuses": [{"name": "init", "containerID": "docker://" + "c" * 64}],
        },
    }
    info = pod_info(pod)
    assert dict(info.containers) == {"a" * 64: "main", "b" * 64: "side", "c" * 64: "init"}
    assert (info.managed, info.compute, info.memory, info.gpu_uuid) == (True, 300, 12 * GIB, GPU0)
    assert not info.capacity


def test_a_pod_with_a_bad_share_annotation_is_known_but_not_managed() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "uid": "u2",
            "annotations": {"gpupack.io/gpu-compute": "lots"},
        },
        "status": {"phase": "Running"},
    }
    info = pod_info(pod)
    assert (info.name, info.managed, info.compute) == ("p", False, None)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("containerd://abc", "abc", id="containerd"),
        pytest.param("cri-o://abc", "abc", id="cri-o"),
        pytest.param("docker://abc", "abc", id="docker"),
        pytest.param("abc", "abc", id="bare"),
    ],
)
def test_container_ids_lose_their_runtime_prefix(raw: str, expected: str) -> None:
    assert container_id(raw) == expected


def test_an_unhealthy_gpu_is_named_on_its_capacity_pod_and_cleared_once_healthy() -> None:
    allocated = {("gpupack-system", "cap-a"): [GPU1]}
    (sick,) = plan(
        infos(capacity_pod("cap-a")), allocated, DEVICES, {GPU1: "critical XID 79"}
    ).patches
    assert sick.annotations[keys.GPU_UNHEALTHY] == "critical XID 79"

    written = {k: v for k, v in sick.annotations.items() if v is not None}
    marked = capacity_pod("cap-a", annotations=written)
    assert plan(infos(marked), allocated, DEVICES, {GPU1: "critical XID 79"}).patches == ()
    (healed,) = plan(infos(marked), allocated, DEVICES, {}).patches
    assert healed.annotations[keys.GPU_UNHEALTHY] is None  # a merge patch removes it
