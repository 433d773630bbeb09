"""What the memory shim costs an allocation, on the fake CUDA driver, against no shim.

Measured: `cuMemAlloc_v2` + `cuMemFree_v2` pairs a second, from C (the probe of the
shim's tests, `tests/cuda_shim/probe.c`, linked against the fake `libcuda.so.1`), one
process and `--threads` threads, with the shim in LD_PRELOAD over a pod's budget (a
limit far above what the pairs hold, so nothing is refused) and without it, the two
alternating `--rounds` times in the same run. The fake driver's allocation is a
bookkeeping update under a lock and a file lock, a few microseconds; the real driver's
takes tens (a 1 MiB pair: about 90 µs on an H200, `hack/gpu-proof`), so the ratio here
is the worst case: the shim's own cost (its budget lock, a scan of the pod's live
slots, the allocation table) against almost nothing. `--processes` more processes of
the same pod each hold one allocation, so the scan has slots to read.

Reported: pairs a second, with and without, their medians over the rounds, the ratio
(with / without) and the shim's extra microseconds a pair. No target: the GPU run's
training-step ratio (<= 1.02) is the figure users feel.

Usage: .venv/bin/python -m benchmarks.shim.run [--pairs 100000] [--rounds 5]
       [--processes 0] [--json PATH]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpupack.budget import MAGIC
from tests.cuda_shim.build import Build

LIMIT = 1 << 40


def rate(build: Build, env: dict[str, str], pairs: int) -> float:
    """Pairs a second of one probe process."""
    done = subprocess.run(
        [str(build.probe), "linked", "ctx", f"bench:{pairs}:1048576"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("bench"))
    fields = dict(part.split("=", 1) for part in line.split()[1:])
    if fields["rc"] != "0":
        raise RuntimeError(f"the probe's allocations failed: {line}")
    return float(fields["pairs_per_second"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.shim.run", description=__doc__)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        help="other processes of the pod holding an allocation each",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpupack-shim-bench-") as scratch:
        root = Path(scratch)
        build = Build(root / "build").make()
        pod = root / "pod"
        pod.mkdir()
        (pod / "limit").write_text(f"{LIMIT}\n")
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(build.root),
            "GPUPACK_CUDA_DIR": str(pod),
            "GPUPACK_CUDA_QUIET": "1",
            "FAKE_CUDA_STATE": str(root / "device"),
            "FAKE_CUDA_CONTEXT": "0",
        }
        shimmed = {**base, "LD_PRELOAD": str(build.shim)}
        holders = [
            subprocess.Popen(
                [str(build.probe), "linked", "ctx", "alloc:1048576", "hold"],
                env=shimmed,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for _ in range(args.processes)
        ]
        try:
            for holder in holders:
                assert holder.stdout is not None
                while holder.stdout.readline().strip() != "holding":
                    pass
            without: list[float] = []
            with_shim: list[float] = []
            for _ in range(args.rounds):
                without.append(rate(build, base, args.pairs))
                with_shim.append(rate(build, shimmed, args.pairs))
            budget = pod / "budget"
            if not budget.exists() or budget.read_bytes()[:8] != MAGIC:
                raise RuntimeError("the shim never opened the pod's budget: it did not load")
        finally:
            for holder in holders:
                holder.kill()
                holder.communicate()
    plain, shim = statistics.median(without), statistics.median(with_shim)
    report: dict[str, Any] = {
        "benchmark": "shim",
        "driver": "fake",
        "pairs": args.pairs,
        "rounds": args.rounds,
        "other_processes": args.processes,
        "pairs_per_second_without": plain,
        "pairs_per_second_with": shim,
        "ratio": shim / plain,
        "extra_microseconds_per_pair": (1 / shim - 1 / plain) * 1e6,
        "rounds_without": without,
        "rounds_with": with_shim,
    }
    print(
        f"shim on the fake driver: {shim:,.0f} alloc+free pairs/s with, {plain:,.0f} without "
        f"(ratio {report['ratio']:.3f}; +{report['extra_microseconds_per_pair']:.2f} µs a pair; "
        f"{args.processes} other processes in the pod)"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
