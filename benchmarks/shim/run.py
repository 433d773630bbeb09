"""What the memory shim costs an allocation, on the fake CUDA driver, against no shim, and
against the shim of another commit, in the same run.

Measured: `cuMemAlloc_v2` + `cuMemFree_v2` pairs a second (or `--kind async`:
`cuMemAllocAsync` + `cuMemFreeAsync`), from C (the probe of the shim's tests,
`tests/cuda_shim/probe.c`, linked against the fake `libcuda.so.1`), by `--parallel`
processes of one pod at once, with the shim in LD_PRELOAD over the pod's budget (a limit
far above what the pairs hold, so nothing is refused) and without it, alternating
`--rounds` times. `--processes` more processes of the pod each hold one allocation, so
the pod has live slots. `--baseline REF` builds the shim of that git commit too (from
`git archive`) and measures it in the same rounds: "before" beside "after".

The fake driver's allocation is a bookkeeping update under a lock and a file lock, a few
microseconds; the real driver's takes tens (a 1 MiB pair: about 90 µs on an H200,
`hack/gpu-proof`), so the ratio here is the worst case: the shim's own cost against
almost nothing. Reported: pairs a second (all processes together) each way, their
medians over the rounds, the ratios to no shim and the shim's extra microseconds a pair.
No target: the GPU run's training-step ratio (<= 1.02) is the figure users feel.

Usage: .venv/bin/python -m benchmarks.shim.run [--pairs 100000] [--rounds 5]
       [--parallel 1] [--processes 0] [--kind sync|async] [--baseline REF] [--json PATH]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from doubles.shim_build import ROOT, SHIM_FLAGS, Build, compile_c
from gpupack.budget import MAGIC

LIMIT = 1 << 40
OPS = {"sync": "bench", "async": "abench"}


def rate(build: Build, env: dict[str, str], pairs: int, parallel: int, kind: str) -> float:
    """Pairs a second of `parallel` probe processes at once, all together."""
    op = f"{OPS[kind]}:{pairs}:1048576"
    procs = [
        subprocess.Popen(
            [str(build.probe), "linked", "ctx", op],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(parallel)
    ]
    started = time.monotonic()
    outputs = [proc.communicate(timeout=600) for proc in procs]
    seconds = time.monotonic() - started
    done = "bench rc=0" if kind == "sync" else f"{op} rc=0"
    for proc, (out, err) in zip(procs, outputs, strict=True):
        if proc.returncode != 0 or done not in out:
            raise RuntimeError(f"the probe's allocations failed: {out}{err}")
    return pairs * parallel / seconds


def baseline_shim(ref: str, into: Path) -> Path:
    """The shim of git commit `ref`, built with the image's flags."""
    source = into / "source"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "cuda-shim"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    library = into / "libgpupack-cuda.so"
    sources = sorted(str(p) for p in (source / "cuda-shim").glob("*.c"))
    compile_c(*SHIM_FLAGS, "-I", str(source / "cuda-shim"), "-o", str(library), *sources,
              "-ldl", "-lpthread")  # fmt: skip
    return library


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.shim.run", description=__doc__)
    parser.add_argument("--pairs", type=int, default=100_000, help="per process and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=1, help="processes allocating at once")
    parser.add_argument(
        "--processes", type=int, default=0, help="other processes of the pod holding memory"
    )
    parser.add_argument("--kind", choices=sorted(OPS), default="sync")
    parser.add_argument("--baseline", metavar="REF", help="a git commit whose shim to measure too")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.rounds < 1 or args.parallel < 1 or args.processes < 0:
        parser.error("--pairs, --rounds and --parallel must be at least 1, --processes 0 or more")
    with tempfile.TemporaryDirectory(prefix="gpupack-shim-bench-") as scratch:
        root = Path(scratch)
        build = Build(root / "build").make()
        shims = {"with": build.shim}
        if args.baseline:
            shims["baseline"] = baseline_shim(args.baseline, root / "baseline")
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(build.root),
            "GPUPACK_CUDA_QUIET": "1",
            "FAKE_CUDA_STATE": str(root / "device"),
            "FAKE_CUDA_CONTEXT": "0",
        }
        envs = {"without": base}
        holders: list[subprocess.Popen[str]] = []
        for name, shim in shims.items():
            pod = root / f"pod-{name}"
            pod.mkdir()
            (pod / "limit").write_text(f"{LIMIT}\n")
            envs[name] = {**base, "LD_PRELOAD": str(shim), "GPUPACK_CUDA_DIR": str(pod)}
            holders += [
                subprocess.Popen(
                    [str(build.probe), "linked", "ctx", "alloc:1048576", "hold"],
                    env=envs[name],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                for _ in range(args.processes)
            ]
        rounds: dict[str, list[float]] = {name: [] for name in envs}
        try:
            for holder in holders:
                assert holder.stdout is not None
                while holder.stdout.readline().strip() != "holding":
                    pass
            for _ in range(args.rounds):
                for name, env in envs.items():
                    rounds[name].append(rate(build, env, args.pairs, args.parallel, args.kind))
            budget = root / "pod-with" / "budget"
            if not budget.exists() or budget.read_bytes()[:8] != MAGIC:
                raise RuntimeError("the shim never opened the pod's budget: it did not load")
        finally:
            for holder in holders:
                holder.kill()
                holder.communicate()
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    plain = medians["without"]
    report: dict[str, Any] = {
        "benchmark": "shim",
        "driver": "fake",
        "kind": args.kind,
        "pairs": args.pairs,
        "rounds": args.rounds,
        "parallel": args.parallel,
        "other_processes": args.processes,
        "baseline": args.baseline,
        "pairs_per_second_without": plain,
        "pairs_per_second_with": medians["with"],
        "ratio": medians["with"] / plain,
        "extra_microseconds_per_pair": (1 / medians["with"] - 1 / plain) * 1e6,
        "rounds_without": rounds["without"],
        "rounds_with": rounds["with"],
    }
    line = (
        f"shim on the fake driver ({args.kind}, {args.parallel} process(es) at once, "
        f"{args.processes} holding): {medians['with']:,.0f} pairs/s with, {plain:,.0f} "
        f"without (ratio {report['ratio']:.3f}, +{report['extra_microseconds_per_pair']:.2f} µs "
        "a pair)"
    )
    if args.baseline:
        before = medians["baseline"]
        report["pairs_per_second_baseline"] = before
        report["baseline_ratio"] = before / plain
        report["with_over_baseline"] = medians["with"] / before
        report["rounds_baseline"] = rounds["baseline"]
        line += f"; {args.baseline}'s shim {before:,.0f} (ratio {before / plain:.3f})"
    print(line)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
