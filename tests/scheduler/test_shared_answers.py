"""Answers shared between nodes in equal state: the same decisions as scoring every node
on its own, however the snapshot changes between decisions."""

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import cast

import pytest

from scheduler import memo as memo_module
from scheduler import state_index as state_index_module
from scheduler.fragmentation import DeepFragmentation, TaskType, fragmentation
from scheduler.ledger import Gpu, Ledger, Node, Request
from scheduler.placement import (
    Placement,
    Scorer,
    Unfit,
    gpu_rejects,
    place,
    refusal,
    refusals,
    why_unfit,
)
from scheduler.score import FragmentationScorer, PackingScorer, Weights

GiB = 2**30
MIX = (
    TaskType(cpu=1000, compute=500, gpus=1, weight=0.4, memory=2 * GiB),
    TaskType(cpu=2000, compute=1000, gpus=1, weight=0.3),
    TaskType(cpu=4000, compute=1000, gpus=2, weight=0.2, models=frozenset({"A100"})),
    TaskType(cpu=500, compute=0, gpus=0, weight=0.1),
)


class OnItsOwn(Scorer):
    """The same scorer, without `by_state`: placement scores every node on its own."""

    def __init__(self, inner: FragmentationScorer | PackingScorer) -> None:
        self.inner = inner

    @property
    def generation(self) -> int:
        return self.inner.generation

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        return self.inner.choose(node, request, fits)


def node(name: str, gpus: int = 4, model: str = "A100", **kw: object) -> Node:
    n = Node(name, 16_000, 64 * GiB, **kw)  # type: ignore[arg-type]
    n.gpus = [Gpu(f"{name}-gpu{i}", name, memory=40 * GiB, model=model) for i in range(gpus)]
    return n


def cluster() -> list[Node]:
    return [node(f"n{i:02}", 2 + i % 3, "A100" if i % 4 else "T4") for i in range(12)]


def pod(rng: random.Random, index: int) -> Request:
    gpus = rng.choice([0, 1, 1, 1, 2])
    return Request(
        f"ns/p{index}",
        cpu=rng.choice([500, 1000, 2000]),
        memory=rng.choice([1, 2]) * GiB,
        compute=rng.choice([200, 500, 1000]) if gpus == 1 else 1000 if gpus else 0,
        gpu_memory=GiB if gpus else 0,
        gpus=gpus,
    )


def outcome(result: Placement | Unfit, snap: Ledger, request: Request, scorer: Scorer) -> object:
    """The placement, or that the pod fits nowhere, whether a GPU coming could take it,
    and why each node refuses it."""
    if isinstance(result, Placement):
        return result
    return result.coming, why_unfit(snap, request, scorer).counts


def churn(snap: Ledger, rng: random.Random, step: int) -> None:
    """What a real cluster does between decisions: pods leave, nodes and GPUs come and go,
    labels change."""
    roll = rng.random()
    if roll < 0.2 and snap.bookings:
        snap.forget(rng.choice(sorted(snap.bookings)))
    elif roll < 0.23 and len(snap.nodes) > 3:
        snap.remove_node(rng.choice(sorted(snap.nodes)))
    elif roll < 0.26:
        snap.add_node(node(f"new{step}", rng.choice([1, 4])))
    elif roll < 0.29:
        name = rng.choice(sorted(snap.nodes))
        old = snap.nodes[name]
        snap.add_node(Node(name, old.cpu, old.memory, schedulable=rng.random() < 0.7))
    elif roll < 0.32:
        name = rng.choice(sorted(snap.nodes))
        snap.add_gpu(Gpu(f"{name}-extra{step}", name, memory=40 * GiB, model="A100"))
    elif roll < 0.35 and snap.gpus:
        snap.remove_gpu(rng.choice(sorted(snap.gpus)))


