"""The capacity planner against the in-memory API server: what a pool lacks, counted once per
pod, and never a pod created (capacity is gpupack-scheduler's to create)."""

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from doubles.pods import as_the_api_server_sends_it, vllm_pod
from gpupack import keys
from gpupack.capacity import capacity_name
from gpupack.objects import JSON
from gpupack.packing import Allocation
from gpupack.pool import pool_key, scheduling_metadata
from gpupack.runtime.informer import Informer
from tests.fakes import FakeKube
from webhook.capacity import (
    DECISION_INDEX,
    POOL_INDEX,
    CapacityManager,
    _holding,
    _seat,
    allocation_of,
    capacity_pool,
    decision_of,
    fractional_pool,
    planned,
)
from webhook.decision import CapacityOutcome, Demand

WAIT = 10.0  # a deadline for informer threads, never a measured duration
GiB = 2**30
SYSTEM = keys.SYSTEM_NAMESPACE
TTL = 60.0
SPEC: JSON = {
    "containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0"}],
    "schedulerName": keys.SCHEDULER_NAME,
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "priorityClassName": "inference",
}
POOL = pool_key(SPEC)  # type: ignore[arg-type]


def demand(
    uid: str,
    compute: int = 300,
    memory: int = 2 * GiB,
    workload: str = "Deployment/llm",
    exclusive: bool = False,
) -> Demand:
    return Demand(
        decision_id=uid,
        pool=POOL,
        scheduling=scheduling_metadata(SPEC),  # type: ignore[arg-type]
        compute=compute,
        memory=memory,
        namespace="ml",
        workload=workload,
        exclusive=exclusive,
    )


def fractional_pod(
    name: str,
    *,
    decision: str = "",
    compute: str = "300m",
    memory: str = "2Gi",
    on: str | None = None,
    phase: str = "Pending",
    owner: str = "llm",
    enforcement: str = "memory",
) -> JSON:
    annotations = {
        keys.GPU_COMPUTE: compute,
        keys.GPU_MEMORY: memory,
        keys.DECISION: decision or f"uid-{name}",
        keys.POLICY: "near-real-time",
        keys.ENFORCEMENT: enforcement,
    }
    spec = dict(SPEC)
    if on is not None:
        annotations[keys.CAPACITY_POD] = on
        spec["nodeName"] = "gpu-node-1"
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {"app": owner},
            "annotations": annotations,
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner, "controller": True}
            ],
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def capacity_pod(index: int, *, phase: str = "Running", memory: str | None = None) -> JSON:
    annotations = {keys.GPU_MEMORY: memory} if memory else {}
    return {
        "kind": "Pod",
        "metadata": {
            "name": capacity_name(POOL, index),
            "namespace": SYSTEM,
            "labels": {keys.ROLE: keys.ROLE_CAPACITY, keys.POOL: POOL},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "capacity", "image": "pause"}]},
        "status": {"phase": phase},
    }


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Replica:
    """One webhook replica's caches and capacity manager."""

    manager: CapacityManager
    capacity_pods: Informer
    fractional_pods: Informer


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def replicas(kube: FakeKube, clock: Clock) -> Iterator[Callable[..., Replica]]:
    made: list[Replica] = []

    def make(*, start: bool = True, **kwargs: Any) -> Replica:
        capacity_pods = Informer(
            kube,
            f"/api/v1/namespaces/{SYSTEM}/pods",
            {"labelSelector": f"{keys.ROLE}={keys.ROLE_CAPACITY}"},
            indexers={POOL_INDEX: capacity_pool},
            keep=planned,  # as webhook.cluster keeps them
        )
        fractional_pods = Informer(
            kube,
            "/api/v1/pods",
            {"fieldSelector": f"spec.schedulerName={keys.SCHEDULER_NAME}"},
            indexers={POOL_INDEX: fractional_pool, DECISION_INDEX: decision_of},
            keep=planned,
        )
        kwargs.setdefault("reuse", 0.0)  # every plan reads the pool, unless a test says
        manager = CapacityManager(capacity_pods, fractional_pods, ttl=TTL, clock=clock, **kwargs)
        replica = Replica(manager, capacity_pods, fractional_pods)
        made.append(replica)
        if start:
            capacity_pods.start()
            fractional_pods.start()
            assert capacity_pods.wait_synced(WAIT)
            assert fractional_pods.wait_synced(WAIT)
        return replica

    yield make
    for replica in made:
        replica.capacity_pods.stop()
        replica.fractional_pods.stop()


