"""Per-pod decision time of `place()` + `assume` on the openb cluster and one ten times
larger.

Replays the default openb trace (seed 42, arrivals until 100 % of the GPU capacity) on
the openb GPU cluster (1,213 nodes, 6,212 GPUs) and on the same cluster with every node
replicated `--scale` times (default 10), timing each decision: `place` with our
`FragmentationScorer` plus `Snapshot.assume`. The baseline, `PackingScorer`, replays the
same pods in the same run; `ratio` is our p99 over its p99. Targets on a 2-core machine:
p99 <= 2 ms (openb) and <= 10 ms (10x).

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
from scheduler.placement import Placement, Scorer, place
from scheduler.score import MIX_COVERAGE, FragmentationScorer, PackingScorer, task_mix

TARGET_P99_MS: Final = {"openb": 2.0, "scaled": 10.0}


def decision_times(
    nodes: Sequence[trace.TraceNode],
    pods: Sequence[trace.TracePod],
    scorer: Scorer,
    seed: int,
    replicas: int,
    limit: int = 0,
) -> list[float]:
    """Seconds per decision, replaying arrivals until 100 % of the capacity arrived (or
    `limit` decisions, when given)."""
    snapshot = trace.snapshot(nodes, replicas)
    capacity = trace.capacity(nodes) * replicas
    shares = [  # each replica's share of the arrivals has its own seed; they interleave
        trace.arrivals(pods, seed + copy, capacity // replicas) for copy in range(replicas)
    ]
    arriving = [pod for group in zip(*shares, strict=False) for pod in group]
    times: list[float] = []
    arrived = 0
    gc.collect()
    gc.disable()
    try:
        for index, pod in enumerate(arriving):
            if arrived >= capacity or (limit and len(times) >= limit):
                break
            arrived += pod.gpu_milli
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
    mix = task_mix((trace.request(p, i) for i, p in enumerate(pods)), MIX_COVERAGE)
    ours = percentiles(decision_times(nodes, pods, FragmentationScorer(mix), seed, replicas, limit))
    print(f"{name}: gpupack {ours}", file=sys.stderr, flush=True)
    base = percentiles(decision_times(nodes, pods, PackingScorer(), seed, replicas, limit))
    print(f"{name}: packing {base}", file=sys.stderr, flush=True)
    return {
        "nodes": len(nodes) * replicas,
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
        "--scaled-limit", type=int, default=0, help="decisions on the scaled cluster (0: all)"
    )
    args = parser.parse_args(argv)
    nodes, pods = trace.read_nodes(args.nodes), trace.read_pods(args.pods)
    started = time.perf_counter()
    report = {
        "benchmark": "placement-speed",
        "measures": "place() + Snapshot.assume per pod, replaying arrivals to 100 %",
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
