"""Which node relocation empties: the pool's sparsest, when all its GPUs' shares fit on
nodes the pool already uses, on held GPUs or on whole GPUs nobody holds there."""

from collections.abc import Callable, Collection, Mapping

from scheduler.consolidation import Move
from scheduler.ledger import Booking, Gpu, Ledger, Node, Request
from scheduler.relocation import NEW_GPU, Whole, describe, relocate

GiB = 2**30


def cluster(layout: Mapping[str, list[list[int]]]) -> Ledger:
    """Nodes by name, each a list of GPUs, each a list of its pods' compute."""
    snapshot = Ledger([Node(n, cpu=64_000, memory=256 * GiB, max_pods=110) for n in layout])
    for node, gpus in layout.items():
        for index, loads in enumerate(gpus):
            uuid = f"{node}-g{index}"
            snapshot.add_gpu(Gpu(uuid, node, memory=80 * GiB, holder=f"cap-{uuid}"))
            for n, compute in enumerate(loads):
                key = f"ml/{uuid}-p{n}"
                request = Request(key, cpu=100, compute=compute, owner=f"ml/w-{uuid}-{n}")
                snapshot.assume(request, node, [uuid])
    return snapshot


def whole(free: Mapping[str, int], foreign: Collection[str]) -> Callable[[], Whole]:
    return lambda: (free, foreign)


def anyone(booking: Booking, gpu: Gpu) -> str | None:
    return None


def test_a_sparse_node_moves_onto_free_gpus_of_a_node_the_pool_uses() -> None:
    """`lone` holds one GPU of 600m; `busy` holds three GPUs too full to take it, and five
    whole GPUs nobody holds: the share goes to a new GPU there, and `lone` can go."""
    snapshot = cluster({"lone": [[600]], "busy": [[700], [800], [900]]})

    (move,) = relocate(snapshot, anyone, whole({"lone": 7, "busy": 5}, ()))

    assert (move.gpu, move.node, move.targets) == ("lone-g0", "lone", (NEW_GPU + "busy",))
    assert move.node_gpus == 1
    assert "node lone holds only 1 GPU(s)" in move.reason
    assert describe(move.targets[0]).startswith("a new GPU on node busy")


def test_shares_that_fit_on_held_gpus_elsewhere_go_there() -> None:
    snapshot = cluster({"lone": [[200], [100]], "busy": [[700], [800], [500]]})

    moves = relocate(snapshot, anyone, whole({"lone": 6, "busy": 0}, ()))

    assert sorted(m.gpu for m in moves) == ["lone-g0", "lone-g1"]
    assert all(not t.startswith(NEW_GPU) for m in moves for t in m.targets)
    assert {snapshot.gpus[t].node for m in moves for t in m.targets} == {"busy"}


def test_nothing_moves_where_no_node_has_room_or_a_free_gpu() -> None:
    snapshot = cluster({"lone": [[600]], "busy": [[700], [800], [900]]})
    assert relocate(snapshot, anyone, whole({"lone": 7, "busy": 0}, ())) == []


def test_a_node_another_workload_holds_a_gpu_on_stays() -> None:
    snapshot = cluster({"lone": [[600]], "busy": [[700], [800], [900]]})
    assert relocate(snapshot, anyone, whole({"lone": 6, "busy": 5}, {"lone"})) == []


def test_a_node_whose_pods_may_not_move_stays() -> None:
    snapshot = cluster({"lone": [[600]], "busy": [[700], [800], [900]]})

    def refuses(booking: Booking, gpu: Gpu) -> str | None:
        return "policy training: consolidation Off"

    assert relocate(snapshot, refuses, whole({"lone": 7, "busy": 5}, ())) == []


def test_a_node_is_never_moved_onto_a_sparser_one() -> None:
    """`a` holds two GPUs and `b` one: `b` moves to `a`, never `a` to `b`."""
    snapshot = cluster({"a": [[700], [800]], "b": [[600]]})
    planned: list[Move] = []

    moves = relocate(snapshot, anyone, whole({"a": 6, "b": 7}, ()), planned=planned.append)

    assert [(m.node, m.targets) for m in moves] == [("b", (NEW_GPU + "a",))]
    assert planned == moves


def test_a_node_with_a_gpu_draining_or_coming_waits() -> None:
    snapshot = cluster({"lone": [[600], [300]], "busy": [[700], [800], [900]]})
    snapshot.gpus["lone-g1"].draining = True
    assert relocate(snapshot, anyone, whole({"lone": 6, "busy": 5}, ())) == []


def test_a_busy_pool_is_left_alone() -> None:
    snapshot = cluster({"lone": [[600]], "busy": [[700], [800], [900]]})
    assert relocate(snapshot, anyone, whole({"lone": 7, "busy": 5}, ()), busy={""}) == []


def test_the_pods_are_scanned_for_free_gpus_only_when_a_node_is_worth_emptying() -> None:
    def scan() -> Whole:
        raise AssertionError("every pod scanned in a round with nothing to relocate")

    one_node = cluster({"busy": [[700], [800]]})
    assert relocate(one_node, anyone, scan) == []

    def refuses(booking: Booking, gpu: Gpu) -> str | None:
        return "policy training: consolidation Off"

    two_nodes = cluster({"lone": [[600]], "busy": [[700], [800], [900]]})
    assert relocate(two_nodes, refuses, scan) == []
