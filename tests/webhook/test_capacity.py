"""The capacity manager against the in-memory API server: counting, naming, races, errors."""

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from gpupack import keys
from gpupack.capacity import CREATED_FOR, Allocation, capacity_name
from gpupack.kube import JSON
from gpupack.pool import pool_key, scheduling_metadata
from gpupack.runtime.api import ApiError
from gpupack.runtime.informer import Informer
from tests.fakes import FakeKube
from webhook.capacity import (
    DECISION_INDEX,
    POOL_INDEX,
    CapacityManager,
    allocation_of,
    capacity_pool,
    decision_of,
    fractional_pool,
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
    enforcement: str = "accounting",
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
    created: list[int] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)


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
        )
        fractional_pods = Informer(
            kube,
            "/api/v1/pods",
            {"fieldSelector": f"spec.schedulerName={keys.SCHEDULER_NAME}"},
            indexers={POOL_INDEX: fractional_pool, DECISION_INDEX: decision_of},
        )
        created: list[int] = []
        sleeps: list[float] = []
        manager = CapacityManager(
            kube,
            capacity_pods,
            fractional_pods,
            ttl=TTL,
            clock=clock,
            sleep=sleeps.append,
            on_created=created.append,
            **kwargs,
        )
        replica = Replica(manager, capacity_pods, fractional_pods, created, sleeps)
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


def created_names(kube: FakeKube) -> list[str]:
    return sorted(p["metadata"]["name"] for p in kube.objects("pods", SYSTEM))


