"""Which pods escaped gpupack, and how the watch keeps up with pods and namespaces."""

from typing import Any

import pytest

from gpupack import keys
from gpupack.gpu_request import escaped
from scheduler.escapes import Escapes, note

JSON = dict[str, Any]
ENABLED = {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED}
DISABLED = {keys.OPTIMIZE: keys.OPTIMIZE_DISABLED}


def namespace(name: str, labels: dict[str, str] | None = None) -> JSON:
    return {"metadata": {"name": name, "labels": labels or {}}}


def pod(
    name: str = "p",
    ns: str = "ml",
    *,
    gpus: object = "1",
    labels: dict[str, str] | None = None,
    scheduler: str | None = None,
    resource: str = keys.NVIDIA_GPU,
    init: bool = False,
) -> JSON:
    container = {"name": "c", "resources": {"limits": {resource: gpus}}}
    spec: JSON = {"initContainers" if init else "containers": [container]}
    if init:
        spec["containers"] = [{"name": "main"}]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels or {}}
    return {"metadata": meta, "spec": spec}


OPTED_IN = namespace("ml", ENABLED)


@pytest.mark.parametrize(
    ("subject", "ns", "expected"),
    [
        pytest.param(pod(), OPTED_IN, True, id="namespace-opted-in"),
        pytest.param(pod(labels=ENABLED), None, True, id="pod-opted-in"),
        pytest.param(pod(init=True), OPTED_IN, True, id="gpu-in-an-init-container"),
        pytest.param(pod(scheduler="default-scheduler"), OPTED_IN, True, id="default-named"),
        pytest.param(pod(), None, False, id="not-opted-in"),
        pytest.param(pod(labels=DISABLED), OPTED_IN, False, id="pod-opted-out"),
        pytest.param(pod(), namespace("ml", DISABLED), False, id="namespace-opted-out"),
        pytest.param(pod(labels={keys.OPTIMIZE: "yes"}), None, False, id="unusable-label"),
        pytest.param(pod(gpus="2"), OPTED_IN, False, id="two-gpus-stay-whole"),
        pytest.param(pod(gpus="x"), OPTED_IN, False, id="unreadable-count"),
        pytest.param(pod(gpus="0"), OPTED_IN, False, id="no-gpu"),
        pytest.param(pod(resource="nvidia.com/mig-1g.10gb"), OPTED_IN, False, id="mig"),
        pytest.param(pod(scheduler=keys.SCHEDULER_NAME), OPTED_IN, False, id="rewritten"),
        pytest.param(pod(scheduler="volcano"), OPTED_IN, False, id="another-scheduler"),
        pytest.param(pod(ns="kube-system", labels=ENABLED), None, False, id="excluded"),
    ],
)
def test_an_opted_in_one_gpu_pod_the_webhook_never_rewrote_escaped(
    subject: JSON, ns: JSON | None, expected: bool
) -> None:
    assert escaped(subject, ns, {"kube-system", "gpupack-system"}) is expected


def test_the_note_says_why_the_pod_holds_a_whole_gpu_and_what_to_do() -> None:
    text = note(pod(), OPTED_IN, "gpupack-system")
    assert "holds a whole GPU" in text
    assert "its namespace is labelled gpupack.io/optimize=enabled" in text
    assert "failurePolicy Ignore" in text
    assert "kubectl get endpoints -n gpupack-system" in text
    assert "the pod is labelled" in note(pod(labels=ENABLED), None, "gpupack-system")


class Store:
    def __init__(self, *objects: JSON) -> None:
        self.objects = {self.key(o): o for o in objects}

    @staticmethod
    def key(obj: JSON) -> str:
        meta = obj["metadata"]
        return f"{meta['namespace']}/{meta['name']}" if "namespace" in meta else meta["name"]

    def get(self, key: str) -> JSON | None:
        return self.objects.get(key)

    def items(self) -> list[JSON]:
        return list(self.objects.values())


def test_the_watch_follows_pods_and_namespace_labels_and_reports_each_pod_once() -> None:
    pods = Store(pod("a"), pod("b", gpus="2"), pod("c", ns="web"))
    namespaces = Store(OPTED_IN)
    watch = Escapes(pods, namespaces, {"kube-system"})

    watch.refresh()
    assert set(watch.pods) == {"ml/a"}
    assert [p["metadata"]["name"] for p in watch.unreported()] == ["a"]
    assert watch.unreported() == []  # one Event per pod

    namespaces.objects["web"] = namespace("web", ENABLED)  # a namespace opts in
    watch.namespace("web")
    watch.refresh()
    assert set(watch.pods) == {"ml/a", "web/c"}
    assert [p["metadata"]["name"] for p in watch.unreported()] == ["c"]

    del pods.objects["ml/a"]  # the escaped pod goes
    watch.pod("ml/a")
    pods.objects["ml/d"] = pod("d")
    watch.pod("ml/d")
    watch.refresh()
    assert set(watch.pods) == {"web/c", "ml/d"}
    assert [p["metadata"]["name"] for p in watch.unreported()] == ["d"]
