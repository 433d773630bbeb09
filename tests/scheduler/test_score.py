"""Scorers: fragmentation, the task mix, and which GPUs and nodes a pod is sent to."""

import pytest

from scheduler.fragmentation import Depth, TaskType, depth_of, fragmentation, task_mix
from scheduler.ledger import Gpu, Ledger, Node, Request
from scheduler.placement import Placement, place
from scheduler.score import FragmentationScorer, PackingScorer, Weights

GiB = 2**30


def node(name: str, *used: int, cpu: int = 32_000, model: str = "T4") -> Node:
    """A node whose GPUs have these used computes (0: idle)."""
    n = Node(name, cpu, 256 * GiB)
    n.gpus = [
        Gpu(f"{name}-gpu{i}", name, memory=16 * GiB, model=model, used_compute=u)
        for i, u in enumerate(used)
    ]
    for gpu in n.gpus:
        if gpu.used_compute:
            gpu.owners["ns/Deployment/other"] = 1
    return n


def pod(key: str, compute: int = 300, gpus: int = 1, cpu: int = 1000) -> Request:
    return Request(key, cpu=cpu, memory=GiB, compute=compute, gpus=gpus)


def decide(snapshot: Ledger, request: Request, scorer: FragmentationScorer) -> Placement:
    result = place(snapshot, request, scorer)
    assert isinstance(result, Placement), result
    return result


@pytest.mark.parametrize(
    ("mix", "free_cpu", "free", "expected"),
    [
        pytest.param([TaskType(0, 500, 1)], 8000, [1000, 400], 400, id="gpu-too-small"),
        pytest.param([TaskType(0, 500, 1)], 8000, [1000, 600], 0, id="all-usable"),
        pytest.param([TaskType(9000, 500, 1)], 8000, [1000, 600], 1600, id="lacks-cpu"),
        pytest.param([TaskType(0, 1000, 2)], 8000, [1000, 600], 1600, id="too-few-gpus"),
        pytest.param([TaskType(0, 0, 0)], 8000, [1000, 600], 1600, id="cpu-only-task"),
        pytest.param([TaskType(0, 500, 1, frozenset({"A10"}))], 8000, [1000], 1000, id="model"),
        pytest.param(
            [TaskType(0, 500, 1, weight=0.5), TaskType(0, 1000, 1, weight=0.5)],
            8000,
            [1000, 600],
            300,
            id="popularity-weighted",
        ),
        pytest.param([TaskType(0, 500, 1)], 8000, [0, 0], 0, id="no-idle-gpu"),
    ],
)
def test_fragmentation_is_the_idle_gpu_the_typical_pods_cannot_use(
    mix: list[TaskType], free_cpu: int, free: list[int], expected: float
) -> None:
    assert fragmentation(mix, "T4", free_cpu, free) == pytest.approx(expected)


def test_deep_fragmentation_counts_what_filling_the_node_would_leave() -> None:
    mix = [TaskType(0, 400, 1)]
    depth = Depth(partial=0.6, whole=0.6)

    def usable(filled: int) -> float:  # FGD counts all 1600: both GPUs have room for 400
        return depth.partial * filled + (1 - depth.partial) * 1600

    def deep(mix: list[TaskType], free_memory: int | None = None, cpu: int = 8000) -> float:
        return fragmentation(mix, "T4", cpu, [1000, 600], free_memory, deep=True, depth=depth)

    # Filled with 400s: two on the idle GPU, one on the 600 GPU, 1200 used.
    assert deep(mix) == pytest.approx(1600 - usable(1200))
    # Host memory for only one such pod: 400 filled.
    assert deep([TaskType(0, 400, 1, memory=GiB)], GiB) == pytest.approx(1600 - usable(400))
    # CPU only decides whether the type runs at all: enough for one pod counts as room.
    assert deep([TaskType(5000, 400, 1)]) == pytest.approx(1600 - usable(1200))
    assert deep([TaskType(9000, 400, 1)]) == 1600


