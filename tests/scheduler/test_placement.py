"""The placement core: filter, score, and why a pod fits nowhere."""

import pytest

from scheduler.ledger import Gpu, Ledger, Node, Request
from scheduler.placement import Placement, Unfit, place, refusal, why_unfit
from scheduler.score import PackingScorer

GiB = 2**30


def node(
    name: str, gpus: int = 2, *, cpu: int = 8000, memory: int = 64 * GiB, **kw: object
) -> Node:
    n = Node(name, cpu, memory, **kw)  # type: ignore[arg-type]
    n.gpus = [
        Gpu(f"{name}-gpu{i}", name, memory=40 * GiB, holder=f"cap-{name}-{i}") for i in range(gpus)
    ]
    return n


def pod(key: str, compute: int = 300, **kw: object) -> Request:
    return Request(key, cpu=100, memory=GiB, compute=compute, gpu_memory=4 * GiB, **kw)  # type: ignore[arg-type]


def fill(snapshot: Ledger, *requests: Request) -> list[Placement]:
    out = []
    for r in requests:
        p = place(snapshot, r, PackingScorer())
        assert isinstance(p, Placement), p
        snapshot.assume(r, p.node, p.gpus)
        out.append(p)
    return out


def test_nine_300m_pods_pack_onto_three_gpus() -> None:
    snap = Ledger([node("a", 4), node("b", 4)])

    placements = fill(snap, *(pod(f"ns/p{i}") for i in range(9)))

    used = {p.gpus[0] for p in placements}
    assert len(used) == 3
    assert all(snap.gpus[u].used_compute == 900 for u in used)


def test_a_partly_used_gpu_is_preferred_over_an_empty_one() -> None:
    snap = Ledger([node("a", 1), node("b", 1)])
    fill(snap, pod("ns/first", 500))
    first_node = next(iter(snap.bookings.values())).node

    (second,) = fill(snap, pod("ns/second", 400))

    assert second.node == first_node


def test_gpu_memory_is_a_second_dimension() -> None:
    snap = Ledger([node("a", 1)])
    fill(snap, Request("ns/big", compute=100, gpu_memory=38 * GiB))

    request = Request("ns/next", compute=100, gpu_memory=4 * GiB)
    result = place(snap, request, PackingScorer())

    assert isinstance(result, Unfit)
    assert why_unfit(snap, request, PackingScorer()).counts == (("insufficient GPU memory", 1),)


def test_host_cpu_counts_every_pod_on_the_node() -> None:
    snap = Ledger([node("a", 1, cpu=1000)])
    snap.assume(Request("other/web", cpu=950, gpus=0), "a", ())

    result = place(snap, pod("ns/p"), PackingScorer())

    assert isinstance(result, Unfit)
    assert "1 node: insufficient cpu" in why_unfit(snap, pod("ns/p"), PackingScorer()).message


def test_mps_pods_never_share_a_gpu_with_another_workload() -> None:
    snap = Ledger([node("a", 2)])
    (a,) = fill(snap, pod("ns/a0", 200, owner="ns/Deployment/a", exclusive=True))
    (b,) = fill(snap, pod("ns/b0", 200, owner="ns/Deployment/b"))
    (a1,) = fill(snap, pod("ns/a1", 200, owner="ns/Deployment/a", exclusive=True))

    assert b.gpus != a.gpus
    assert a1.gpus == a.gpus
    result = place(
        snap, pod("ns/c0", 200, owner="ns/Deployment/c", exclusive=True), PackingScorer()
    )
    assert isinstance(result, Unfit)


def test_forget_undoes_assume_exactly() -> None:
    snap = Ledger([node("a", 1)])
    (p,) = fill(snap, pod("ns/p", exclusive=True, owner="ns/Deployment/x"))

    snap.forget("ns/p")

    gpu = snap.gpus[p.gpus[0]]
    assert (gpu.used_compute, gpu.used_memory, gpu.owners, gpu.exclusive_owner) == (0, 0, {}, "")
    assert snap.nodes["a"].used_cpu == 0
    assert snap.nodes["a"].used_pods == 0


