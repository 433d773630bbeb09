"""Placement that scores only the node states that could still win (cost bounds): the same
decisions as scoring every node, however the snapshot changes between decisions."""

import math
import random
from bisect import bisect_left
from collections.abc import Callable, Sequence

import pytest

from scheduler import memo as memo_module
from scheduler import placement as placement_module
from scheduler.fragmentation import DeepFragmentation, TaskType
from scheduler.ledger import Gpu, Ledger, Node, Request
from scheduler.memo import memo_of
from scheduler.placement import Placement, Scorer, place
from scheduler.score import FragmentationScorer, Weights, _take
from tests.scheduler.test_shared_answers import (
    MIX,
    OnItsOwn,
    cluster,
    node,
    outcome,
    pod,
    replay_side_by_side,
)

GiB = 2**30


def busy_cluster(rng: random.Random) -> list[Node]:
    """Nodes of mixed sizes and models, so that most are in a state of their own."""
    out = cluster()
    for i in range(24):
        out.append(node(f"m{i:02}", rng.choice([1, 2, 4, 8]), rng.choice(["A100", "T4"])))
    return out


@pytest.mark.parametrize(
    "weights",
    [
        pytest.param(Weights(), id="default"),
        pytest.param(Weights(deep=False), id="shallow"),
        pytest.param(Weights(host_memory=False), id="no-host-memory"),
        pytest.param(Weights(step=0.0), id="exact-deltas"),
    ],
)
@pytest.mark.parametrize("seed", range(2))
def test_bounded_search_decides_as_scoring_every_node_on_its_own(
    monkeypatch: pytest.MonkeyPatch, weights: Weights, seed: int
) -> None:
    monkeypatch.setattr(placement_module, "BOUND_FROM", 0)  # bound even a single new state
    replay_side_by_side(
        (Ledger(busy_cluster(random.Random(seed))), FragmentationScorer(MIX, weights)),
        (Ledger(busy_cluster(random.Random(seed))), OnItsOwn(FragmentationScorer(MIX, weights))),
        seed,
    )


