"""GPUs held over time as pods come and go: `python -m benchmarks.churn`.

Replays the openb pods' arrivals and departures in time order on the openb cluster
(`replay`) for each policy (ours `gpupack`, `fgd`, `bestfit`) and each consolidation mode
(`Off`, `IdleGPUs`, `On`), and reports per run: GPU-hours held over the lower bound's
(the time average of the ratio) and the ratio's time-weighted 95th percentile, the same
for GPU nodes, evictions per hour of trace, failed placements. The replay follows the
trace's own times, so it is not seeded: one run per workload and policy.

Usage: python -m benchmarks.churn [--pods PATH ...] [--all] [--policy ...] [--mode ...]
  [--nodes PATH] [--workers N] [--markdown]
`--all` takes every pod list in the data folder (those without times are reported and
skipped). Progress goes to stderr; the last stdout line is one JSON object:
{"workloads": {workload: {policy: {mode: {"gpu_ratio", "gpu_ratio_p95", "node_ratio",
"node_ratio_p95", "evictions_per_hour", ...}}}}, "skipped": {...}}.
"""

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

from benchmarks.churn.replay import MODES, ChurnResult, read_timed, replay
from benchmarks.openb import trace
from gpupack.policy import ConsolidationMode

POLICIES: Final = ("gpupack", "fgd", "bestfit")


def workload_of(pods: Path) -> str:
    return pods.stem.removeprefix("openb_pod_list_")


def _one(job: tuple[Path, Path, str, str]) -> ChurnResult:
    nodes_path, pods_path, policy, mode = job
    pods = read_timed(pods_path)
    assert pods is not None
    nodes = trace.read_nodes(nodes_path)
    return replay(workload_of(pods_path), policy, ConsolidationMode(mode), nodes, pods)


def row(r: ChurnResult) -> dict[str, Any]:
    return {
        "gpu_ratio": round(r.gpu_ratio, 4),
        "gpu_ratio_p95": round(r.gpu_ratio_p95, 4),
        "node_ratio": round(r.node_ratio, 4),
        "node_ratio_p95": round(r.node_ratio_p95, 4),
        "evictions_per_hour": round(r.evictions_per_hour, 3),
        "evictions": r.evictions,
        "wasted_moves": r.wasted_moves,
        "failed": r.failed,
        "pods": r.pods,
        "gpu_hours": round(r.gpu_hours, 1),
        "bound_hours": round(r.bound_hours, 1),
        "seconds": round(r.seconds, 2),
    }


def markdown(results: list[ChurnResult]) -> str:
    lines = [
        "| workload | policy | consolidation | GPU-h / bound | p95 | nodes-h / min | p95 "
        "| evictions/h | wasted moves |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.workload} | {r.policy} | {r.mode} | {r.gpu_ratio:.3f} | "
            f"{r.gpu_ratio_p95:.3f} | {r.node_ratio:.3f} | {r.node_ratio_p95:.3f} | "
            f"{r.evictions_per_hour:.2f} | {r.wasted_moves} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.churn", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pods", type=Path, nargs="+", default=[trace.DEFAULT_PODS])
    parser.add_argument("--all", action="store_true", help="every pod list in the data folder")
    parser.add_argument("--nodes", type=Path, default=trace.DEFAULT_NODES)
    parser.add_argument("--policy", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--mode", nargs="+", choices=[m.value for m in MODES], default=None)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args(argv)
    modes = args.mode or [m.value for m in MODES]
    paths = sorted(trace.DEFAULT_DATA.glob("openb_pod_list_*.csv")) if args.all else args.pods
    for path in [args.nodes, *paths]:
        if not path.is_file():
            parser.error(f"{path}: no such file (the openb data folder is {trace.DEFAULT_DATA})")
    skipped: dict[str, str] = {}
    jobs: list[tuple[Path, Path, str, str]] = []
    for path in paths:
        if read_timed(path) is None:
            skipped[workload_of(path)] = "no creation_time/deletion_time columns"
            print(f"{workload_of(path)}: skipped, no times", file=sys.stderr)
            continue
        jobs += [(args.nodes, path, p, m) for p in args.policy for m in modes]
    results: list[ChurnResult] = []
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            results = list(pool.map(_one, jobs))
    else:
        results = [_one(job) for job in jobs]
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for r in results:
        print(
            f"{r.workload} {r.policy} {r.mode}: GPU-h/bound {r.gpu_ratio:.3f} "
            f"(p95 {r.gpu_ratio_p95:.3f}), nodes {r.node_ratio:.3f}, "
            f"{r.evictions_per_hour:.2f} evictions/h, {r.seconds:.1f}s",
            file=sys.stderr,
        )
        out.setdefault(r.workload, {}).setdefault(r.policy, {})[r.mode] = row(r)
    if args.markdown:
        print(markdown(results))
    print(json.dumps({"workloads": out, "skipped": skipped}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