def test_coming_gpus_are_never_placed_on_but_are_reported() -> None:
    n = node("a", 1)
    n.gpus[0].coming = True
    snap = Ledger([n])

    result = place(snap, pod("ns/p"), PackingScorer())

    assert isinstance(result, Unfit)
    assert result.coming


def test_pools_do_not_mix() -> None:
    n = node("a", 1)
    n.gpus[0].pool = "pool-a"
    snap = Ledger([n])

    assert isinstance(place(snap, pod("ns/p", pool="pool-b"), PackingScorer()), Unfit)
    assert isinstance(place(snap, pod("ns/p", pool="pool-a"), PackingScorer()), Placement)


def test_only_the_nodes_kube_scheduler_found_feasible_are_considered() -> None:
    snap = Ledger([node("a", 1), node("b", 1)])
    fill(snap, pod("ns/first", 500))
    partly_used = next(iter(snap.bookings.values())).node
    other = "b" if partly_used == "a" else "a"

    result = place(snap, pod("ns/p", 400), PackingScorer(), nodes=[other])

    assert isinstance(result, Placement)
    assert result.node == other


def test_no_feasible_node_is_unfit_even_with_free_gpus() -> None:
    snap = Ledger([node("a", 1)])

    assert isinstance(place(snap, pod("ns/p"), PackingScorer(), nodes=[]), Unfit)


def test_without_host_checks_the_gpu_alone_decides() -> None:
    """kube-scheduler has already checked CPU, memory and the node itself."""
    full = node("a", 1, cpu=50, ready=False)
    snap = Ledger([full], check_hosts=False)

    assert isinstance(place(snap, pod("ns/p"), PackingScorer(), nodes=["a"]), Placement)
    assert isinstance(place(Ledger([node("a", 1, cpu=50)]), pod("ns/p"), PackingScorer()), Unfit)


def test_an_unhealthy_gpu_receives_no_new_pods() -> None:
    n = node("a", 2)
    n.gpus[0].healthy = False
    snap = Ledger([n])

    placements = fill(snap, pod("ns/p1", 500), pod("ns/p2", 500))

    assert {p.gpus[0] for p in placements} == {"a-gpu1"}
    only_sick = node("b", 1)
    only_sick.gpus[0].healthy = False
    snap.add_node(only_sick)
    assert refusal(snap, pod("ns/p3", 100), "b") == "GPU unhealthy"


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        pytest.param(lambda: node("a", 0), "no GPU of the pod's pool on the node", id="no-gpus"),
        pytest.param(lambda: node("a", 1, cpu=50), "insufficient cpu", id="host-checked"),
    ],
)
def test_refusal_reads_like_the_reason_a_person_needs(build: object, expected: str) -> None:
    snap = Ledger([build()])  # type: ignore[operator]

    assert refusal(snap, pod("ns/p"), "a") == expected
    assert refusal(snap, pod("ns/p"), "unknown") == "node not known to gpupack yet"


def test_multi_gpu_request_takes_distinct_whole_gpus() -> None:
    snap = Ledger([node("a", 2), node("b", 4)])

    (p,) = fill(snap, Request("ns/train", compute=1000, gpus=3))

    assert p.node == "b"
    assert len(set(p.gpus)) == 3


def test_an_mps_gpu_is_refused_to_every_shared_pod_whatever_the_memo_holds() -> None:
    snap = Ledger([node("a", 1)])
    fill(snap, pod("ns/mps0", 200, owner="ns/Deployment/mps", exclusive=True))

    # A non-exclusive pod of the MPS workload's own name, then one of another workload:
    # both have the same shape, so the second reuses the first's memoised answer.
    first = place(snap, pod("ns/x", 200, owner="ns/Deployment/mps"), PackingScorer())
    second = place(snap, pod("ns/y", 200, owner="ns/Deployment/other"), PackingScorer())

    assert isinstance(first, Unfit)
    assert isinstance(second, Unfit)