def test_a_new_pod_shape_scores_few_of_many_node_states(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    nodes = [Node(f"n{i:03}", 16_000 + 500 * i, 64 * GiB) for i in range(120)]
    for n in nodes:
        n.gpus = [Gpu(f"{n.name}-gpu{g}", n.name, memory=40 * GiB, model="A100") for g in range(8)]
    snap = Ledger(nodes)
    scorer = FragmentationScorer(MIX)
    for step in range(200):  # fill the nodes unevenly
        request = pod(rng, step)
        placed = place(snap, request, scorer)
        if isinstance(placed, Placement):
            snap.assume(request, placed.node, placed.gpus)
    states = {memo_of(snap).state_of(n) for n in snap.nodes.values()}
    scored: list[str] = []
    choose = scorer.choose

    def counting(n: Node, r: Request, f: Sequence[Gpu]) -> tuple[float, tuple[Gpu, ...]] | None:
        scored.append(n.name)
        return choose(n, r, f)

    monkeypatch.setattr(scorer, "choose", counting)
    request = Request("ns/new", cpu=700, memory=GiB, compute=300, gpu_memory=GiB)

    placed = place(snap, request, scorer)

    assert placed == place(snap, request, OnItsOwn(FragmentationScorer(MIX)))
    assert len(states) > 60
    assert len(scored) < len(states) // 4, (len(scored), len(states))


def test_bounds_profiles_and_refusals_start_over_with_the_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(placement_module, "BOUND_FROM", 0)
    monkeypatch.setattr(memo_module, "ANSWER_LIMIT", 40)
    rng_a, rng_b = random.Random(3), random.Random(3)
    bounded, own = (
        Ledger(busy_cluster(random.Random(3))),
        Ledger(busy_cluster(random.Random(3))),
    )
    bounded_scorer, own_scorer = FragmentationScorer(MIX), OnItsOwn(FragmentationScorer(MIX))

    for step in range(300):
        request = pod(rng_a, step)
        pod(rng_b, step)
        a, b = place(bounded, request, bounded_scorer), place(own, request, own_scorer)
        assert outcome(a, bounded, request, bounded_scorer) == outcome(b, own, request, own_scorer)
        if isinstance(a, Placement):
            bounded.assume(request, a.node, a.gpus)
            own.assume(request, a.node, a.gpus)
        kept = (
            sum(map(len, memo_of(bounded)._answers.values()))
            + sum(map(len, memo_of(bounded)._bounds.values()))
            + len(memo_of(bounded)._profiles)
            + sum(map(len, memo_of(bounded)._refusals.values()))
        )
        assert kept <= 40 + 64 * 4 * len(bounded.nodes), step  # checked every 64 calls


def test_another_scorer_drops_the_bounds_and_profiles() -> None:
    snap = Ledger(busy_cluster(random.Random(1)))
    request = Request("ns/p", cpu=1000, compute=500, gpu_memory=GiB)
    place(snap, request, FragmentationScorer(MIX))
    assert memo_of(snap)._profiles or memo_of(snap)._bounds or memo_of(snap)._answers

    other = FragmentationScorer(MIX[1:])
    expected = place(Ledger(busy_cluster(random.Random(1))), request, OnItsOwn(other))

    assert place(snap, request, other) == expected


class Scripted(Scorer):
    """A by-state scorer whose costs and bounds are given per node name."""

    by_state = True
    generation = 0

    def __init__(self, costs: dict[str, float], bounds: dict[str, float]) -> None:
        self.costs, self.bounds = costs, bounds
        self.scored: list[str] = []

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        self.scored.append(node.name)
        return self.costs[node.name], tuple(fits[: request.gpus])

    def profile(self, node: Node, pool: str) -> object:
        return node.name

    def bounder(self, request: Request) -> Callable[[object], float]:
        return lambda name: self.bounds[str(name)]


def scripted_nodes() -> list[Node]:
    # Distinct CPU sizes: each node is in a state of its own.
    return [
        Node(name, cpu, 64 * GiB, gpus=[Gpu(f"{name}-g", name)])
        for name, cpu in (("a", 8000), ("b", 9000), ("c", 10_000))
    ]


def test_an_equal_cost_on_an_earlier_node_wins_although_scored_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(placement_module, "BOUND_FROM", 0)
    scorer = Scripted(costs={"a": 5.0, "b": 5.0, "c": 9.0}, bounds={"a": 5.0, "b": 0.0, "c": 6.0})

    placed = place(Ledger(scripted_nodes()), Request("ns/p", compute=500), scorer)

    assert isinstance(placed, Placement)
    assert placed.node == "a"
    assert scorer.scored == ["b", "a", "a"]  # c cannot win; the winner is scored again


def test_a_state_whose_bound_equals_the_best_at_a_later_node_is_not_scored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(placement_module, "BOUND_FROM", 0)
    scorer = Scripted(costs={"a": 5.0, "b": 5.0, "c": 5.0}, bounds={"a": 1.0, "b": 5.0, "c": 5.0})

    placed = place(Ledger(scripted_nodes()), Request("ns/p", compute=500), scorer)

    assert isinstance(placed, Placement)
    assert placed.node == "a"
    assert scorer.scored == ["a", "a"]


def test_kept_bounds_still_skip_states_on_the_next_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement_module, "BOUND_FROM", 0)
    scorer = Scripted(costs={"a": 1.0, "b": 5.0, "c": 5.0}, bounds={"a": 1.0, "b": 2.0, "c": 3.0})
    snap = Ledger(scripted_nodes())
    place(snap, Request("ns/p", compute=500), scorer)
    scorer.scored.clear()

    placed = place(snap, Request("ns/q", compute=500), scorer)

    assert isinstance(placed, Placement)
    assert placed.node == "a"
    assert scorer.scored == []  # b and c kept bounds that cannot win; a kept its answer


def _fill(rng: random.Random, n: Node, scorer: FragmentationScorer, most: int) -> None:
    """Place up to `most` random pods on the one node `n`."""
    snap = Ledger([n])
    for filler in range(rng.randint(0, most)):
        request = pod(rng, 1000 + filler)
        placed = place(snap, request, scorer)
        if isinstance(placed, Placement):
            snap.assume(request, placed.node, placed.gpus)


def _bound_holds(scorer: FragmentationScorer, n: Node, request: Request, index: int) -> bool:
    """Asserts the bound is at most the cost where the pod fits; False where it does not."""
    fits = [g for g in n.gpus if placement_module.gpu_rejects(g, request) is None]
    if placement_module.node_rejects(n, request) or len(fits) < request.gpus:
        return False
    chosen = scorer.choose(n, request, fits)
    bound = scorer.bounder(request)
    assert chosen is not None
    assert bound is not None
    assert bound(scorer.profile(n, request.pool)) <= chosen[0], index
    return True


