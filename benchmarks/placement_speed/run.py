"""Per-pod decision time of `place()` + `assume` on the openb cluster and one ten times
larger.

Replays the default openb trace (seed 42, arrivals until 100 % of the GPU capacity) on
the openb GPU cluster (1,213 nodes, 6,212 GPUs) and on the same cluster with every node
replicated `--scale` times (default 10), timing each decision: `place` with our
`FragmentationScorer` plus `Ledger.assume`. The baseline, `PackingScorer`, replays the
same pods in the same run; `ratio` is our p99 over its p99. Targets on a 2-core machine:
p99 <= 2 ms (openb) and <= 10 ms (10x).

The openb cluster is replayed in full (about 8,300 decisions). The scaled one would take
about ten times as many decisions, each over ten times the nodes, so by default only its
first `--scaled-limit` decisions (20,000, about a quarter of the way to 100 %) are
replayed and measured; `--scaled-limit 0` replays it in full (several minutes). The JSON
says how many decisions each side measured (`decisions`) out of how many the full
replay makes (`replay_decisions`).

Usage: python -m benchmarks.placement_speed.run [--scale 10] [--seed 42] [--scaled-limit N]
Progress goes to stderr; the last stdout line is one JSON object.
"""

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from benchmarks.openb import trace
from scheduler.fragmentation import task_mix
from scheduler.placement import Placement, Scorer, place
from scheduler.score import FragmentationScorer, PackingScorer

TARGET_P99_MS: Final = {"openb": 2.0, "scaled": 10.0}
SCALED_LIMIT: Final = 20_000  # decisions measured on the scaled cluster by default


def arrivals(
    nodes: Sequence[trace.TraceNode], pods: Sequence[trace.TracePod], seed: int, replicas: int
) -> list[trace.TracePod]:
    """The pods a replay places: arrivals until 100 % of the capacity arrived. Each
    replica's share of the arrivals has its own seed; the shares interleave."""
    capacity = trace.capacity(nodes) * replicas
    shares = [trace.arrivals(pods, seed + copy, capacity // replicas) for copy in range(replicas)]
    out: list[trace.TracePod] = []
    arrived = 0
    for pod in (pod for group in zip(*shares, strict=False) for pod in group):
        if arrived >= capacity:
            break
        arrived += pod.gpu_milli
        out.append(pod)
    return out


def decision_times(
    nodes: Sequence[trace.TraceNode],
    pods: Sequence[trace.TracePod],
    scorer: Scorer,
    seed: int,
    replicas: int,
    limit: int = 0,
) -> list[float]:
    """Seconds per decision, replaying `arrivals` (only the first `limit`, when given)."""
    snapshot = trace.snapshot(nodes, replicas)
    arriving = arrivals(nodes, pods, seed, replicas)
    if limit:
        arriving = arriving[:limit]
    times: list[float] = []
    gc.collect()
    gc.disable()
    try:
        for index, pod in enumerate(arriving):
            request = trace.request(pod, index)
            started = time.perf_counter()
            result = place(snapshot, request, scorer)
            if isinstance(result, Placement):
                snapshot.assume(request, result.node, result.gpus)
            times.append(time.perf_counter() - started)
    finally:
        gc.enable()
    return times


def percentiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return {
        "decisions": len(ordered),
        "p50_ms": round(cuts[49] * 1e3, 3),
        "p99_ms": round(cuts[98] * 1e3, 3),
        "max_ms": round(ordered[-1] * 1e3, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1e3, 3),
    }


def measure(
    name: str,
    nodes: Sequence[trace.TraceNode],
    pods: Sequence[trace.TracePod],
    seed: int,
    replicas: int,
    limit: int = 0,
) -> dict[str, Any]:
    mix = task_mix(trace.request(p, i) for i, p in enumerate(pods))
    ours = percentiles(decision_times(nodes, pods, FragmentationScorer(mix), seed, replicas, limit))
    print(f"{name}: gpupack {ours}", file=sys.stderr, flush=True)
    base = percentiles(decision_times(nodes, pods, PackingScorer(), seed, replicas, limit))
    print(f"{name}: packing {base}", file=sys.stderr, flush=True)
    return {
        "nodes": len(nodes) * replicas,
        "replay_decisions": len(arrivals(nodes, pods, seed, replicas)),
        "gpus": sum(n.gpus for n in nodes) * replicas,
        "gpupack": ours,
        "baseline_packing": base,
        "ratio_p99": round(ours["p99_ms"] / base["p99_ms"], 2) if base["p99_ms"] else None,
        "target_p99_ms": TARGET_P99_MS[name],
        "within_target": ours["p99_ms"] <= TARGET_P99_MS[name],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=Path, default=trace.DEFAULT_PODS)
    parser.add_argument("--nodes", type=Path, default=trace.DEFAULT_NODES)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--scale", type=int, default=10, help="replicas of the cluster")
    parser.add_argument(
        "--scaled-limit",
        type=int,
        default=SCALED_LIMIT,
        help=f"decisions on the scaled cluster (default {SCALED_LIMIT}; 0: all)",
    )
    args = parser.parse_args(argv)
    nodes, pods = trace.read_nodes(args.nodes), trace.read_pods(args.pods)
    started = time.perf_counter()
    report = {
        "benchmark": "placement-speed",
        "measures": "place() + Ledger.assume per pod, replaying arrivals to 100 %",
        "seed": args.seed,
        "scale": args.scale,
        "openb": measure("openb", nodes, pods, args.seed, 1),
        "scaled": measure("scaled", nodes, pods, args.seed, args.scale, args.scaled_limit),
        "seconds": 0.0,
    }
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
