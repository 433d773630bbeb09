"""Replay the Alibaba openb trace with the FGD paper's protocol and compare policies.

Cluster `openb_node_list_gpu_node.csv` (1,213 nodes, 6,212 GPUs), pods
`openb_pod_list_default.csv`, seeds 42..51: per seed the pods are shuffled and cloned up
to 130 % of the GPU capacity, placed one at a time through the placement core, never
leaving (see `replay`). Policies: `gpupack` (ours, `FragmentationScorer`), `fgd` and
`bestfit` (the paper's baselines, `baselines`), `packing` (`PackingScorer`). The metric
is the FGD paper's: unallocated GPU % at 100 % arrived, mean over the seeds; the paper's
own values for the same trace come from `fgd_expected_results/summary_by_arrival.csv`.

Usage: python -m benchmarks.openb.run [--policy gpupack fgd bestfit] [--seeds 42..51]
  [--pods PATH] [--nodes PATH] [--workers N]
Progress goes to stderr; the last stdout line is one JSON object.
"""

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Final

from benchmarks.openb import trace
from benchmarks.openb.replay import HEADLINE_PCT, POLICIES, SeedResult, replay

PUBLISHED_NAMES: Final = {"fgd": "FGD", "bestfit": "BestFit"}
TOLERANCE: Final = 0.5  # points of unallocated % a re-implemented baseline may be off by


def parse_seeds(text: str) -> list[int]:
    """`42..51` (inclusive) or `42,43`."""
    try:
        if ".." in text:
            first, last = text.split("..", 1)
            return list(range(int(first), int(last) + 1))
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError as error:
        message = f"--seeds: expected 42..51 or 42,43, got {text!r}"
        raise argparse.ArgumentTypeError(message) from error


def workload_of(pods: Path) -> str:
    return pods.stem.removeprefix("openb_pod_list_")


def published(path: Path, workload: str) -> dict[str, list[float]]:
    """Published mean alloc% by arrive%, per paper policy name, for one workload."""
    out: dict[str, list[float]] = {}
    if not path.is_file():
        return out
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["workload"] != workload:
                continue
            curve = out.setdefault(row["policy"], [])
            pct = int(row["arrived_pct"])
            curve.extend([math.nan] * (pct + 1 - len(curve)))
            curve[pct] = float(row["alloc_pct_mean"])
    return out


def _run_one(job: tuple[str, int, Path, Path]) -> SeedResult:
    policy, seed, nodes, pods = job
    return replay(policy, seed, trace.read_nodes(nodes), trace.read_pods(pods))


def summarise(
    policy: str, results: list[SeedResult], reference: dict[str, list[float]]
) -> dict[str, Any]:
    curve = [
        statistics.fmean(r.alloc_pct[p] for r in results)
        for p in range(HEADLINE_PCT + 1)
        if all(p < len(r.alloc_pct) for r in results)
    ]
    unallocated = statistics.fmean(r.unallocated_pct for r in results)
    failures = [r.first_failure_arrived_pct for r in results if r.first_failure_arrived_pct]
    out: dict[str, Any] = {
        "unallocated_pct": round(unallocated, 3),
        "unallocated_pct_by_seed": {r.seed: round(r.unallocated_pct, 3) for r in results},
        "first_failure_arrived_pct": round(statistics.fmean(failures), 2) if failures else None,
        "gpus_used": round(statistics.fmean(r.gpus_used for r in results), 1),
        "nodes_used": round(statistics.fmean(r.nodes_used for r in results), 1),
        "failed_pods": round(statistics.fmean(r.failed for r in results), 1),
        "seconds": round(sum(r.seconds for r in results), 1),
    }
    name = PUBLISHED_NAMES.get(policy)
    if name in reference:
        theirs = reference[name]
        out["published_unallocated_pct"] = round(100.0 - theirs[HEADLINE_PCT], 3)
        out["difference"] = round(unallocated - out["published_unallocated_pct"], 3)
        out["within_tolerance"] = abs(out["difference"]) <= TOLERANCE
        gaps = [abs(a - b) for a, b in zip(curve, theirs, strict=False) if not math.isnan(b)]
        out["curve_max_abs_difference"] = round(max(gaps), 3) if gaps else None
    return out


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """--nodes, --seeds, --policy and --workers, as every replay benchmark takes them."""
    parser.add_argument("--nodes", type=Path, default=trace.DEFAULT_NODES)
    parser.add_argument("--seeds", type=parse_seeds, default=list(range(42, 52)))
    parser.add_argument(
        "--policy",
        nargs="+",
        action="extend",
        choices=POLICIES,
        help="default: gpupack fgd bestfit",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=Path, default=trace.DEFAULT_PODS)
    add_replay_arguments(parser)
    parser.add_argument(
        "--published",
        type=Path,
        default=trace.DEFAULT_DATA / "fgd_expected_results" / "summary_by_arrival.csv",
    )
    args = parser.parse_args(argv)
    policies: list[str] = list(dict.fromkeys(args.policy or ["gpupack", "fgd", "bestfit"]))
    nodes, pods = trace.read_nodes(args.nodes), trace.read_pods(args.pods)
    started = time.perf_counter()
    jobs = [(p, s, args.nodes, args.pods) for p in policies for s in args.seeds]
    results: dict[str, list[SeedResult]] = {p: [] for p in policies}
    with (
        ProcessPoolExecutor(max_workers=args.workers) if args.workers > 1 else nullcontext() as pool
    ):
        for result in pool.map(_run_one, jobs) if pool else map(_run_one, jobs):
            results[result.policy].append(result)
            print(
                f"{result.policy} seed {result.seed}: unallocated "
                f"{result.unallocated_pct:.2f} %, {result.failed} of {result.pods} pods "
                f"failed, first at {result.first_failure_arrived_pct or 0:.1f} % arrived "
                f"({result.seconds:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    reference = published(args.published, workload_of(args.pods))
    report = {
        "benchmark": "openb-replay",
        "workload": workload_of(args.pods),
        "nodes_file": args.nodes.name,
        "pods_file": args.pods.name,
        "nodes": len(nodes),
        "gpus": sum(n.gpus for n in nodes),
        "trace_pods": len(pods),
        "seeds": args.seeds,
        "arrival_target_pct": round(100 * trace.TARGET_RATIO),
        "metric": f"unallocated GPU % = 100 - alloc % at arrive % = {HEADLINE_PCT}, mean of seeds",
        "gpu_memory": trace.MEMORY_NOTE,
        "policies": {p: summarise(p, results[p], reference) for p in policies},
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
