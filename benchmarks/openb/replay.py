"""One replay: one policy, one seed, the FGD paper's protocol, through `place`.

Pods arrive one at a time (`trace.arrivals`), never leave; each is placed with
`scheduler.placement.place` and booked with `Ledger.assume`; a pod that fits nowhere is
dropped but still counts as arrived. After every pod we note arrived and allocated GPU
millis; arrive% = round(arrived / capacity x 100) and alloc% is averaged over the events
of each integer arrive%. The headline is unallocated% = 100 - alloc% at arrive% = 100.

Ties: the paper's simulator patches kube-scheduler's selectHost to take, among equally
scored nodes, the one with the smallest name (for reproducibility). Placement takes the
first node met, so the snapshot lists the nodes in name order and both agree.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from benchmarks.openb import trace
from benchmarks.openb.baselines import BestFitScorer, FgdScorer
from scheduler.fragmentation import task_mix
from scheduler.placement import Placement, Scorer, place
from scheduler.score import FragmentationScorer, PackingScorer

POLICIES: Final = ("gpupack", "fgd", "bestfit", "packing")
HEADLINE_PCT: Final = 100


@dataclass(frozen=True, slots=True)
class SeedResult:
    policy: str
    seed: int
    pods: int
    failed: int
    alloc_pct: tuple[float, ...]  # mean alloc% at arrive% 0, 1, ... (carried over gaps)
    first_failure_arrived_pct: float | None
    gpus_used: int  # at the last event with arrive% <= 100
    nodes_used: int
    seconds: float

    @property
    def unallocated_pct(self) -> float:
        return 100.0 - self.alloc_pct[HEADLINE_PCT]


def scorer(policy: str, pods: Sequence[trace.TracePod]) -> Scorer:
    """The scorer a policy name stands for; the task mix comes from the trace's pods."""
    if policy == "gpupack":
        requests = (trace.request(p, i) for i, p in enumerate(pods))
        return FragmentationScorer(task_mix(requests))  # as the extender derives it
    if policy == "fgd":
        return FgdScorer(task_mix(trace.request(p, i) for i, p in enumerate(pods)))
    if policy == "bestfit":
        return BestFitScorer()
    if policy == "packing":
        return PackingScorer()
    raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")


def replay(
    policy: str,
    seed: int,
    nodes: Sequence[trace.TraceNode],
    pods: Sequence[trace.TracePod],
) -> SeedResult:
    started = time.perf_counter()
    snapshot = trace.snapshot(sorted(nodes, key=lambda n: n.name))
    capacity = trace.capacity(nodes)
    chooser = scorer(policy, pods)
    arriving = trace.arrivals(pods, seed, capacity)
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    arrived = allocated = failed = gpus_used = nodes_used = 0
    first_failure: float | None = None
    headline = (0, 0)
    for index, pod in enumerate(arriving):
        request = trace.request(pod, index)
        arrived += pod.gpu_milli
        result = place(snapshot, request, chooser)
        if isinstance(result, Placement):
            node = snapshot.nodes[result.node]
            nodes_used += node.used_pods == 0
            gpus_used += sum(snapshot.gpus[u].pods == 0 for u in result.gpus)
            snapshot.assume(request, result.node, result.gpus)
            allocated += pod.gpu_milli
        else:
            failed += 1
            if first_failure is None:
                first_failure = 100.0 * arrived / capacity
        pct = (200 * arrived + capacity) // (2 * capacity)  # round half up
        sums[pct] = sums.get(pct, 0.0) + 100.0 * allocated / capacity
        counts[pct] = counts.get(pct, 0) + 1
        if pct <= HEADLINE_PCT:
            headline = (gpus_used, nodes_used)
    alloc: list[float] = []
    for p in range(max(max(counts, default=0), HEADLINE_PCT) + 1):
        # No event rounds to p (a big pod jumped over it): the allocation stands as it was.
        alloc.append(sums[p] / counts[p] if p in counts else alloc[-1] if alloc else 0.0)
    return SeedResult(
        policy,
        seed,
        len(arriving),
        failed,
        tuple(alloc),
        first_failure,
        headline[0],
        headline[1],
        time.perf_counter() - started,
    )
