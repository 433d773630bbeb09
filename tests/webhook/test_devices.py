"""`POST /devices`: NVIDIA_VISIBLE_DEVICES=void on every container the kubelet gives no GPU,
so no image's ENV chooses GPUs (webhook.devices), applied as the API server applies it."""

import asyncio
import base64
import copy
from typing import Any

import httpx
import jsonpatch
import orjson
from prometheus_client import CollectorRegistry

from doubles.pods import review
from gpupack.objects import JSON
from webhook.app import create_app
from webhook.audit import AuditLog
from webhook.devices import device_env_patch, given_a_gpu, unguarded
from webhook.metrics import WebhookMetrics

VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def container(name: str, **extra: Any) -> JSON:
    return {"name": name, "image": "nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04", **extra}


def pod(*containers: JSON, init: tuple[JSON, ...] = (), ephemeral: tuple[JSON, ...] = ()) -> JSON:
    spec: JSON = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if ephemeral:
        spec["ephemeralContainers"] = list(ephemeral)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": spec,
    }


def applied(subject: JSON, old: JSON | None = None) -> JSON:
    result: JSON = jsonpatch.apply_patch(subject, device_env_patch(subject, old))
    return result


def env(subject: JSON, field: str, index: int) -> list[JSON] | None:
    return subject["spec"][field][index].get("env")  # type: ignore[no-any-return]


def test_a_container_given_no_gpu_gets_void_whatever_else_its_env_says() -> None:
    subject = pod(
        container("app"),
        container("sidecar", env=[{"name": "LOG", "value": "debug"}]),
        container("from-config", envFrom=[{"configMapRef": {"name": "gpus"}}]),
    )
    result = applied(subject)
    assert env(result, "containers", 0) == [VOID]
    assert env(result, "containers", 1) == [{"name": "LOG", "value": "debug"}, VOID]
    assert env(result, "containers", 2) == [VOID]  # env wins over envFrom
    assert result["spec"]["containers"][2]["envFrom"] == subject["spec"]["containers"][2]["envFrom"]


def test_containers_the_kubelet_gives_a_gpu_keep_what_their_device_plugin_sets() -> None:
    whole = container("whole", resources={"limits": {"nvidia.com/gpu": "1"}})
    mig = container("mig", resources={"requests": {"nvidia.com/mig-1g.10gb": "1"}})
    claimed = container("claimed", resources={"claims": [{"name": "gpu"}]})
    cpu = container("cpu", resources={"limits": {"cpu": "1", "example.com/fpga": "1"}})
    subject = pod(whole, mig, claimed, cpu)
    assert [given_a_gpu(c) for c in subject["spec"]["containers"]] == [True, True, True, False]
    result = applied(subject)
    assert [env(result, "containers", i) for i in range(3)] == [None, None, None]
    assert env(result, "containers", 3) == [VOID]


def test_a_container_that_names_its_devices_is_left_to_the_admission_policy() -> None:
    """`void`, `none` and gpupack's own downward-API value pass the policy; anything else
    is refused there, with a message: never silently overwritten here."""
    downward = {
        "name": "NVIDIA_VISIBLE_DEVICES",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpupack.io/gpu-uuid']"}},
    }
    subject = pod(
        container("share", env=[downward]),
        container("all", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
    )
    assert device_env_patch(subject) == []


def test_init_containers_are_guarded_and_only_added_ephemeral_containers() -> None:
    before = pod(container("app", env=[VOID]), ephemeral=(container("old-debugger"),))
    after = copy.deepcopy(before)
    after["spec"]["ephemeralContainers"].append(container("debugger"))
    after["spec"]["initContainers"] = [container("fetch")]
    result = applied(after, before)
    assert env(result, "initContainers", 0) == [VOID]
    assert env(result, "ephemeralContainers", 0) is None  # immutable once added
    assert env(result, "ephemeralContainers", 1) == [VOID]
    assert [c["name"] for _, _, c in unguarded(after)] == ["fetch", "old-debugger", "debugger"]


def test_nothing_to_guard_is_no_patch_and_hostile_shapes_are_skipped() -> None:
    assert (
        device_env_patch(pod(container("gpu", resources={"limits": {"nvidia.com/gpu": 1}}))) == []
    )
    odd: JSON = {"spec": {"containers": ["not-an-object", {"name": "x", "resources": "many"}]}}
    assert device_env_patch(odd) == [
        {"op": "add", "path": "/spec/containers/1/env", "value": [VOID]}
    ]
    assert device_env_patch({"spec": None}) == []
    assert device_env_patch({"spec": {"containers": "many"}}) == []


def test_the_route_answers_a_patch_counts_it_and_refuses_bad_input(tmp_path: Any) -> None:
    registry = CollectorRegistry()
    app = create_app(audit=AuditLog(tmp_path / "audit.log"), metrics=WebhookMetrics(registry))

    async def exchange(bodies: list[bytes]) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://webhook") as client:
            return [await client.post("/devices", content=body) for body in bodies]

    subject = pod(container("app"), container("gpu", resources={"limits": {"nvidia.com/gpu": 1}}))
    guarded = pod(container("app", env=[VOID]))
    update = review(pod(container("app", env=[VOID]), ephemeral=(container("debugger"),)))
    update["request"]["operation"] = "UPDATE"
    update["request"]["oldObject"] = pod(container("app", env=[VOID]))
    bodies = [orjson.dumps(review(subject)), orjson.dumps(review(guarded)), orjson.dumps(update)]
    answers = asyncio.run(exchange([*bodies, b'{"apiVersion": "admission.k8s.io/v1"}']))
    created, unchanged, added, bad = answers
    response = created.json()["response"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = orjson.loads(base64.b64decode(response["patch"]))
    assert jsonpatch.apply_patch(subject, patch)["spec"]["containers"][0]["env"] == [VOID]
    assert unchanged.json()["response"] == {"uid": "req-1", "allowed": True}
    patch = orjson.loads(base64.b64decode(added.json()["response"]["patch"]))
    assert patch == [{"op": "add", "path": "/spec/ephemeralContainers/0/env", "value": [VOID]}]
    assert bad.status_code == 400
    assert "AdmissionReview" in bad.json()["error"]

    def sample(name: str, labels: dict[str, str] | None = None) -> float | None:
        return registry.get_sample_value(name, labels or {})

    assert sample("gpupack_webhook_device_env_reviews_total", {"result": "guarded"}) == 2
    assert sample("gpupack_webhook_device_env_reviews_total", {"result": "unchanged"}) == 1
    assert sample("gpupack_webhook_device_env_containers_total") == 2
    assert sample("gpupack_webhook_errors_total", {"kind": "bad_request"}) == 1