@pytest.mark.parametrize("seed", range(6))
def test_the_bound_never_exceeds_the_cost(seed: int) -> None:
    rng = random.Random(seed)
    scorer = FragmentationScorer(MIX)
    for index in range(150):
        n = node("n", rng.choice([1, 2, 4, 8]), rng.choice(["A100", "T4"]))
        _fill(rng, n, scorer, 6)
        _bound_holds(scorer, n, pod(rng, index), index)


@pytest.mark.parametrize("seed", range(6))
def test_the_bound_never_exceeds_the_cost_when_cpu_runs_out(seed: int) -> None:
    """Nodes short of CPU and pods asking for much of it: task types stop fitting there
    (the measure counts CPU only as whether a type can run), and the bound must still
    stay at or below the cost."""
    rng = random.Random(seed)
    scorer = FragmentationScorer(MIX)
    checked = 0
    for index in range(200):
        n = Node("n", rng.choice([2500, 4000, 6000, 9000]), rng.choice([4, 64]) * GiB)
        model = rng.choice(["A100", "T4"])
        n.gpus = [
            Gpu(f"n-gpu{i}", "n", memory=40 * GiB, model=model)
            for i in range(rng.choice([1, 2, 4, 8]))
        ]
        _fill(rng, n, scorer, 4)
        gpus = rng.choice([0, 1, 1, 2])
        request = Request(
            f"ns/q{index}",
            cpu=rng.choice([500, 1500, 2500, 3500]),
            memory=rng.choice([1, 2]) * GiB,
            compute=rng.choice([200, 500, 1000]) if gpus == 1 else 1000 if gpus else 0,
            gpu_memory=GiB if gpus else 0,
            gpus=gpus,
        )
        checked += _bound_holds(scorer, n, request, index)
    assert checked > 50  # the draw above must reach the check


def test_no_bound_for_real_time_mps_pods_or_negative_weights() -> None:
    request = Request("ns/p", compute=500, exclusive=True, owner="ns/Deployment/x")
    assert FragmentationScorer(MIX).bounder(request) is None
    negative = (MIX[0], TaskType(cpu=1, compute=1000, gpus=1, weight=-0.1))
    assert FragmentationScorer(negative).bounder(Request("ns/q", compute=500)) is None


@pytest.mark.parametrize("seed", range(4))
def test_usable_after_taking_compute_matches_the_full_sum(seed: int) -> None:
    rng = random.Random(seed)
    deep = DeepFragmentation(MIX)
    for _ in range(300):
        free = tuple(
            sorted(
                (rng.choice([0, 100, 250, 500, 750, 1000]) for _ in range(rng.randint(1, 8))),
                reverse=True,
            )
        )
        model = rng.choice(["A100", "T4"])
        value = rng.choice(free)
        compute = rng.choice([0, 50, 250, 500, 1000])
        if compute > value:
            continue
        expected = deep.usable(model, _take(free, ((value, False),), compute))
        assert deep.usable_after(model, free, value, compute) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_host_losses_never_exceed_what_taking_cpu_or_memory_loses(seed: int) -> None:
    rng = random.Random(seed)
    deep = DeepFragmentation(MIX)
    for _ in range(300):
        free = [rng.choice([0, 100, 250, 500, 750, 1000]) for _ in range(rng.randint(1, 8))]
        model = rng.choice(["A100", "T4"])
        cpu = rng.randint(0, 20) * 500
        memory = rng.choice([None, GiB, 5 * GiB, 64 * GiB])
        cpu_losses, memory_losses = deep.host_losses(model, cpu, free, memory)
        take_cpu = rng.randint(0, cpu // 500) * 500
        take_memory = 0 if memory is None else rng.randint(0, memory // GiB) * GiB
        before = deep(model, cpu, free, memory)
        after = deep(model, cpu - take_cpu, free, None if memory is None else memory - take_memory)
        slacks, losses = cpu_losses
        floor = losses[bisect_left(slacks, take_cpu)]
        slacks, losses = memory_losses
        floor = max(floor, losses[bisect_left(slacks, take_memory)])
        assert after - before >= floor - 1e-9
        assert not math.isnan(floor)
