"""The recommender's loop against in-memory caches and a recording API: samples are
charged to workloads, recommendations are written when they change and checkpointed
while history grows, a new leader restores the history, GPUPolicy objects get a status,
and updateMode Auto restarts a drifted Deployment only after publishing its target."""

import copy
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from gpupack import keys
from gpupack.policy import BUILTIN, policy_spec
from gpupack.runtime.api import ApiError
from gpupack.runtime.transport import JSON_PATCH
from recommender.controller import Recommender, Settings
from recommender.usage import Collected, PodUsage

JSON = dict[str, Any]
GiB = 1 << 30
NS = "ml"
REC_PATH = "/apis/gpupack.io/v1alpha1/namespaces/ml/gpurecommendations"


class Store:
    def __init__(self, objects: Sequence[JSON] = ()) -> None:
        self.objects = {self.key(o): o for o in objects}

    @staticmethod
    def key(obj: JSON) -> str:
        meta = obj["metadata"]
        return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]

    def get(self, key: str) -> JSON | None:
        return self.objects.get(key)

    def items(self) -> list[JSON]:
        return list(self.objects.values())

    def put(self, obj: JSON) -> None:
        self.objects[self.key(obj)] = obj


class Api:
    """Records writes; stores GPURecommendations so patch-after-create works."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.stored: dict[str, JSON] = {}
        self.fail_patch: dict[str, ApiError] = {}

    def create(self, path: str, body: JSON) -> JSON:
        self.calls.append(("create", path, body))
        self.stored[f"{path}/{body['metadata']['name']}"] = body
        return body

    def patch(self, path: str, body: Any, content_type: str = "") -> JSON:
        self.calls.append(("patch", path, body))
        for prefix, error in self.fail_patch.items():
            if path.startswith(prefix):
                raise error
        if content_type == JSON_PATCH:
            if path not in self.stored:
                raise ApiError(404, "NotFound", path)
            obj = self.stored[path]
            for op in body:
                obj[op["path"].strip("/")] = op["value"]
            return obj
        return {}

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        self.calls.append(("delete", path, None))
        self.stored.pop(path, None)
        return {}

    def of(self, verb: str, prefix: str = "") -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if c[0] == verb and c[1].startswith(prefix)]


class Source:
    def __init__(self) -> None:
        self.usage: list[PodUsage] = []
        self.errors: tuple[str, ...] = ()

    def collect(self) -> Collected:
        return Collected(tuple(self.usage), self.errors, 1)

    def describe(self) -> str:
        return "a test source"

    def close(self) -> None:
        pass


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def pod(
    name: str,
    *,
    owner: tuple[str, str] = ("ReplicaSet", "web-5d8f9"),
    policy: str = "near-real-time",
    compute: str = "400m",
    memory: str = "8Gi",
    phase: str = "Running",
) -> JSON:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"pod-template-hash": "5d8f9"},
            "ownerReferences": [{"kind": owner[0], "name": owner[1], "controller": True}],
            "annotations": {
                keys.DECISION: f"uid-{name}",
                keys.POLICY: policy,
                keys.GPU_COMPUTE: compute,
                keys.GPU_MEMORY: memory,
            },
        },
        "spec": {"schedulerName": keys.SCHEDULER_NAME},
        "status": {"phase": phase},
    }


def gpupolicy(name: str, **spec: Any) -> JSON:
    base = policy_spec(BUILTIN["batch"])
    return {
        "metadata": {"name": name, "namespace": "gpupack-system", "generation": 3},
        "spec": {**base, **spec},
    }


class Rig:
    def __init__(self, pods: Sequence[JSON] = (), policies: Sequence[JSON] = ()) -> None:
        self.pods = Store(pods)
        self.policies = Store(policies)
        self.recommendations = Store()
        self.api = Api()
        self.source = Source()
        self.clock = Clock()
        self.settings = Settings(interval=60, checkpoint_interval=300, rollout_cooldown=3600)

    def recommender(self) -> Recommender:
        return Recommender(
            self.api,
            self.pods,
            self.policies,
            self.recommendations,
            self.source,
            self.settings,
            clock=self.clock,
        )

    def feed(self, compute: float, memory: int, *names: str) -> None:
        self.source.usage = [PodUsage(NS, n, compute, memory) for n in names]

    def stored(self, name: str = "deployment-web") -> JSON:
        return self.api.stored[f"{REC_PATH}/{name}"]


def test_samples_are_charged_to_the_deployment_behind_the_replicaset() -> None:
    rig = Rig([pod("web-a"), pod("web-b")])
    rig.feed(0.2, 2 * GiB, "web-a", "web-b", "stranger")
    result = rig.recommender().tick()
    assert (result.samples, result.unmatched) == (2, 1)
    obj = rig.stored()
    assert obj["spec"] == {"targetRef": {"kind": "Deployment", "name": "web"}}
    assert obj["status"]["samples"] == 2
    assert obj["status"]["policy"] == "near-real-time"
    assert obj["status"]["running"] == {"pods": 2, "compute": "400m", "memory": "8Gi"}
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpupack-recommender"}


def test_an_unchanged_recommendation_is_checkpointed_only_every_checkpoint_interval() -> None:
    rig = Rig([pod("web-a")])
    recommender = rig.recommender()
    rig.feed(0.2, 2 * GiB, "web-a")
    recommender.tick()  # first write: create
    assert len(rig.api.of("create", REC_PATH)) == 1
    writes = len(rig.api.of("patch", REC_PATH))
    for _ in range(3):  # the target does not move within minutes: nothing is due
        rig.clock.now += 60
        recommender.tick()
    assert len(rig.api.of("patch", REC_PATH)) == writes
    rig.clock.now += 300
    recommender.tick()  # a checkpoint is due
    assert len(rig.api.of("patch", REC_PATH)) == writes + 1
    assert rig.stored()["status"]["samples"] == 5


def test_a_new_leader_restores_the_history_and_keeps_counting() -> None:
    rig = Rig([pod("web-a")])
    first = rig.recommender()
    rig.feed(0.25, 2 * GiB, "web-a")
    for _ in range(4):
        first.tick()
        rig.clock.now += 60
    assert first.flush() == 1  # the samples since the last checkpoint
    saved = copy.deepcopy(rig.stored())
    assert saved["status"]["samples"] == 4
    assert first.flush() == 0  # nothing new since
    rig.recommendations.put(saved)
    second = rig.recommender()
    assert second.load() == 1
    second.tick()
    second.flush()
    status = rig.stored()["status"]
    assert status["firstSample"] == saved["status"]["firstSample"]
    assert status["samples"] > saved["status"]["samples"]


def test_a_checkpoint_that_does_not_parse_starts_that_workload_afresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = Rig([pod("web-a")])
    rig.recommendations.put(
        {
            "metadata": {
                "name": "deployment-web",
                "namespace": NS,
                "labels": {"app.kubernetes.io/managed-by": "gpupack-recommender"},
            },
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}},
            "status": {"history": {"version": 99}},
        }
    )
    with caplog.at_level(logging.WARNING):
        assert rig.recommender().load() == 0
    assert "starting it afresh" in caplog.text


def test_gpupolicy_objects_get_a_status_once_and_invalid_ones_say_why() -> None:
    good = gpupolicy("batch")
    bad = gpupolicy("custom", minCompute="2")
    rig = Rig(policies=[good, bad])
    recommender = rig.recommender()
    recommender.tick()
    statuses = {p.split("/")[-2]: body["status"] for _, p, body in rig.api.of("patch", "/apis")}
    assert statuses["batch"] == {"valid": "True", "message": "in force", "observedGeneration": 3}
    assert statuses["custom"]["valid"] == "False"
    assert "spec.minCompute" in statuses["custom"]["message"]
    assert "auto-detected" in statuses["custom"]["message"]
    good["status"], bad["status"] = statuses["batch"], statuses["custom"]
    before = len(rig.api.calls)
    recommender.tick()
    assert len(rig.api.calls) == before  # nothing changed: nothing written


def test_auto_restarts_a_drifted_deployment_after_publishing_and_then_waits() -> None:
    auto = gpupolicy("auto", updateMode="Auto", historyWindowSeconds=60)
    rig = Rig([pod("web-a", policy="auto", memory="4Gi")], policies=[auto])
    recommender = rig.recommender()
    rig.feed(0.2, int(3.8 * GiB), "web-a")  # 95 % of 4Gi: raise memory at once
    recommender.tick()
    deployments = "/apis/apps/v1/namespaces/ml/deployments/web"
    assert rig.api.of("patch", deployments) == []  # the raised target is published first
    assert rig.stored()["status"]["memory"] != "4Gi"
    rig.clock.now += 1
    recommender.tick()
    (_, _, body), *_ = rig.api.of("patch", deployments)
    annotations = body["spec"]["template"]["metadata"]["annotations"]
    assert keys.RESTARTED_AT in annotations
    status = rig.stored()["status"]
    assert status["rolloutMessage"].startswith("restarted at")
    assert "lastRollout" in status
    rig.clock.now += 1
    recommender.tick()
    assert len(rig.api.of("patch", deployments)) == 1  # cooldown


def test_auto_cannot_restart_a_job_and_says_so() -> None:
    auto = gpupolicy("auto", updateMode="Auto")
    job_pod = pod("train-x", owner=("Job", "train"), policy="auto", memory="4Gi")
    rig = Rig([job_pod], policies=[auto])
    recommender = rig.recommender()
    rig.feed(0.5, int(3.9 * GiB), "train-x")
    recommender.tick()
    rig.clock.now += 1
    recommender.tick()
    assert rig.api.of("patch", "/apis/apps") == []
    message = rig.stored("job-train")["status"]["rolloutMessage"]
    assert "only Deployments and StatefulSets" in message


def test_a_failed_restart_is_recorded_on_the_recommendation() -> None:
    auto = gpupolicy("auto", updateMode="Auto")
    rig = Rig([pod("web-a", policy="auto", memory="4Gi")], policies=[auto])
    rig.api.fail_patch["/apis/apps"] = ApiError(403, "Forbidden", "no patch on deployments")
    recommender = rig.recommender()
    rig.feed(0.2, int(3.8 * GiB), "web-a")
    recommender.tick()
    rig.clock.now += 1
    recommender.tick()
    assert "Forbidden" in rig.stored()["status"]["rolloutMessage"]
    (failed,) = events(rig, "RestartFailed")  # and a Warning Event on the workload
    assert failed["type"] == "Warning"
    assert "Forbidden" in failed["note"]


def test_initial_mode_never_restarts_anything() -> None:
    rig = Rig([pod("web-a", memory="4Gi")])
    recommender = rig.recommender()
    rig.feed(0.2, int(3.9 * GiB), "web-a")
    for _ in range(3):
        recommender.tick()
        rig.clock.now += 1
    assert rig.api.of("patch", "/apis/apps") == []


def test_a_workload_gone_longer_than_its_window_is_forgotten() -> None:
    rig = Rig([pod("web-a", policy="build")])
    recommender = rig.recommender()
    rig.feed(0.2, 2 * GiB, "web-a")
    recommender.tick()
    rig.pods.objects.clear()
    rig.source.usage = []
    rig.clock.now += BUILTIN["build"].history_window_seconds - 10
    recommender.tick()
    assert rig.api.of("delete") == []  # gone, but its history is still recent
    rig.clock.now += 20
    recommender.tick()
    assert [p for _, p, _ in rig.api.of("delete")] == [f"{REC_PATH}/deployment-web"]
    assert recommender.workloads() == {}


def test_collection_errors_are_logged_once_until_they_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = Rig()
    recommender = rig.recommender()
    rig.source.errors = ("http://10.0.0.7:9400/metrics: connection refused",)
    with caplog.at_level(logging.INFO):
        recommender.tick()
        recommender.tick()
        rig.source.errors = ()
        recommender.tick()
    failed = [r for r in caplog.records if "usage collection failed" in r.getMessage()]
    recovered = [r for r in caplog.records if "recovered" in r.getMessage()]
    assert (len(failed), len(recovered)) == (1, 1)


def test_pods_not_admitted_by_the_webhook_are_not_recorded() -> None:
    stray = pod("web-a")
    del stray["metadata"]["annotations"][keys.DECISION]
    rig = Rig([stray])
    rig.feed(0.2, GiB, "web-a")
    result = rig.recommender().tick()
    assert (result.samples, result.unmatched, result.written) == (0, 1, 0)


def events(rig: "Rig", reason: str) -> list[JSON]:
    return [
        body
        for _, path, body in rig.api.of("create", "/apis/events.k8s.io/v1/namespaces/ml/events")
        if body["reason"] == reason
    ]


def test_a_changed_recommendation_and_the_restart_onto_it_are_events() -> None:
    auto = gpupolicy("auto", updateMode="Auto", historyWindowSeconds=60)
    rig = Rig([pod("web-a", policy="auto", memory="4Gi")], policies=[auto])
    recommender = rig.recommender()
    rig.feed(0.2, int(3.8 * GiB), "web-a")
    recommender.tick()

    (changed,) = events(rig, "RecommendationChanged")
    assert changed["type"] == "Normal"
    assert changed["reportingController"] == "gpupack.io/recommender"
    assert changed["regarding"]["kind"] == "GPURecommendation"
    assert changed["regarding"]["name"] == "deployment-web"
    assert changed["note"].startswith("Deployment web: recommends ")
    assert "(auto)" in changed["note"]

    rig.clock.now += 1
    recommender.tick()
    (restarted,) = events(rig, "RestartedForRecommendation")
    assert restarted["regarding"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "web",
        "namespace": "ml",
    }
    assert "restarted onto its GPU recommendation" in restarted["note"]
    assert len(events(rig, "RecommendationChanged")) == 1  # unchanged since: no new Event