@pytest.mark.parametrize(
    ("mix", "expected"),
    [
        pytest.param([TaskType(0, 1000, 1)], Depth(1.0, 0.0), id="whole-gpus-only"),
        pytest.param([TaskType(0, 400, 1)], Depth(0.0, 0.0), id="shares-only"),
        pytest.param(
            [
                TaskType(0, 500, 1, weight=0.4),
                TaskType(0, 1000, 1, weight=0.4),
                TaskType(0, 1000, 4, weight=0.2),
            ],
            Depth(0.6, 0.2),  # by popularity, not by GPUs asked
            id="partial-and-whole",
        ),
        pytest.param(
            [
                TaskType(0, 500, 1, weight=0.25),
                TaskType(0, 1000, 1, weight=0.25),
                TaskType(4000, 0, 0, weight=0.5),
            ],
            Depth(0.5, 0.0),
            id="cpu-only-pods-are-no-gpu-pods",
        ),
        pytest.param([TaskType(4000, 0, 0)], Depth(1.0, 1.0), id="no-gpu-pods"),
    ],
)
def test_depth_is_the_chance_the_next_gpu_pod_cannot_use_what_a_type_leaves(
    mix: list[TaskType], expected: Depth
) -> None:
    depth = depth_of(mix)
    assert (depth.partial, depth.whole) == pytest.approx((expected.partial, expected.whole))


def test_a_multi_gpu_type_loses_the_gpus_short_of_a_set_as_multi_gpu_pods_weigh() -> None:
    """Three idle GPUs for a 2-GPU type: one set, one GPU over. Single-GPU pods can use
    that GPU; with 2-GPU pods half of the GPU pods, half of it counts as lost."""
    mix = [TaskType(0, 1000, 2, weight=0.5), TaskType(0, 1000, 1, weight=0.5)]
    assert depth_of(mix).whole == pytest.approx(0.5)
    pairs = mix[:1]  # the 2-GPU type alone, at its popularity in the mix
    left = fragmentation(pairs, "T4", 8000, [1000, 1000, 1000], deep=True, depth=depth_of(mix))
    assert left == pytest.approx((3000 - (0.5 * 2000 + 0.5 * 3000)) / 2)


@pytest.mark.parametrize("deep", [False, True], ids=["shallow", "deep"])
def test_prefers_the_gpu_whose_leftover_the_typical_pods_can_use(deep: bool) -> None:
    # Free 600 and 500: a 100 pod on the 600 GPU leaves 500, which the 500 type uses.
    snap = Ledger([node("a", 400, 500)])
    scorer = FragmentationScorer([TaskType(0, 500, 1)], Weights(deep=deep))

    placement = decide(snap, pod("ns/p", 100), scorer)

    assert placement.gpus == ("a-gpu0",)


def test_prefers_a_used_gpu_over_an_idle_one() -> None:
    snap = Ledger([node("a", 0, 700)])
    scorer = FragmentationScorer([TaskType(0, 300, 1)])

    placement = decide(snap, pod("ns/p", 300), scorer)

    assert placement.gpus == ("a-gpu1",)


def test_prefers_a_node_already_in_use() -> None:
    idle, busy = node("a", 0, 0), node("b", 0, 0)
    snap = Ledger([idle, busy])
    snap.assume(pod("other/web", gpus=0, compute=0), "b", ())
    scorer = FragmentationScorer([TaskType(0, 1000, 1)])

    placement = decide(snap, pod("ns/p", 1000), scorer)

    assert placement.node == "b"


def test_whole_gpu_pods_keep_a_whole_node_free_for_multi_gpu_pods() -> None:
    snap = Ledger([node("a", 0, 0, 0, 0), node("b", 0, 0, 500, 500)])
    scorer = FragmentationScorer(
        [TaskType(0, 1000, 4, weight=0.5), TaskType(0, 1000, 1, weight=0.5)]
    )

    placement = decide(snap, pod("ns/p", 1000), scorer)

    assert placement.node == "b"


