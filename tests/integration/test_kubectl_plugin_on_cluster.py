"""`kubectl gpupack` through the real kubectl (which finds `kubectl-gpupack` on PATH, as
after `pip install gpupack`), against a real API server with the scheduler placing pods."""

import json
from typing import Any

import pytest

from hack.demo import kubectl_gpupack
from hack.localcluster import Kube, LocalCluster
from tests.integration.scheduling import create, wait_bound
from tests.integration.workloads import deployment, gpu_pod

pytestmark = pytest.mark.integration


def test_status_and_what_if_through_kubectl(
    kube: Kube, scheduler: LocalCluster, opted_in_namespace: str, plain_namespace: str
) -> None:
    ns, plain = opted_in_namespace, plain_namespace
    create(kube, deployment(ns, "shares", 3, "300m", memory="10Gi"))
    pods = wait_bound(kube, ns, "shares", 3)
    for name, gpus in (("one-a", "1"), ("one-b", "1"), ("two", "2")):
        kube.create(f"/api/v1/namespaces/{plain}/pods", gpu_pod(name, gpus))

    result = kubectl_gpupack(scheduler, "status", "-n", ns, "-o", "json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["namespaces"][ns]["pods"] == 3
    assert status["namespaces"][ns]["gpusAskedFor"] == 3
    assert status["namespaces"][ns]["compute"] == "900m"
    assert status["gpusHeld"] >= 1
    assert status["gpusSaved"] is None  # held GPUs serve every namespace
    line = kubectl_gpupack(scheduler, "status", "-n", ns).stdout.splitlines()[0]
    assert line.startswith(f"{ns}: 3 whole GPUs asked for, shared on ")
    assert "GPUs saved" in kubectl_gpupack(scheduler, "status").stdout

    def bound_what_if() -> dict[str, Any] | None:
        result = kubectl_gpupack(scheduler, "what-if", "-n", plain, "-o", "json")
        assert result.returncode == 0, result.stderr
        report: dict[str, Any] = json.loads(result.stdout)
        return report if report["gpuNodesToday"] > 0 else None

    report = kube.wait_for("the whole-GPU pods to be bound", bound_what_if, timeout=30)
    assert report["gpusToday"] == 4
    assert report["gpusNeeded"] < report["gpusToday"]
    assert [w["pod"] for w in report["stayWhole"]] == [f"{plain}/two"]
    table = kubectl_gpupack(scheduler, "what-if", "-n", plain).stdout
    assert "GPU pods today hold 4 GPUs on" in table
    assert f"Under gpupack they would need {report['gpusNeeded']} GPU" in table

    name = pods[0]["metadata"]["name"]
    pending = kubectl_gpupack(scheduler, "why-pending", name, "-n", ns)
    assert pending.returncode == 0, pending.stderr
    assert "is not pending: bound to" in pending.stdout
    missing = kubectl_gpupack(scheduler, "why-pending", "nope", "-n", ns)
    assert missing.returncode == 1
    assert "not found" in missing.stderr
