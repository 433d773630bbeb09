"""Kubernetes objects as placement values: what the ledger is rebuilt from."""

from typing import Any

import pytest

from gpupack import keys
from gpupack.shares import pool_of
from scheduler.ledger import Node, Request
from scheduler.translate import (
    NotOurs,
    assignment_of,
    capacity_gpu,
    host_requests,
    node_of,
    request_of,
)

GiB = 2**30
UUID = "GPU-6f1c2b9e-0000-4000-8000-000000000001"


def node_json(**status: object) -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {
            "name": "n1",
            "labels": {keys.GFD_MEMORY_MIB: "81920", keys.GFD_PRODUCT: "A100"},
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
            **status,
        },
    }


def test_a_node_becomes_a_placement_node() -> None:
    node = node_of(node_json())

    assert (node.name, node.cpu, node.memory, node.max_pods) == ("n1", 96_000, 1024 * GiB, 110)
    assert node.ready
    assert node.schedulable


def test_a_node_that_is_not_ready_or_cordoned_says_so() -> None:
    obj = node_json(conditions=[{"type": "Ready", "status": "Unknown"}])
    obj["spec"]["unschedulable"] = True

    node = node_of(obj)

    assert not node.ready
    assert not node.schedulable


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {"containers": [{"resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}}] * 2},
            (200, 2 * GiB),
            id="sum-of-containers",
        ),
        pytest.param(
            {
                "containers": [{"resources": {"requests": {"cpu": "100m"}}}],
                "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "64Mi"}}}],
            },
            (2000, 64 * 2**20),
            id="init-container-larger",
        ),
        pytest.param(
            {"containers": [{}], "overhead": {"cpu": "250m", "memory": "120Mi"}},
            (250, 120 * 2**20),
            id="overhead",
        ),
        pytest.param(
            {"containers": [{"resources": {"requests": {"cpu": "0.0005"}}}]}, (1, 0), id="rounds-up"
        ),
    ],
)
def test_host_requests_follow_kube_scheduler(spec: dict, expected: tuple[int, int]) -> None:  # type: ignore[type-arg]
    assert host_requests(spec) == expected


def fractional(annotations: dict[str, str], **spec: object) -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
        "spec": {
            "schedulerName": keys.SCHEDULER_NAME,
            "containers": [{"resources": {"requests": {"cpu": "1"}}}],
            **spec,
        },
    }


def test_an_admitted_pod_becomes_a_request_of_its_pool_and_workload() -> None:
    pod = fractional(
        {keys.DECISION: "uid-1", keys.GPU_COMPUTE: "300m", keys.GPU_MEMORY: "8Gi"},
        nodeSelector={"a": "b"},
    )

    request = request_of(pod)

    assert isinstance(request, Request)
    assert (request.key, request.cpu, request.compute, request.gpu_memory) == (
        "ml/p",
        1000,
        300,
        8 * GiB,
    )
    assert request.owner == "ml/Pod/p"
    assert request.pool
    assert not request.exclusive


def test_an_mps_pod_asks_for_a_gpu_of_its_own_pool_the_pool_the_webhook_planned() -> None:
    shares = {keys.DECISION: "uid-1", keys.GPU_COMPUTE: "300m", keys.GPU_MEMORY: "8Gi"}
    plain = request_of(fractional(shares, nodeSelector={"a": "b"}))
    pod = fractional({**shares, keys.ENFORCEMENT: "mps"}, nodeSelector={"a": "b"})
    mps = request_of(pod)

    assert isinstance(plain, Request)
    assert isinstance(mps, Request)
    assert mps.exclusive
    assert mps.pool != plain.pool  # so no other pod ever lands on an MPS GPU
    assert mps.pool == pool_of(pod)  # the webhook's informer indexes it by the same key


def test_a_pod_without_a_decision_is_not_placed_whatever_it_claims() -> None:
    result = request_of(fractional({keys.GPU_COMPUTE: "100m", keys.GPU_UUID: UUID}))

    assert isinstance(result, NotOurs)
    assert result.reason == "NotAdmitted"
    assert keys.DECISION in result.message


def test_an_unreadable_share_is_reported_not_crashed_on() -> None:
    result = request_of(fractional({keys.DECISION: "uid-1", keys.GPU_COMPUTE: "lots"}))

    assert isinstance(result, NotOurs)
    assert result.reason == "InvalidShare"