def feasible(snap: Ledger, rng: random.Random) -> list[str] | None:
    """What kube-scheduler might pass: every node, all but a few, or a few."""
    names = sorted(snap.nodes)
    roll = rng.random()
    if roll < 0.4:
        return None
    if roll < 0.8:
        return [n for n in names if rng.random() < 0.85]
    return rng.sample(names, min(len(names), rng.choice([1, 2, 3])))


def replay_side_by_side(
    fast: tuple[Ledger, Scorer],
    reference: tuple[Ledger, Scorer],
    seed: int,
    steps: int = 300,
    feasible_nodes: bool = False,
) -> None:
    """Place the same random pods on two equal snapshots, churning both alike, and
    assert every decision (or its refusal) is the same; with `feasible_nodes`, each
    decision may only use the nodes a random draw allows (`feasible`)."""
    rng_a, rng_b = random.Random(seed), random.Random(seed)
    (a_snap, a_scorer), (b_snap, b_scorer) = fast, reference
    draw = random.Random(seed + 1000)
    for step in range(steps):
        request = pod(rng_a, step)
        assert pod(rng_b, step) == request
        nodes = feasible(a_snap, draw) if feasible_nodes else None
        a = place(a_snap, request, a_scorer, nodes)
        b = place(b_snap, request, b_scorer, nodes)
        assert outcome(a, a_snap, request, a_scorer) == outcome(b, b_snap, request, b_scorer), step
        if isinstance(a, Placement):
            a_snap.assume(request, a.node, a.gpus)
            b_snap.assume(request, a.node, a.gpus)
        churn(a_snap, rng_a, step)
        churn(b_snap, rng_b, step)


@pytest.mark.parametrize("make", [FragmentationScorer, PackingScorer], ids=["fgd", "packing"])
@pytest.mark.parametrize("seed", range(4))
def test_shared_answers_decide_as_scoring_every_node_on_its_own(make: type, seed: int) -> None:
    shared_scorer = make(MIX) if make is FragmentationScorer else make()
    own_scorer = OnItsOwn(make(MIX) if make is FragmentationScorer else make())
    replay_side_by_side((Ledger(cluster()), shared_scorer), (Ledger(cluster()), own_scorer), seed)


@pytest.mark.parametrize("make", [FragmentationScorer, PackingScorer], ids=["fgd", "packing"])
@pytest.mark.parametrize("seed", range(4))
def test_shared_answers_decide_as_scoring_every_node_on_its_own_among_feasible_nodes(
    make: type, seed: int
) -> None:
    """kube-scheduler passes a different set of feasible nodes with each pod: a state
    whose first node is not among them competes at its first node that is."""
    shared_scorer = make(MIX) if make is FragmentationScorer else make()
    own_scorer = OnItsOwn(make(MIX) if make is FragmentationScorer else make())
    replay_side_by_side(
        (Ledger(cluster()), shared_scorer),
        (Ledger(cluster()), own_scorer),
        seed,
        feasible_nodes=True,
    )