def run_concurrently(calls: list[Callable[[], CapacityOutcome]]) -> list[CapacityOutcome]:
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], CapacityOutcome]) -> CapacityOutcome:
        start.wait(WAIT)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_nine_concurrent_admissions_create_exactly_three_capacity_pods(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    replica = replicas()

    outcomes = run_concurrently(
        [partial(replica.manager.ensure, demand(f"uid-{i}"), False) for i in range(9)]
    )

    assert created_names(kube) == [capacity_name(POOL, i) for i in range(3)]
    assert sorted(name for o in outcomes for name in o.created) == created_names(kube)
    assert {o.action for o in outcomes} <= {"created", "sufficient"}
    assert sum(replica.created) == 3
    for pod in kube.objects("pods", SYSTEM):
        spec = pod["spec"]
        assert spec["nodeSelector"] == SPEC["nodeSelector"]
        assert spec["tolerations"] == SPEC["tolerations"]
        assert spec["priorityClassName"] == "inference"
        assert spec["containers"][0]["resources"]["limits"] == {keys.NVIDIA_GPU: "1"}
        assert pod["metadata"]["labels"][keys.POOL] == POOL
        assert pod["metadata"]["annotations"][CREATED_FOR] == "ml/Deployment/llm"


def test_capacity_is_created_only_when_something_is_missing(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    kube.put(capacity_pod(0))
    replica = replicas()

    outcomes = [replica.manager.ensure(demand(f"uid-{i}"), False) for i in range(3)]

    assert [o.action for o in outcomes] == ["sufficient"] * 3
    assert kube.count("create") == 0
    assert replica.manager.ensure(demand("uid-3"), False).created == (capacity_name(POOL, 1),)


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

    outcome = replica.manager.ensure(demand("uid-new"), False)

    assert outcome.action == "created"
    assert outcome.created == (capacity_name(POOL, 2),)
    assert outcome.extra["gpus"] == 2


def test_a_pod_read_before_is_read_again_once_it_changes(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    """Each pod is read once per version (the manager remembers what it read): a pod that
    finishes, or a GPU whose memory becomes known, changes the next plan."""
    kube.put(capacity_pod(0))
    for i in range(3):
        kube.put(fractional_pod(f"llm-{i}", on=capacity_name(POOL, 0), phase="Running"))
    replica = replicas()
    assert replica.manager.ensure(demand("uid-a", memory=GiB), True).action == "dry-run"

    kube.put(fractional_pod("llm-2", on=capacity_name(POOL, 0), phase="Succeeded"))
    assert replica.fractional_pods.wait_for(
        lambda i: any(p["status"]["phase"] == "Succeeded" for p in i.items()), WAIT
    )
    assert replica.manager.ensure(demand("uid-b", memory=GiB), True).action == "sufficient"

    kube.put(capacity_pod(0, memory="6Gi"))  # 2 x 2Gi placed: 2Gi left, not 3
    assert replica.capacity_pods.wait_for(
        lambda i: any(p["metadata"]["annotations"] for p in i.items()), WAIT
    )
    assert replica.manager.ensure(demand("uid-c", memory=3 * GiB), True).action == "dry-run"


def test_known_gpu_memory_limits_what_fits(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    kube.put(capacity_pod(0, memory="16Gi"))
    kube.put(fractional_pod("big", memory="12Gi", on=capacity_name(POOL, 0), phase="Running"))
    replica = replicas()

    small = replica.manager.ensure(demand("uid-small", memory=4 * GiB), False)
    large = replica.manager.ensure(demand("uid-large", memory=8 * GiB), False)

    assert small.action == "sufficient"
    assert large.created == (capacity_name(POOL, 1),)


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

    same = replica.manager.ensure(demand("uid-a", workload="StatefulSet/a", exclusive=True), False)
    other = replica.manager.ensure(demand("uid-b", workload="StatefulSet/b", exclusive=True), False)

    assert same.action == "sufficient"
    assert other.created == (capacity_name(POOL, 1),)


def test_names_skip_capacity_pods_that_are_terminating_or_finished(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    kube.put(capacity_pod(0, phase="Failed"))
    deleting = capacity_pod(1)
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    kube.put(deleting)
    replica = replicas()

    outcome = replica.manager.ensure(demand("uid-1"), False)

    assert outcome.created == (capacity_name(POOL, 2),)
    assert outcome.extra["gpus"] == 0


def test_a_second_replica_with_a_stale_cache_creates_no_duplicate(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    first = replicas()
    second = replicas()
    second.capacity_pods.stop()  # its cache stays as it was: empty
    second.fractional_pods.stop()

    won = first.manager.ensure(demand("uid-1"), False)
    lost = second.manager.ensure(demand("uid-2"), False)

    assert won.created == (capacity_name(POOL, 0),)
    assert lost.action == "sufficient"
    assert lost.created == ()
    assert capacity_name(POOL, 0) in lost.detail
    assert created_names(kube) == [capacity_name(POOL, 0)]
    assert second.created == []


def test_two_replicas_racing_never_duplicate_a_name(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    first, second = replicas(), replicas()

    outcomes = run_concurrently(
        [
            partial((first if i % 2 else second).manager.ensure, demand(f"uid-{i}"), False)
            for i in range(9)
        ]
    )

    names = created_names(kube)
    assert {o.action for o in outcomes} <= {"created", "sufficient"}
    assert sorted(n for o in outcomes for n in o.created) == names  # each created once
    assert names == [capacity_name(POOL, i) for i in range(len(names))]
    assert 2 <= len(names) <= 3


def test_dry_run_creates_nothing_and_reserves_nothing(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    replica = replicas()

    outcome = replica.manager.ensure(demand("uid-dry"), True)

    assert outcome.action == "dry-run"
    assert capacity_name(POOL, 0) in outcome.detail
    assert kube.count("create") == 0
    assert replica.manager.reservations(POOL) == {}
    assert replica.manager.ensure(demand("uid-real"), False).action == "created"


@pytest.mark.parametrize(
    ("error", "calls"),
    [
        pytest.param(ApiError(500, "InternalError", "etcd is down"), 3, id="server-error-retried"),
        pytest.param(ApiError(0, "ConnectionError", "refused"), 3, id="connection-error-retried"),
        pytest.param(ApiError(403, "Forbidden", "cannot create pods"), 1, id="forbidden-fails"),
    ],
)
def test_an_api_error_becomes_an_error_outcome(
    kube: FakeKube, replicas: Callable[..., Replica], error: ApiError, calls: int
) -> None:
    replica = replicas()
    kube.fail("create", error, times=3)

    outcome = replica.manager.ensure(demand("uid-1"), False)

    assert outcome.action == "error"
    assert error.reason in outcome.detail
    assert kube.count("create") == calls
    assert len(replica.sleeps) == calls - 1
    assert created_names(kube) == []
    assert replica.manager.reservations(POOL).keys() == {"uid-1"}  # the pod is admitted


def test_a_transient_create_failure_is_retried(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    replica = replicas()
    kube.fail("create", ApiError(503, "ServiceUnavailable", "try again"))

    outcome = replica.manager.ensure(demand("uid-1"), False)

    assert outcome.created == (capacity_name(POOL, 0),)
    assert kube.count("create") == 2


def test_a_bug_becomes_an_error_outcome_not_an_exception(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    replica = replicas()

    def explode(_: JSON) -> None:
        raise RuntimeError("boom")

    kube.before_create = explode

    outcome = replica.manager.ensure(demand("uid-1"), False)

    assert outcome.action == "error"
    assert "boom" in outcome.detail


def test_nothing_is_created_before_the_caches_sync(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    replica = replicas(start=False)

    outcome = replica.manager.ensure(demand("uid-1"), False)

    assert outcome.action == "not-synced"
    assert kube.count("create") == 0


def test_reservations_expire(
    kube: FakeKube, replicas: Callable[..., Replica], clock: Clock
) -> None:
    kube.put(capacity_pod(0))
    replica = replicas()
    for i in range(3):
        assert replica.manager.ensure(demand(f"uid-{i}"), False).action == "sufficient"
    assert replica.manager.reservations(POOL).keys() == {"uid-0", "uid-1", "uid-2"}

    clock.now += TTL  # the three pods were never created (a later admission step failed)

    assert replica.manager.reservations(POOL) == {}
    assert replica.manager.ensure(demand("uid-3"), False).action == "sufficient"


def test_a_reservation_is_dropped_once_its_pod_is_seen(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    kube.put(capacity_pod(0))
    replica = replicas()
    replica.manager.ensure(demand("uid-1"), False)
    replica.manager.ensure(demand("uid-2"), False)

    kube.put(fractional_pod("llm-0", decision="uid-1"))
    assert replica.fractional_pods.wait_for(lambda i: len(i.items()) == 1, WAIT)

    assert replica.manager.reservations(POOL).keys() == {"uid-2"}
    # Counted once, as a pending pod: 300m (llm-0) + 300m (uid-2) + 300m + 300m > 1 GPU.
    assert replica.manager.ensure(demand("uid-3"), False).action == "sufficient"
    assert replica.manager.ensure(demand("uid-4"), False).action == "created"


def test_created_capacity_pods_count_before_the_watch_shows_them(
    kube: FakeKube, replicas: Callable[..., Replica], clock: Clock
) -> None:
    replica = replicas()
    replica.capacity_pods.stop()  # the watch never shows the new capacity pod

    assert replica.manager.ensure(demand("uid-1"), False).action == "created"
    assert replica.manager.ensure(demand("uid-2"), False).action == "sufficient"
    clock.now += TTL
    second = replica.manager.ensure(demand("uid-3"), False)
    assert second.action == "sufficient"  # the name is still taken on the server
    assert "already created" in second.detail


def test_create_retries_stop_when_the_admission_budget_is_spent(
    kube: FakeKube, replicas: Callable[..., Replica], clock: Clock
) -> None:
    replica = replicas()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    manager = CapacityManager(
        kube,
        replica.capacity_pods,
        replica.fractional_pods,
        clock=clock,
        sleep=sleep,
        create_attempts=10,
        create_budget=0.25,
    )
    kube.fail("create", ApiError(500, "InternalError", "etcd is down"), times=10)

    outcome = manager.ensure(demand("uid-1"), False)

    assert outcome.action == "error"
    assert kube.count("create") == 3  # at 0, 0.1 and 0.3 seconds; then the budget is gone


def test_claim_calls_no_api_and_counts_the_claimed_gpu_at_once(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    replica = replicas()
    first = replica.manager.claim(demand("uid-1"), False)
    assert first.action == "creating"
    assert first.created == (capacity_name(POOL, 0),)
    assert kube.count("create") == 0  # the admission never waits for the API
    # The claimed GPU (1000m) counts before it exists: 300m + 300m + 300m fit on it.
    assert [replica.manager.claim(demand(f"uid-{i}"), False).action for i in (2, 3)] == [
        "sufficient",
        "sufficient",
    ]
    created = replica.manager.create_claimed(demand("uid-1"), first)
    assert created.action == "created"
    assert created_names(kube) == [capacity_name(POOL, 0)]
    assert replica.created == [1]


def test_a_failed_background_create_releases_its_claim(
    kube: FakeKube, replicas: Callable[..., Replica]
) -> None:
    replica = replicas()
    kube.fail("create", ApiError(403, "Forbidden", "pods is forbidden"), times=1)
    claimed = replica.manager.claim(demand("uid-1"), False)
    failed = replica.manager.create_claimed(demand("uid-1"), claimed)
    assert failed.action == "error"
    assert "Forbidden" in failed.detail
    # Nothing is on its way any more, so the next admission plans (and claims) again.
    again = replica.manager.claim(demand("uid-2"), False)
    assert again.action == "creating"
    assert again.created == (capacity_name(POOL, 0),)


def test_claim_on_a_dry_run_creates_and_claims_nothing(replicas: Callable[..., Replica]) -> None:
    replica = replicas()
    assert replica.manager.claim(demand("uid-1"), True).action == "dry-run"
    assert replica.manager.claim(demand("uid-2"), False).created == (capacity_name(POOL, 0),)


def test_a_demand_becomes_an_allocation_of_its_workload() -> None:
    demand = Demand("uid-1", POOL, {}, 300, 8 * GiB, "ml", "Deployment/llm", exclusive=True)

    assert allocation_of(demand) == Allocation("uid-1", 300, 8 * GiB, "ml/Deployment/llm", True)
