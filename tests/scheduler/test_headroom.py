"""The room a pool keeps for its next pods (`scheduler.headroom`), and the empty GPUs it
gives back: after the short grace period where the pool has room elsewhere, at once on a
node an autoscaler is removing, never one the pool needs as its headroom."""

from typing import Any

import pytest

from gpupack import keys
from scheduler.headroom import Headroom, headroom_of, kept
from scheduler.ledger import Gpu, Request
from tests.scheduler.test_cache import UUIDS
from tests.scheduler.test_extender import DeletingApi, filter_, pending, setup

GiB = 2**30
JSON = dict[str, Any]


def gpu(uuid: str, node: str = "n1", compute: int = 0, memory: int = 0, **extra: Any) -> Gpu:
    made = Gpu(uuid, node, memory=80 * GiB, pool="p", **extra)
    made.used_compute, made.used_memory = compute, memory * GiB
    if compute:
        made.owners = {"ml/Deployment/a": 1}
    return made


def request(compute: int, memory: int = 1) -> Request:
    return Request(key="ml/x", owner="ml/Deployment/x", compute=compute, gpu_memory=memory * GiB)


def test_a_pool_that_runs_nothing_keeps_no_room() -> None:
    assert headroom_of([], 1) == Headroom()
    assert kept(headroom_of([], 1), [], [gpu("e1"), gpu("e2")], {"n1": 2}) == ()


def test_the_room_is_one_more_of_the_largest_share_in_each_dimension() -> None:
    need = headroom_of([request(300, 30), request(700, 8)], 1)
    assert need == Headroom(1, 700, 30 * GiB)


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        pytest.param([gpu("u1", compute=300, memory=8)], (), id="the-used-gpu-has-room"),
        pytest.param([gpu("u1", compute=900, memory=8)], ("e-big",), id="it-lacks-compute"),
        pytest.param([gpu("u1", compute=300, memory=75)], ("e-big",), id="it-lacks-memory"),
        pytest.param(
            [gpu("u1", compute=300, memory=8, draining=True)], ("e-big",), id="it-is-draining"
        ),
    ],
)
def test_an_empty_gpu_is_kept_only_where_the_used_ones_lack_the_room(
    used: list[Gpu], expected: tuple[str, ...]
) -> None:
    need = headroom_of([request(600, 10)], 1)
    empty = [gpu("e-big", node="n1"), gpu("e-lone", node="n2")]
    assert kept(need, used, empty, {"n1": 3, "n2": 1}) == expected


def test_the_gpu_kept_is_on_the_node_holding_most_of_the_pools_gpus() -> None:
    """An empty GPU alone on its node would keep the node; one beside the pool's others
    costs only itself."""
    need = headroom_of([request(1000)], 1)
    empty = [gpu("a", node="lone"), gpu("b", node="busy"), gpu("c", node="busy")]
    assert kept(need, [], empty, {"lone": 1, "busy": 5}) == ("b",)


def test_room_for_two_pods_keeps_what_two_take() -> None:
    need = headroom_of([request(500)], 2)
    assert kept(need, [], [gpu("a"), gpu("b")], {"n1": 2}) == ("a",)  # 2 x 500m on one
    need = headroom_of([request(600)], 2)
    assert kept(need, [], [gpu("a"), gpu("b"), gpu("c")], {"n1": 3}) == ("a", "b")


def bound(pods: Any, name: str, compute: str, index: int) -> JSON:
    pod = pending(pods, name, compute)
    pod["metadata"]["annotations"] |= {
        keys.GPU_UUID: UUIDS[index],
        keys.CAPACITY_POD: f"cap-{index}",
    }
    pod["spec"]["nodeName"] = "n1"
    pod["status"] = {"phase": "Running"}
    return pod


def rounds(extender: Any, clock: Any, seconds: float, step: float = 5.0) -> None:
    end = clock.now + seconds
    while clock.now < end:
        extender.tick()
        clock.now += step
    extender.tick()
    extender.flush()


def test_an_emptied_gpu_goes_after_the_short_grace_when_the_pool_has_room_elsewhere() -> None:
    """cap-0 runs a 300m pod with 700m to spare; cap-1 hosts nothing: the room for one more
    pod like the pool's is on cap-0, so cap-1 is given back after `grace_period`."""
    extender, pods, api, clock = setup(0, 1, nodes={"n1": 0}, api=DeletingApi, grace_period=15)
    assert isinstance(api, DeletingApi)
    bound(pods, "a", "300m", 0)
    extender.leading = True
    rounds(extender, clock, 10)
    assert api.deleted == []
    rounds(extender, clock, 10)
    assert api.deleted == ["cap-1"]


def test_an_empty_gpu_the_pool_needs_as_headroom_is_kept_until_the_pool_empties() -> None:
    """cap-0 runs a 900m pod: one more such pod needs cap-1, kept however long; once the
    pod is gone the pool runs nothing and keeps nothing."""
    extender, pods, api, clock = setup(0, 1, nodes={"n1": 0}, api=DeletingApi, grace_period=15)
    assert isinstance(api, DeletingApi)
    bound(pods, "a", "900m", 0)
    extender.leading = True
    rounds(extender, clock, 600, step=30)
    assert api.deleted == []
    assert extender._lifecycle.headroom == {UUIDS[1]}

    del pods.objects["ml/a"]
    extender.cache.dirty.pod("ml/a")
    rounds(extender, clock, 20)
    assert sorted(api.deleted) == ["cap-0", "cap-1"]


def test_no_headroom_gives_every_empty_gpu_back_after_the_grace() -> None:
    extender, pods, api, clock = setup(
        0, 1, nodes={"n1": 0}, api=DeletingApi, grace_period=15, headroom_pods=0
    )
    assert isinstance(api, DeletingApi)
    bound(pods, "a", "900m", 0)
    extender.leading = True
    rounds(extender, clock, 20)
    assert api.deleted == ["cap-1"]


def test_a_node_an_autoscaler_removes_gets_no_new_share_and_its_empty_gpus_go_at_once() -> None:
    """Karpenter taints n1 `karpenter.sh/disrupted` once it decides to remove it: the
    empty GPU there is given back at once, headroom or not, and a new pod is not placed
    on n1's GPU that has room."""
    extender, pods, api, clock = setup(0, 1, nodes={"n1": 0}, api=DeletingApi, grace_period=300)
    assert isinstance(api, DeletingApi)
    bound(pods, "a", "900m", 0)
    extender.leading = True
    rounds(extender, clock, 5)
    assert api.deleted == []
    taint = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
    api.nodes.objects["n1"]["spec"]["taints"] = [taint]
    extender.cache.dirty.node("n1")
    extender.tick()
    extender.flush()
    assert api.deleted == ["cap-1"]

    answer = filter_(extender, pending(pods, "b", "100m"), nodes=("n1",))
    assert not answer.get("NodeNames")
    assert "autoscaler is removing" in answer["FailedAndUnresolvableNodes"]["n1"]