@pytest.mark.parametrize("seed", range(4))
def test_refusals_per_state_read_as_each_node_asked_on_its_own(seed: int) -> None:
    """The extender's reasons for a pod that fits nowhere, worked out once per node
    state, are each node's own reason, as nodes fill, change and come and go, GPUs start,
    fail, drain or are held by a real-time-mps workload (whose pods are asked node by
    node: the state leaves out which workload a GPU holds)."""
    rng = random.Random(seed)
    # Nodes alike, so that many share a state.
    snap, scorer = Ledger([node(f"n{i:02}", 2) for i in range(12)]), FragmentationScorer(MIX)
    flags = ("coming", "healthy", "draining", "removing")
    shared = 0
    for step in range(300):
        exclusive = rng.random() < 0.15
        request = replace(pod(rng, step), exclusive=exclusive, owner=f"ns/Job/w{step % 3}")
        result = place(snap, request, scorer)
        if isinstance(result, Placement):
            snap.assume(request, result.node, result.gpus)
        asked = [*rng.sample(sorted(snap.nodes), k=max(1, len(snap.nodes) // 2)), "gone"]
        assert refusals(snap, request, asked) == {n: refusal(snap, request, n) for n in asked}
        states = {memo_module.memo_of(snap).state_of(snap.nodes[n]) for n in asked[:-1]}
        shared += len(asked) - 1 - len(states)
        churn(snap, rng, step)
        if snap.gpus and rng.random() < 0.2:
            old = snap.gpus[rng.choice(sorted(snap.gpus))]
            flag = rng.choice(flags)
            changed = Gpu(old.uuid, old.node, memory=old.memory, model=old.model)
            setattr(changed, flag, not getattr(changed, flag))
            snap.add_gpu(changed)
    assert shared >= 30  # nodes did share states: the memo was used


def test_refusals_of_a_real_time_mps_pod_read_which_workloads_a_gpu_holds() -> None:
    """Two nodes in equal state, one GPU each, holding pods of different workloads: a
    real-time-mps pod of the first may share its GPU, not the second's."""
    snap = Ledger([node("a", 1), node("b", 1)])
    for name, owner in (("a", "ns/Job/first"), ("b", "ns/Job/second")):
        held = Request(f"ns/{name}", cpu=500, compute=200, gpu_memory=GiB, owner=owner)
        snap.assume(held, name, (f"{name}-gpu0",))
    memo = memo_module.memo_of(snap)
    assert memo.state_of(snap.nodes["a"]) == memo.state_of(snap.nodes["b"])
    request = Request("ns/mps", cpu=500, compute=200, gpu_memory=GiB, owner="ns/Job/first")
    mps = replace(request, exclusive=True)

    assert refusals(snap, mps, ["a", "b"]) == {
        "a": "fits, but another node was chosen",
        "b": "GPU shared with other workloads (real-time-mps needs its own)",
    }
    assert refusals(snap, request, ["a", "b"]) == dict.fromkeys(
        ["a", "b"], "fits, but another node was chosen"
    )


def test_place_after_forget_is_the_same_as_on_a_fresh_snapshot() -> None:
    scorer = FragmentationScorer(MIX)
    snap, fresh = Ledger(cluster()), Ledger(cluster())
    first = Request("ns/first", cpu=1000, compute=500, gpu_memory=GiB)
    placed = place(snap, first, scorer)
    assert isinstance(placed, Placement)
    snap.assume(first, placed.node, placed.gpus)
    place(snap, Request("ns/other", cpu=1000, compute=500, gpu_memory=GiB), scorer)

    snap.forget("ns/first")

    again = Request("ns/again", cpu=1000, compute=500, gpu_memory=GiB)
    assert place(snap, again, scorer) == place(fresh, again, FragmentationScorer(MIX))


def test_a_removed_node_is_never_chosen() -> None:
    scorer = FragmentationScorer(MIX)
    snap = Ledger([node("a", 1), node("b", 1)])
    request = Request("ns/p", cpu=1000, compute=500, gpu_memory=GiB)
    first = place(snap, request, scorer)
    assert isinstance(first, Placement)

    snap.remove_node(first.node)

    second = place(snap, request, scorer)
    assert isinstance(second, Placement)
    assert second.node != first.node
    snap.remove_node(second.node)
    assert isinstance(place(snap, request, scorer), Unfit)


def test_an_added_gpu_becomes_choosable() -> None:
    scorer = FragmentationScorer(MIX)
    snap = Ledger([node("a", 0)])
    request = Request("ns/p", cpu=1000, compute=500, gpu_memory=GiB)
    assert isinstance(place(snap, request, scorer), Unfit)

    snap.add_gpu(Gpu("a-gpu9", "a", memory=40 * GiB, model="A100"))

    placed = place(snap, request, scorer)
    assert isinstance(placed, Placement)
    assert (placed.node, placed.gpus) == ("a", ("a-gpu9",))


def test_a_node_made_unschedulable_by_a_label_change_is_not_chosen() -> None:
    scorer = FragmentationScorer(MIX)
    snap = Ledger([node("a", 2), node("b", 2)])
    request = Request("ns/p", cpu=1000, compute=500, gpu_memory=GiB)
    assert place(snap, request, scorer) == place(snap, request, scorer)  # warm: the same
    first = place(snap, request, scorer)
    assert isinstance(first, Placement)

    snap.add_node(Node(first.node, 16_000, 64 * GiB, schedulable=False))

    second = place(snap, request, scorer)
    assert isinstance(second, Placement)
    assert second.node != first.node


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param({"SHAPE_LIMIT": 3, "STATE_LIMIT": 5, "ANSWER_LIMIT": 10}, id="tiny-tables"),
        pytest.param({"ANSWER_LIMIT": 60}, id="least-used-shapes-dropped"),
        pytest.param({"LOG_MIN": 0, "DEAD_BATCH": 1}, id="short-log-dead-states-forgotten"),
    ],
)
def test_shape_and_state_tables_that_start_over_keep_decisions(
    monkeypatch: pytest.MonkeyPatch, limits: dict[str, int]
) -> None:
    """Every bound on what placement keeps (shapes, states, answers, the log of new
    states, what is kept of states no node is in) changes no decision."""
    for name, value in limits.items():
        module = state_index_module if name == "LOG_MIN" else memo_module
        monkeypatch.setattr(module, name, value)
    rng_a, rng_b = random.Random(7), random.Random(7)
    shared, own = Ledger(cluster()), Ledger(cluster())
    shared_scorer, own_scorer = FragmentationScorer(MIX), OnItsOwn(FragmentationScorer(MIX))

    for step in range(200):
        request = pod(rng_a, step)
        pod(rng_b, step)
        a, b = place(shared, request, shared_scorer), place(own, request, own_scorer)
        assert outcome(a, shared, request, shared_scorer) == outcome(b, own, request, own_scorer)
        if isinstance(a, Placement):
            shared.assume(request, a.node, a.gpus)
            own.assume(request, a.node, a.gpus)


@pytest.mark.parametrize("gone_min", [1, 4_096])
def test_a_shape_forgets_the_states_no_node_is_in_and_keeps_every_live_one(
    monkeypatch: pytest.MonkeyPatch, gone_min: int
) -> None:
    """What a shape keeps of a state no node is in any more goes when the shape is used
    next (from the log of gone states, or, once the log dropped what it had not read, by
    looking at each state); what it keeps of a live state stays, also of a state that went
    and came back (it keeps its number)."""
    monkeypatch.setattr(memo_module, "DEAD_BATCH", 1)
    monkeypatch.setattr(memo_module, "GONE_MIN", gone_min)
    rng = random.Random(11)
    snap, scorer = Ledger(cluster()), FragmentationScorer(MIX)
    memo = memo_module.memo_of(snap)
    requests = [pod(rng, step) for step in range(6)]
    kept_live = 0
    for step in range(300):
        request = requests[step % len(requests)]
        placed = place(snap, request, scorer)
        if isinstance(placed, Placement) and rng.random() < 0.6:
            snap.assume(replace(request, key=f"ns/s{step}"), placed.node, placed.gpus)
        churn(snap, rng, step)
        index = memo.states()  # what changed is in the index, the states gone are logged
        shape = memo.shape_of(requests[(step + 1) % len(requests)])
        frontier = memo.frontier(shape)
        before: dict[str, Mapping[int, object]] = {
            name: dict(table)
            for name, table in (
                ("answers", memo._answers.get(shape, {})),
                ("bounds", memo._bounds.get(shape, {})),
                ("frontier", frontier.current),
            )
        }
        memo.answers(shape)
        after: dict[str, Mapping[int, object]] = {
            "answers": memo._answers.get(shape, {}),
            "bounds": memo._bounds.get(shape, {}),
            "frontier": frontier.current,
        }
        for name, table in after.items():
            assert all(index.members(state) is not None for state in table), name
            live = {s: v for s, v in before[name].items() if index.members(s) is not None}
            assert table == live, name
            kept_live += len(live)
    assert kept_live > 0


@pytest.mark.parametrize("seed", range(3))
def test_what_a_node_derives_for_placement_is_never_stale(seed: int) -> None:
    """What placement and the scorer keep per version of a node (the GPUs a GPU demand
    may take and the scorer's view of them, a pool's model and free compute) is what the
    node says now, after every booking, release and change of nodes and GPUs."""
    rng = random.Random(seed)
    snap, scorer = Ledger(cluster()), FragmentationScorer(MIX)
    checked = 0
    for step in range(200):
        request = pod(rng, step)
        placed = place(snap, request, scorer, feasible(snap, rng))
        if isinstance(placed, Placement):
            snap.assume(request, placed.node, placed.gpus)
        churn(snap, rng, step)
        for n in snap.nodes.values():
            for key, value in n.derived.items():
                if key[0] == "pool side":
                    pooled = [g for g in n.gpus if g.pool == key[1] and not g.coming]
                    free = tuple(sorted((g.free_compute for g in pooled), reverse=True))
                    assert value == (pooled[0].model if pooled else "", free, pooled), key
                    checked += 1
                    continue
                demand = cast("tuple[object, ...]", key[1])
                fits = [g for g in n.gpus if gpu_rejects(g, _demanding(demand)) is None]
                if key[0] == "fit slots":
                    assert value == tuple(sorted((g.free_compute, g.pods > 0) for g in fits)), key
                else:
                    assert key[0] == "fits", key
                    assert value == fits, key
                checked += 1
    assert checked > 0


def _demanding(demand: tuple[object, ...]) -> Request:
    """A pod with this GPU demand (`Request.gpu_demand`)."""
    pool, models, compute, gpu_memory, exclusive, owner = demand
    return Request(
        "ns/check",
        compute=cast(int, compute),
        gpu_memory=cast(int, gpu_memory),
        pool=cast(str, pool),
        models=cast("frozenset[str] | None", models),
        exclusive=cast(bool, exclusive),
        owner=cast(str, owner),
    )


def test_a_new_task_mix_changes_shared_answers() -> None:
    scorer = FragmentationScorer(MIX)
    snap = Ledger(cluster())
    request = Request("ns/p", cpu=1000, compute=500, gpu_memory=GiB)
    place(snap, request, scorer)

    scorer.set_mix(MIX[1:])

    assert place(snap, request, scorer) == place(Ledger(cluster()), request, scorer)


@pytest.mark.parametrize("seed", range(5))
def test_fast_deep_fragmentation_is_bit_identical(seed: int) -> None:
    rng = random.Random(seed)
    fast = DeepFragmentation(MIX)
    for _ in range(500):
        free = [rng.choice([0, 100, 250, 500, 750, 1000]) for _ in range(rng.randint(0, 8))]
        cpu = rng.randint(0, 20) * 500
        memory = rng.choice([None, 0, GiB, 5 * GiB, 64 * GiB])
        model = rng.choice(["A100", "T4"])
        expected = fragmentation(MIX, model, cpu, free, memory, deep=True)
        assert fast(model, cpu, free, memory) == expected


def test_shallow_fragmentation_is_still_supported() -> None:
    scorer = FragmentationScorer(MIX, Weights(deep=False))
    snap = Ledger(cluster())
    request = Request("ns/p", cpu=1000, compute=500, gpu_memory=GiB)

    assert place(snap, request, scorer) == place(
        Ledger(cluster()), request, OnItsOwn(FragmentationScorer(MIX, Weights(deep=False)))
    )
