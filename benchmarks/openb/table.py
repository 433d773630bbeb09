"""Every openb workload, every policy, one table: the packing robustness check.

Runs `benchmarks.openb.run`'s replay for each `openb_pod_list_*.csv` in the data folder
(or the ones named) and prints, per workload, the mean unallocated GPU % at 100 %
arrived for each policy, the paper's published FGD and BestFit where it has them, and
whether ours is no worse than FGD (ours and published). The last stdout line is one
JSON object; `--markdown` prints the table as docs/scheduler.md shows it first.

`--variants` adds workloads made from the default trace by `benchmarks.openb.variants`
(names such as `share70` or `multi30-share60`, or `seen` and `held-out` for the sets the
packing was and was not chosen on); they have no published figures, so ours is
compared with our FGD only.

Usage: python -m benchmarks.openb.table [--seeds 42..51] [--workload default cpu250 ...]
  [--variants seen held-out share70 ...] [--policy gpupack fgd bestfit] [--workers N]
  [--markdown]
"""

import argparse
import atexit
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

from benchmarks.openb import trace, variants
from benchmarks.openb.replay import HEADLINE_PCT, SeedResult
from benchmarks.openb.run import _run_one, add_replay_arguments, published, workload_of

PUBLISHED: Final = ("FGD", "BestFit")


def workloads(data: Path, names: list[str] | None) -> list[Path]:
    found = sorted(data.glob("openb_pod_list_*.csv"))
    if not names:
        return found
    by_name = {workload_of(p): p for p in found}
    missing = [n for n in names if n not in by_name]
    if missing:
        known = ", ".join(by_name) or "none"
        raise SystemExit(f"--workload: no pod list for {', '.join(missing)} (found: {known})")
    return [by_name[n] for n in names]


def write_variants(names: list[str], out: Path, data: Path, nodes: Path) -> list[Path]:
    """The named variants (`seen` and `held-out` stand for their sets) of the data
    folder's default trace, written to `out`."""
    expanded: list[str] = []
    for name in names:
        expanded += {"seen": variants.SEEN, "held-out": variants.HELD_OUT}.get(name, (name,))
    pods = trace.read_pods(data / trace.DEFAULT_PODS.name)
    cluster = trace.read_nodes(nodes)
    paths = []
    for name in dict.fromkeys(expanded):
        path = out / f"openb_pod_list_{name}.csv"
        variants.write(path, variants.make(name, pods, cluster, seed=0))
        paths.append(path)
    return paths


def row(
    workload: str, results: dict[str, list[SeedResult]], reference: dict[str, list[float]]
) -> dict[str, Any]:
    out: dict[str, Any] = {"workload": workload}
    for policy, seeds in results.items():
        out[policy] = round(statistics.fmean(r.unallocated_pct for r in seeds), 2)
        out[f"{policy}_sd"] = round(statistics.pstdev(r.unallocated_pct for r in seeds), 2)
    for name in PUBLISHED:
        if name in reference:
            out[f"published_{name}"] = round(100.0 - reference[name][HEADLINE_PCT], 2)
    if "gpupack" in out:
        ours = out["gpupack"]
        if "fgd" in out:
            out["vs_fgd"] = round(ours - out["fgd"], 2)
        if "published_FGD" in out:
            out["vs_published_fgd"] = round(ours - out["published_FGD"], 2)
    return out


def markdown(rows: list[dict[str, Any]], policies: list[str], seeds: list[int]) -> str:
    heads = [*policies, *(f"published {n}" for n in PUBLISHED), "ours - FGD", "ours - pub. FGD"]
    lines = [
        f"| workload | {' | '.join(heads)} |",
        "|---|" + "---:|" * len(heads),
    ]

    def cell(r: dict[str, Any], key: str, sign: bool = False) -> str:
        value = r.get(key)
        if value is None:
            return "—"
        return f"{value:+.2f}" if sign else f"{value:.2f}"

    for r in rows:
        cells = [f"{cell(r, p)} ± {r[p + '_sd']:.2f}" for p in policies]
        cells += [cell(r, f"published_{n}") for n in PUBLISHED]
        cells += [cell(r, "vs_fgd", True), cell(r, "vs_published_fgd", True)]
        lines.append(f"| {r['workload']} | {' | '.join(cells)} |")
    lines.append("")
    lines.append(
        f"Unallocated GPU % at 100 % arrived, mean ± sd over seeds {seeds[0]}..{seeds[-1]}"
        f" ({len(seeds)} seeds); lower is better."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=trace.DEFAULT_DATA)
    parser.add_argument("--workload", nargs="+", help="e.g. default cpu250; default: all")
    add_replay_arguments(parser)
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[],
        metavar="NAME",
        help="also replay these variants of the default trace (`seen`, `held-out`, or "
        "names such as share70); `--workload` then selects among the data folder's",
    )
    parser.add_argument("--markdown", action="store_true", help="also print a markdown table")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers: must be at least 1")
    policies: list[str] = list(dict.fromkeys(args.policy or ["gpupack", "fgd", "bestfit"]))
    paths = workloads(args.data, args.workload) if args.workload or not args.variants else []
    if args.variants:
        made = Path(tempfile.mkdtemp(prefix="gpupack-variants-"))
        atexit.register(shutil.rmtree, made, ignore_errors=True)
        try:
            paths += write_variants(args.variants, made, args.data, args.nodes)
        except ValueError as error:
            parser.error(f"--variants: {error}")
    if not paths:
        parser.error(f"--data: no openb_pod_list_*.csv in {args.data}")
    summary = args.data / "fgd_expected_results" / "summary_by_arrival.csv"
    started = time.perf_counter()
    jobs = [(p, s, args.nodes, path) for path in paths for p in policies for s in args.seeds]
    results: dict[str, dict[str, list[SeedResult]]] = {
        workload_of(path): {p: [] for p in policies} for path in paths
    }
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for job, result in zip(jobs, pool.map(_run_one, jobs), strict=True):
            workload = workload_of(job[3])
            results[workload][result.policy].append(result)
            print(
                f"{workload} {result.policy} seed {result.seed}: "
                f"{result.unallocated_pct:.2f} % ({result.seconds:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    rows = [row(w, by_policy, published(summary, w)) for w, by_policy in results.items()]
    if args.markdown:
        print(markdown(rows, policies, args.seeds))
    worse = [
        r["workload"] for r in rows if r.get("vs_fgd", 0) > 0 or r.get("vs_published_fgd", 0) > 0
    ]
    print(
        json.dumps(
            {
                "benchmark": "openb-table",
                "seeds": args.seeds,
                "policies": policies,
                "rows": rows,
                "worse_than_fgd": worse,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