def run_concurrently(calls: list[Callable[[], CapacityOutcome]]) -> list[CapacityOutcome]:
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], CapacityOutcome]) -> CapacityOutcome:
        start.wait(WAIT)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def missing(outcome: CapacityOutcome) -> int:
    assert outcome.verdict in ("sufficient", "needed"), outcome
    return int(outcome.extra["missing"])


def test_nine_concurrent_admissions_plan_three_gpus(replicas: Callable[..., Replica]) -> None:
    """Each admission counts the ones before it (reservations): the ninth pod's plan is
    the pool's, three GPUs. (The planner has no client to create anything with; that the
    webhook writes nothing is held by its RBAC, tests/chart.)"""
    replica = replicas()

    outcomes = run_concurrently(
        [partial(replica.manager.plan, demand(f"uid-{i}"), False) for i in range(9)]
    )

    assert sorted(missing(o) for o in outcomes) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    needed = next(o for o in outcomes if missing(o) == 3)
    assert needed.verdict == "needed"
    assert "gpupack-scheduler creates" in needed.detail


def test_a_pool_with_room_is_sufficient(kube: FakeKube, replicas: Callable[..., Replica]) -> None:
    kube.put(capacity_pod(0))
    replica = replicas()

    outcomes = [replica.manager.plan(demand(f"uid-{i}"), False) for i in range(3)]

    assert [o.verdict for o in outcomes] == ["sufficient"] * 3
    assert missing(replica.manager.plan(demand("uid-3"), False)) == 1


