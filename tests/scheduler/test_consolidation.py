"""Which GPU consolidation empties: only a whole GPU, only when its shares fit on GPUs
that stay held, emptiest first, never past what the judge allows."""

import pytest

from scheduler.consolidation import Move, lower_bound, plan
from scheduler.ledger import Booking, Gpu, Ledger, Node, Request

GiB = 2**30


def cluster(*loads: list[int], memory: int = 16 * GiB, nodes: int = 1) -> Ledger:
    """GPUs g0, g1, ... (spread over `nodes` nodes) with one pod per compute in `loads`."""
    snapshot = Ledger(
        [Node(f"n{i}", cpu=64_000, memory=256 * GiB, max_pods=110) for i in range(nodes)]
    )
    for index, load in enumerate(loads):
        uuid = f"g{index}"
        snapshot.add_gpu(Gpu(uuid, f"n{index % nodes}", memory=memory, holder=f"cap-{index}"))
        for n, compute in enumerate(load):
            request = Request(
                f"ml/p{index}-{n}", cpu=100, compute=compute, owner=f"ml/w{index}-{n}"
            )
            snapshot.assume(request, f"n{index % nodes}", [uuid])
    return snapshot


def anyone(booking: Booking, gpu: Gpu) -> str | None:
    return None


def test_a_pool_that_needs_what_it_holds_is_left_alone() -> None:
    assert plan(cluster([600], [700], [800]), anyone) == []


def test_the_node_holding_fewest_gpus_is_emptied_first_even_if_its_gpu_is_fuller() -> None:
    # n0 holds g0, g2 (100m each); n1 holds g1 (500m) alone: freeing n1 frees a node.
    snapshot = cluster([100], [500], [100], nodes=2)

    (move,) = plan(snapshot, anyone)

    assert (move.gpu, move.node) == ("g1", "n1")
    assert snapshot.gpus[move.targets[0]].node == "n0"


def test_shares_go_to_another_node_when_one_has_room_so_the_source_node_can_empty() -> None:
    # n0: g0 (400m), g2 (600m); n1: g1 (300m), g3 (300m), g5 (300m). n0 holds fewest: g0
    # goes first, and its share fits best on g2 (n0), but n1 has room: it goes there.
    # g2's share fits on n1 too: both GPUs of n0 are emptied in the same round, so the
    # node can go at once.
    snapshot = cluster([400], [300], [600], [300], [100], [300], nodes=2)
    snapshot.forget("ml/p4-0")  # g4 (n0) empty: n0 holds g0 and g2

    first, second = plan(snapshot, anyone)

    assert (first.gpu, second.gpu) == ("g0", "g2")
    assert {snapshot.gpus[t].node for m in (first, second) for t in m.targets} == {"n1"}


def test_a_round_empties_the_gpus_of_one_node_per_pool() -> None:
    """n0 and n1 each hold one 100m share on each of two GPUs; n2 holds two 600m ones.
    The pool needs 2 GPUs and holds 6: this round empties n0's two GPUs (one node), not a
    GPU of n1 as well, so the pool never drains more than a node at a time."""
    snapshot = cluster([100], [100], [600], [100], [100], [600], nodes=3)

    moves = plan(snapshot, anyone)

    assert {m.node for m in moves} == {"n0"}
    assert sorted(m.gpu for m in moves) == ["g0", "g3"]


def test_nothing_moves_off_or_onto_a_node_an_autoscaler_is_removing() -> None:
    snapshot = cluster([100], [500], [100], nodes=2)
    for gpu in snapshot.gpus.values():
        gpu.removing = gpu.node == "n1"
    (move,) = plan(snapshot, anyone)  # n1's g1 would go first; it is Karpenter's now
    assert move.gpu in ("g0", "g2")
    assert snapshot.gpus[move.targets[0]].node == "n0"

    for gpu in snapshot.gpus.values():
        gpu.removing = gpu.node == "n0"
    assert plan(snapshot, anyone) == []  # g1's share could only go onto n0


def test_the_emptiest_gpu_is_emptied_onto_gpus_that_stay_held() -> None:
    snapshot = cluster([500], [200, 100], [600])

    (move,) = plan(snapshot, anyone)

    assert (move.gpu, move.holder) == ("g1", "cap-1")
    assert move.pods == ("ml/p1-0", "ml/p1-1")  # largest first
    assert set(move.targets) <= {"g0", "g2"}
    assert (move.held, move.needed) == (3, 2)
    assert "holds 3 GPUs where its shares need 2" in move.reason