def capacity(phase: str, annotations: dict[str, str], node: str | None = "n1") -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {
            "name": "gpupack-capacity-abc-0",
            "namespace": keys.SYSTEM_NAMESPACE,
            "labels": {keys.ROLE: keys.ROLE_CAPACITY, keys.POOL: "abc"},
            "annotations": annotations,
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def test_a_running_capacity_pod_with_a_uuid_is_a_gpu_with_the_nodes_memory() -> None:
    gpu = capacity_gpu(capacity("Running", {keys.GPU_UUID: UUID}), node_of(node_json()))

    assert gpu is not None
    assert (gpu.uuid, gpu.pool, gpu.memory, gpu.model, gpu.coming) == (
        UUID,
        "abc",
        80 * GiB,
        "A100",
        False,
    )


def test_the_exporters_memory_wins_over_the_node_label() -> None:
    gpu = capacity_gpu(
        capacity("Running", {keys.GPU_UUID: UUID, keys.GPU_MEMORY: "40Gi"}), node_of(node_json())
    )

    assert gpu is not None
    assert gpu.memory == 40 * GiB


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(capacity("Pending", {}), id="pending"),
        pytest.param(capacity("Running", {}), id="running-without-uuid"),
    ],
)
def test_a_capacity_pod_without_its_gpu_yet_is_coming(pod: dict) -> None:  # type: ignore[type-arg]
    gpu = capacity_gpu(pod, Node("n1", 1000, GiB))

    assert gpu is not None
    assert gpu.coming


def test_an_unplaced_capacity_pod_is_not_on_any_node() -> None:
    assert capacity_gpu(capacity("Pending", {}, node=None), None) is None


def test_the_assignment_is_read_only_when_complete_and_well_formed() -> None:
    assert assignment_of(
        {"metadata": {"annotations": {keys.GPU_UUID: UUID, keys.CAPACITY_POD: "c"}}}
    ) == (UUID, "c")
    assert assignment_of({"metadata": {"annotations": {keys.GPU_UUID: UUID}}}) is None
    assert (
        assignment_of(
            {"metadata": {"annotations": {keys.GPU_UUID: "x; rm -rf", keys.CAPACITY_POD: "c"}}}
        )
        is None
    )


@pytest.mark.parametrize(
    ("spec", "cpu"),
    [
        pytest.param({"containers": [{"r": 100}, {"r": 200}]}, 300, id="containers-add-up"),
        pytest.param(
            {"containers": [{"r": 100}], "initContainers": [{"r": 500}]}, 500, id="init-peak"
        ),
        pytest.param(
            {"containers": [{"r": 100}], "initContainers": [{"r": 50, "always": True}]},
            150,
            id="native-sidecar-runs-beside-the-containers",
        ),
        pytest.param(
            {
                "containers": [{"r": 100}],
                "initContainers": [{"r": 200, "always": True}, {"r": 400}],
            },
            600,
            id="init-after-a-sidecar-runs-beside-it",
        ),
        pytest.param(
            {"containers": [{"r": 100}], "resources": {"requests": {"cpu": "2"}}},
            2000,
            id="pod-level-requests-win",
        ),
        pytest.param(
            {"containers": [{"r": 100}], "overhead": {"cpu": "250m"}}, 350, id="overhead-adds"
        ),
    ],
)
def test_host_requests_are_counted_as_kube_scheduler_counts_them(
    spec: dict[str, Any], cpu: int
) -> None:
    def container(c: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"resources": {"requests": {"cpu": f"{c['r']}m"}}}
        if c.get("always"):
            out["restartPolicy"] = "Always"
        return out

    built = dict(spec)
    for field in ("containers", "initContainers"):
        if field in spec:
            built[field] = [container(c) for c in spec[field]]

    assert host_requests(built)[0] == cpu


def test_a_capacity_pod_the_exporter_marks_unhealthy_is_an_unhealthy_gpu() -> None:
    pod = {
        "metadata": {
            "name": "cap",
            "namespace": keys.SYSTEM_NAMESPACE,
            "labels": {keys.ROLE: keys.ROLE_CAPACITY},
            "annotations": {keys.GPU_UUID: UUID, keys.GPU_UNHEALTHY: "critical XID 79"},
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }

    gpu = capacity_gpu(pod, node_of(node_json()))

    assert gpu is not None
    assert not gpu.healthy
    assert not gpu.coming
