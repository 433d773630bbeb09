"""Which pods a shrinking ReplicaSet loses first: the leader keeps each ReplicaSet pod's
pod-deletion-cost at its GPU's fill, writes only what changed, and leaves a cost the
user set alone."""

from typing import Any

from gpupack import keys
from scheduler.deletion_cost import LIMIT, Costs, costs, managed
from tests.scheduler.test_cache import cache_with, capacity, fractional
from tests.scheduler.test_drain import Kube

JSON = dict[str, Any]


def replica(name: str, compute: str, gpu: int, **annotations: str) -> JSON:
    pod = fractional(name, compute, gpu=gpu)
    pod["status"]["phase"] = "Running"
    pod["metadata"]["annotations"] |= annotations
    pod["metadata"]["resourceVersion"] = "7"
    pod["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "name": "web-5d4f", "controller": True}
    ]
    return pod


def written(kube: Kube) -> dict[str, JSON]:
    return {
        path.split("/")[-1]: body for verb, path, body in kube.calls if verb == "patch" and body
    }


def test_pods_cost_what_their_gpu_holds_so_the_emptiest_gpu_loses_its_pods_first() -> None:
    cache, _ = cache_with(
        capacity(0),
        capacity(1),
        replica("a", "300m", 0),
        replica("b", "600m", 0),
        replica("c", "250m", 1),
    )
    kube = Kube()

    assert Costs(kube, cache, lambda f, *a: f(*a)).round(0.0) == 3

    values = {name: body["metadata"]["annotations"] for name, body in written(kube).items()}
    assert values["a"][keys.POD_DELETION_COST] == values["b"][keys.POD_DELETION_COST] == "900"
    assert values["c"] == {keys.POD_DELETION_COST: "200", keys.DELETION_COST: "200"}  # 250 → step
    assert written(kube)["a"]["metadata"]["resourceVersion"] == "7"  # a conflict, never a clobber


def test_a_cost_that_did_not_change_step_is_not_written_again() -> None:
    done = {keys.POD_DELETION_COST: "300", keys.DELETION_COST: "300"}
    cache, _ = cache_with(capacity(0), replica("a", "320m", 0, **done))
    kube = Kube()

    assert Costs(kube, cache, lambda f, *a: f(*a)).round(0.0) == 0


def test_a_cost_the_user_set_is_theirs() -> None:
    pod = replica("a", "300m", 0, **{keys.POD_DELETION_COST: "-5"})

    assert not managed(pod)
    assert managed(
        replica("b", "300m", 0, **{keys.POD_DELETION_COST: "100", keys.DELETION_COST: "100"})
    )


def test_only_running_replicaset_pods_get_a_cost() -> None:
    job = replica("j", "300m", 0)
    job["metadata"]["ownerReferences"][0]["kind"] = "Job"
    pending = replica("p", "300m", 0)
    pending["status"]["phase"] = "Pending"

    assert not managed(job)
    assert not managed(pending)


def test_a_round_writes_at_most_its_limit_and_rounds_are_paced() -> None:
    pods = [replica(f"p{i}", "10m", i % 2) for i in range(LIMIT + 10)]
    cache, _ = cache_with(capacity(0), capacity(1), *pods)
    kube = Kube()
    keeper = Costs(kube, cache, lambda f, *a: f(*a))

    assert keeper.round(0.0) == LIMIT
    assert keeper.round(1.0) == 0  # not due yet
    assert set(costs(cache.ledger)) == {f"ml/p{i}" for i in range(LIMIT + 10)}