def test_pods_already_placed_and_pending_fill_the_pool(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    kube.put(capacity_pod(0))
    kube.put(capacity_pod(1, phase="Pending"))
    for i in range(3):
        kube.put(fractional_pod(f"placed-{i}", on=capacity_name(POOL, 0), phase="Running"))
    for i in range(3):
        kube.put(fractional_pod(f"waiting-{i}"))
    kube.put(fractional_pod("done", phase="Succeeded"))  # terminated: does not count
    replica = replicas()

    outcome = replica.manager.plan(demand("uid-new"), False)

    assert outcome.verdict == "needed"
    assert outcome.extra == {"pool": POOL, "gpus": 2, "missing": 1}


def test_a_pod_read_before_is_read_again_once_it_changes(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    """Each pod is read once per version (the planner remembers what it read): a pod that
    finishes, or a GPU whose memory becomes known, changes the next plan."""
    kube.put(capacity_pod(0))
    for i in range(3):
        kube.put(fractional_pod(f"llm-{i}", on=capacity_name(POOL, 0), phase="Running"))
    replica = replicas()
    assert replica.manager.plan(demand("uid-a", memory=GiB), True).verdict == "needed"

    kube.put(fractional_pod("llm-2", on=capacity_name(POOL, 0), phase="Succeeded"))
    assert replica.fractional_pods.wait_for(
        lambda i: any(p["status"]["phase"] == "Succeeded" for p in i.items()), WAIT
    )
    assert replica.manager.plan(demand("uid-b", memory=GiB), True).verdict == "sufficient"

    kube.put(capacity_pod(0, memory="6Gi"))  # 2 x 2Gi placed: 2Gi left, not 3
    assert replica.capacity_pods.wait_for(
        lambda i: any(p["metadata"]["annotations"] for p in i.items()), WAIT
    )
    assert replica.manager.plan(demand("uid-c", memory=3 * GiB), True).verdict == "needed"


def test_known_gpu_memory_limits_what_fits(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    kube.put(capacity_pod(0, memory="16Gi"))
    kube.put(fractional_pod("big", memory="12Gi", on=capacity_name(POOL, 0), phase="Running"))
    replica = replicas()

    small = replica.manager.plan(demand("uid-small", memory=4 * GiB), False)
    large = replica.manager.plan(demand("uid-large", memory=8 * GiB), False)

    assert small.verdict == "sufficient"
    assert missing(large) == 1


def test_an_mps_pod_does_not_join_another_workloads_gpu(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    kube.put(capacity_pod(0))
    kube.put(
        fractional_pod(
            "a-0", owner="a", enforcement="mps", on=capacity_name(POOL, 0), phase="Running"
        )
    )
    replica = replicas()

    same = replica.manager.plan(demand("uid-a", workload="StatefulSet/a", exclusive=True), False)
    other = replica.manager.plan(demand("uid-b", workload="StatefulSet/b", exclusive=True), False)

    assert same.verdict == "sufficient"
    assert missing(other) == 1


def test_terminating_and_finished_capacity_pods_hold_no_gpu(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    kube.put(capacity_pod(0, phase="Failed"))
    deleting = capacity_pod(1)
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    kube.put(deleting)
    replica = replicas()

    outcome = replica.manager.plan(demand("uid-1"), False)

    assert outcome.extra["gpus"] == 0
    assert missing(outcome) == 1


def test_dry_run_reserves_nothing(replicas: Callable[..., Replica]) -> None:
    replica = replicas()

    outcome = replica.manager.plan(demand("uid-dry", compute=600), True)

    assert missing(outcome) == 1
    assert replica.manager.reservations(POOL) == {}
    assert missing(replica.manager.plan(demand("uid-real", compute=600), False)) == 1


def test_a_bug_becomes_an_error_outcome_not_an_exception(
    replicas: Callable[..., Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    replica = replicas()

    def explode(*_: Any, **__: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("webhook.capacity.Packing.of", explode)

    outcome = replica.manager.plan(demand("uid-1"), False)

    assert outcome.verdict == "error"
    assert "boom" in outcome.detail


def test_nothing_is_planned_before_the_caches_sync(replicas: Callable[..., Replica]) -> None:
    replica = replicas(start=False)

    outcome = replica.manager.plan(demand("uid-1"), False)

    assert outcome.verdict == "not-synced"
    assert replica.manager.reservations(POOL).keys() == {"uid-1"}  # counted once synced


def test_reservations_expire(
    kube: FakeKube, replicas: Callable[..., Replica], clock: Clock
) -> None:
    kube.put(capacity_pod(0))
    replica = replicas()
    for i in range(3):
        assert replica.manager.plan(demand(f"uid-{i}"), False).verdict == "sufficient"
    assert replica.manager.reservations(POOL).keys() == {"uid-0", "uid-1", "uid-2"}

    clock.now += TTL  # the three pods were never created (a later admission step failed)

    assert replica.manager.reservations(POOL) == {}
    assert replica.manager.plan(demand("uid-3"), False).verdict == "sufficient"


def test_a_reservation_is_dropped_once_its_pod_is_seen(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    kube.put(capacity_pod(0))
    replica = replicas()
    replica.manager.plan(demand("uid-1"), False)
    replica.manager.plan(demand("uid-2"), False)

    kube.put(fractional_pod("llm-0", decision="uid-1"))
    assert replica.fractional_pods.wait_for(lambda i: len(i.items()) == 1, WAIT)

    assert replica.manager.reservations(POOL).keys() == {"uid-2"}
    # Counted once, as a pending pod: 300m (llm-0) + 300m (uid-2) + 300m + 300m > 1 GPU.
    assert replica.manager.plan(demand("uid-3"), False).verdict == "sufficient"
    assert replica.manager.plan(demand("uid-4"), False).verdict == "needed"


def test_a_demand_becomes_an_allocation_of_its_workload() -> None:
    demand = Demand("uid-1", POOL, {}, 300, 8 * GiB, "ml", "Deployment/llm", exclusive=True)

    assert allocation_of(demand) == Allocation("uid-1", 300, 8 * GiB, "ml/Deployment/llm", True)


def test_the_pod_caches_keep_what_planning_reads_and_little_else() -> None:
    """The webhook's pod caches keep `planned(pod)`: every reader of capacity planning
    answers from it as from the pod the API server sent, at a fraction of its size."""
    spec = vllm_pod()["spec"]
    share = as_the_api_server_sends_it(fractional_pod("a", on="cap-0", phase="Running"), "x1")
    share["spec"] |= {"containers": spec["containers"], "affinity": {"nodeAffinity": {}}}
    share["status"] |= {
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "main", "ready": True, "image": "vllm", "started": True}],
    }
    waiting = fractional_pod("b", decision="d-b", phase="Pending")
    leaving = fractional_pod("c", on="cap-0")
    leaving["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    held = capacity_pod(0, memory="80Gi")
    gone = capacity_pod(1, phase="Succeeded")

    for pod in (share, waiting, leaving):
        kept = planned(pod)
        assert fractional_pool(kept) == fractional_pool(pod)
        assert decision_of(kept) == decision_of(pod)
        assert _seat(kept) == _seat(pod)
    for pod in (held, gone):
        kept = planned(pod)
        assert capacity_pool(kept) == capacity_pool(pod)
        assert _holding(kept) == _holding(pod)
    assert _seat(share) is not None
    assert _seat(leaving) is None
    assert _holding(held) == (80 * GiB, True)
    assert len(json.dumps(planned(share))) < len(json.dumps(share)) / 2


def test_a_burst_within_the_reuse_window_is_fitted_onto_the_last_plan_without_reading_the_pool(
    kube: FakeKube, replicas: Callable[..., Replica], clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst into one pool reads the pool once per `reuse` seconds, not once per pod;
    the pods admitted meanwhile are fitted onto the last plan and count each other, so
    the answers are the full plans' (one shape: first fit is first fit decreasing)."""
    kube.put(capacity_pod(0))
    kube.put(fractional_pod("placed", on=capacity_name(POOL, 0), phase="Running"))
    reusing, planning = replicas(reuse=1.0), replicas(reuse=0.0)
    reads: list[str] = []
    read = reusing.fractional_pods.by_index

    def counted(index: str, value: str) -> list[JSON]:
        reads.append(index)
        return read(index, value)

    monkeypatch.setattr(reusing.fractional_pods, "by_index", counted)

    burst = [demand(f"uid-{i}") for i in range(9)]
    fitted = [missing(reusing.manager.plan(d, False)) for d in burst]
    planned_in_full = [missing(planning.manager.plan(d, False)) for d in burst]

    assert fitted == planned_in_full == [0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert reads.count(POOL_INDEX) == 1  # the first admission's plan

    clock.now += 1.0  # the window passed: the next plan reads the pool again
    kube.delete("pods", "ml", "placed")
    assert reusing.fractional_pods.wait_for(lambda i: i.get("ml/placed") is None, WAIT)
    assert missing(reusing.manager.plan(demand("uid-9"), False)) == 3  # 300m freed
    assert reads.count(POOL_INDEX) == 2


def test_a_dry_run_within_the_reuse_window_counts_for_no_later_admission(
    replicas: Callable[..., Replica],
) -> None:
    replica = replicas(reuse=1.0)
    assert missing(replica.manager.plan(demand("uid-a"), False)) == 1
    for i in range(5):  # dry runs: 600m, 900m, ... each alone with uid-a
        assert missing(replica.manager.plan(demand(f"dry-{i}"), True)) == 1
    assert missing(replica.manager.plan(demand("uid-b"), False)) == 1
    assert missing(replica.manager.plan(demand("uid-c"), False)) == 1
    assert missing(replica.manager.plan(demand("uid-d"), False)) == 2


def test_a_real_time_mps_admission_is_planned_in_full_within_the_reuse_window(
    replicas: Callable[..., Replica],
) -> None:
    """Owners matter to a real-time-mps pod: only the full plan packs it."""
    replica = replicas(reuse=1.0)
    assert missing(replica.manager.plan(demand("uid-a", workload="Deployment/a"), False)) == 1
    exclusive = demand("uid-mps", workload="Deployment/mps", exclusive=True)
    assert missing(replica.manager.plan(exclusive, False)) == 2  # not on uid-a's GPU