def test_a_cpu_only_pod_takes_no_gpu() -> None:
    snap = Ledger([node("a", 0, 0)])
    scorer = FragmentationScorer([TaskType(0, 500, 1)])

    placement = decide(snap, pod("ns/cpu", compute=0, gpus=0), scorer)

    assert placement.gpus == ()
    snap.assume(pod("ns/cpu", compute=0, gpus=0), placement.node, placement.gpus)
    assert snap.nodes["a"].used_cpu == 1000


def test_a_cpu_only_pod_avoids_starving_the_gpus_of_cpu() -> None:
    # On "small" the pod would leave too little CPU for the typical GPU pod.
    snap = Ledger([node("small", 0, cpu=4000), node("large", 0, cpu=32_000)])
    scorer = FragmentationScorer([TaskType(3000, 1000, 1)])

    placement = decide(snap, pod("ns/cpu", compute=0, gpus=0, cpu=2000), scorer)

    assert placement.node == "large"


def test_a_multi_gpu_pod_takes_distinct_gpus() -> None:
    snap = Ledger([node("a", 0, 900, 0, 0)])
    scorer = FragmentationScorer([TaskType(0, 1000, 1)])

    placement = decide(snap, pod("ns/p", 1000, gpus=2), scorer)

    assert len(set(placement.gpus)) == 2
    assert "a-gpu1" not in placement.gpus


def test_respects_the_gpus_placement_filtered_out() -> None:
    # gpu0 has compute to spare but no memory left: placement never offers it.
    n = node("a", 500, 0)
    n.gpus[0].used_memory = n.gpus[0].memory
    snap = Ledger([n])
    scorer = FragmentationScorer([TaskType(0, 500, 1)])

    placement = decide(snap, Request("ns/p", compute=500, gpu_memory=GiB), scorer)

    assert placement.gpus == ("a-gpu1",)


def test_equal_nodes_share_one_cached_answer_and_a_new_mix_changes_the_generation() -> None:
    snap = Ledger([node(f"n{i}", 0, 0) for i in range(3)])
    scorer = FragmentationScorer([TaskType(0, 500, 1)])
    decide(snap, pod("ns/p", 500), scorer)
    before = scorer.generation

    scorer.set_mix([TaskType(0, 250, 1)])

    assert scorer.generation == before + 1
    assert scorer.mix == (TaskType(0, 250, 1),)


def test_task_mix_takes_the_most_frequent_specs_covering_95_percent() -> None:
    requests = [
        *(pod(f"ns/a{i}", 500) for i in range(50)),
        *(pod(f"ns/b{i}", 1000) for i in range(30)),
        *(pod(f"ns/c{i}", 0, gpus=0) for i in range(15)),
        *(pod(f"ns/d{i}", 250) for i in range(4)),
        pod("ns/e", 100),
    ]

    mix = task_mix(requests)

    assert [(t.compute, t.gpus) for t in mix] == [(500, 1), (1000, 1), (0, 0)]
    assert [t.weight for t in mix] == pytest.approx([50 / 95, 30 / 95, 15 / 95])
    assert mix[0].memory == GiB


def test_task_mix_of_nothing_is_empty() -> None:
    assert task_mix([]) == ()


@pytest.mark.parametrize(
    ("request_", "gpus"),
    [
        pytest.param(pod("ns/cpu", compute=0, gpus=0), (), id="cpu-only"),
        pytest.param(pod("ns/p", 300), ("a-gpu1",), id="best-fit"),
    ],
)
def test_packing_scorer_handles_cpu_only_and_fractional_pods(
    request_: Request, gpus: tuple[str, ...]
) -> None:
    snap = Ledger([node("a", 0, 600)])

    result = place(snap, request_, PackingScorer())

    assert isinstance(result, Placement)
    assert result.gpus == gpus