def test_shares_land_best_fit_so_the_room_left_stays_whole() -> None:
    (move,) = plan(cluster([700], [100], [500]), anyone)

    assert move.targets == ("g0",)  # 300m left there; g2's 500m stays one piece


def test_a_gpu_whose_shares_do_not_all_fit_elsewhere_is_not_touched() -> None:
    # 1.3 GPUs of shares on 3 GPUs, but g0's 450m fits nowhere else: g1 or g2 go instead.
    (move,) = plan(cluster([450], [400], [450]), anyone)

    assert move.gpu == "g1"
    assert move.targets in (("g0",), ("g2",))


def test_one_pod_the_judge_refuses_keeps_its_whole_gpu() -> None:
    def not_p1(booking: Booking, gpu: Gpu) -> str | None:
        return "Job pod" if booking.request.key == "ml/p1-0" else None

    (move,) = plan(cluster([100], [100, 100], [500]), not_p1)

    assert move.gpu == "g0"


def test_a_pool_with_a_drain_under_way_starts_no_other() -> None:
    snapshot = cluster([100], [100], [500])

    assert plan(snapshot, anyone, busy=frozenset({""})) == []


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda g: setattr(g, "draining", True), id="draining"),
        pytest.param(lambda g: setattr(g, "healthy", False), id="unhealthy"),
    ],
)
def test_no_share_is_planned_onto_a_gpu_that_takes_no_new_pods(change: object) -> None:
    snapshot = cluster([100], [600])
    change(snapshot.gpus["g1"])  # type: ignore[operator]

    assert [m.gpu for m in plan(snapshot, anyone)] != ["g0"]


def test_a_whole_gpu_pod_is_never_moved() -> None:
    assert plan(cluster([1000], [100], [100]), anyone) == [
        Move("", "g1", "cap-1", "n0", ("ml/p1-0",), ("g2",), 3, 2)
    ]


def test_memory_counts_as_much_as_compute() -> None:
    snapshot = Ledger([Node("n0", cpu=64_000, memory=256 * GiB)])
    for index, (compute, memory) in enumerate([(100, 12 * GiB), (100, 8 * GiB)]):
        snapshot.add_gpu(Gpu(f"g{index}", "n0", memory=16 * GiB, holder=f"cap-{index}"))
        request = Request(f"ml/p{index}", compute=compute, gpu_memory=memory, owner="ml/w")
        snapshot.assume(request, "n0", [f"g{index}"])

    assert lower_bound(snapshot.gpus.values()) == 2  # 20 GiB of memory: two 16 GiB GPUs
    assert plan(snapshot, anyone) == []


def test_a_move_across_nodes_needs_the_host_cpu_there() -> None:
    snapshot = cluster([100], [500], nodes=2)  # g0 on n0, g1 on n1
    snapshot.nodes["n1"].used_cpu = snapshot.nodes["n1"].cpu  # n1 is full

    (move,) = plan(snapshot, anyone)

    assert move.gpu == "g1"  # g0's pod cannot go to n1; g1's can come to n0


def test_real_time_mps_shares_never_land_beside_another_workload() -> None:
    snapshot = Ledger([Node("n0", cpu=64_000, memory=256 * GiB)])
    for index, owner in enumerate(["ml/a", "ml/b"]):
        snapshot.add_gpu(Gpu(f"g{index}", "n0", holder=f"cap-{index}"))
        request = Request(f"ml/p{index}", compute=200, owner=owner, exclusive=True)
        snapshot.assume(request, "n0", [f"g{index}"])

    assert plan(snapshot, anyone) == []


def test_of_equally_empty_gpus_the_one_alone_on_its_node_goes_first() -> None:
    # g0, g2 on n0 and g1 on n1 (round robin over two nodes), 300m each.
    snapshot = cluster([300], [300], [300], nodes=2)

    (move,) = plan(snapshot, anyone)

    assert (move.gpu, move.node) == ("g1", "n1")  # then n1 holds no GPU: it can go


def test_of_equally_good_targets_the_one_on_the_busiest_node_is_planned() -> None:
    # n0 holds g0, g2, g4 and n1 holds g1, g3, all 300m but g3 (200m): g3 goes, and its
    # share fits as well on g1 (n1) as on n0's GPUs; n0, which holds more, gets it.
    snapshot = cluster([300], [300], [300], [200], [300], nodes=2)

    move, *rest = plan(snapshot, anyone)  # then g1, n1's other GPU, onto n0 as well

    assert move.gpu == "g3"
    assert [m.gpu for m in rest] == ["g1"]
    assert snapshot.gpus[move.targets[0]].node == "n0"
