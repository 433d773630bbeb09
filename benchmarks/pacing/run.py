"""What compute pacing costs a kernel launch, on the fake CUDA driver, against no shim and
against the shim passing launches through, in the same run.

Measured: `cuLaunchKernel` calls a second from C (the shim tests' probe,
`tests/cuda_shim/probe.c`, linked against the fake `libcuda.so.1`, whose kernels take no
time here), `--launches` per round, alternating `--rounds` times between:

- `without`: no shim;
- `pass-through`: the shim over a pod with a compute share and the GPU's `gpu-time`
  file, alone on its GPU (what every launch costs when there is nobody to share with);
- `paced`: the same pod in `cap` mode with the whole GPU as its share, so every launch
  takes the paced path (the clock, the GPU's slots read, an event recorded behind it, the
  meter thread polling it) and none waits: the cost a launch pays beside busy
  neighbours, before any delay the share itself imposes. `--neighbours` more slots in
  the file are kept fresh by processes of other pods, so the scan reads them too.

The fake driver's launch costs almost nothing, so the ratios are the worst case: the
shim's own cost against nothing; the GPU run (`hack/gpu-proof`) measures a training step.
Reported: launches a second each way (medians), the ratios to no shim, and the extra
microseconds a launch.

Usage: .venv/bin/python -m benchmarks.pacing.run [--launches 200000] [--rounds 5]
       [--neighbours 3] [--json PATH]
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

from doubles.shim_build import Build
from gpupack import cuda

WAYS = ("without", "pass-through", "paced")


def rate(build: Build, env: dict[str, str], launches: int) -> float:
    done = subprocess.run(
        [str(build.probe), "linked", "ctx", f"lbench:{launches}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    found = [line for line in done.stdout.splitlines() if line.startswith("lbench rc=0")]
    if done.returncode != 0 or not found:
        raise RuntimeError(f"the probe's launches failed: {done.stdout}{done.stderr}")
    return float(found[0].split("launches_per_second=")[1])


def pod(root: Path, name: str, gpu_time: Path, compute: str) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / cuda.COMPUTE).write_text(f"{compute}\n")
    os.link(gpu_time, directory / cuda.GPU_TIME)
    return directory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.pacing.run", description=__doc__)
    parser.add_argument("--launches", type=int, default=200_000, help="per round and way")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--neighbours", type=int, default=3, help="other pods' slots, kept fresh")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.launches < 1 or args.rounds < 1 or args.neighbours < 0:
        parser.error("--launches and --rounds must be at least 1, --neighbours 0 or more")
    with tempfile.TemporaryDirectory(prefix="gpupack-pacing-bench-") as scratch:
        root = Path(scratch)
        build = Build(root / "build").make()
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(build.root),
            "GPUPACK_CUDA_QUIET": "1",
            "FAKE_CUDA_STATE": str(root / "device"),
            "FAKE_CUDA_CONTEXT": "0",
        }
        alone_gpu, shared_gpu = root / "alone-gpu-time", root / "shared-gpu-time"
        for path in (alone_gpu, shared_gpu):
            path.write_bytes(bytes(cuda.GPU_TIME_BYTES))
        shimmed = {**base, "LD_PRELOAD": str(build.shim)}
        envs = {
            "without": base,
            "pass-through": {
                **shimmed,
                "GPUPACK_CUDA_DIR": str(pod(root, "alone", alone_gpu, "300 share")),
            },
            "paced": {
                **shimmed,
                "GPUPACK_CUDA_DIR": str(pod(root, "paced", shared_gpu, "1000 cap")),
            },
        }
        # Other pods of the paced pod's GPU, launching now and then: fresh slots to read.
        ticker = f"work:0:{time.monotonic() * 1000 + 3_600_000}:1"
        neighbours = [
            subprocess.Popen(
                [str(build.probe), "linked", "ctx", ticker],
                env={
                    **shimmed,
                    "GPUPACK_CUDA_DIR": str(pod(root, f"n{i}", shared_gpu, "100 cap")),
                    "FAKE_CUDA_KERNEL_US": "1",
                    "FAKE_CUDA_CLOCK": str(root / "clock"),
                },
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(args.neighbours)
        ]
        rounds: dict[str, list[float]] = {way: [] for way in WAYS}
        try:
            for _ in range(args.rounds):
                for way in WAYS:
                    rounds[way].append(rate(build, envs[way], args.launches))
        finally:
            for neighbour in neighbours:
                neighbour.kill()
                neighbour.communicate()
    medians = {way: statistics.median(values) for way, values in rounds.items()}
    plain = medians["without"]
    report: dict[str, Any] = {
        "benchmark": "pacing",
        "driver": "fake",
        "launches": args.launches,
        "rounds": args.rounds,
        "neighbours": args.neighbours,
        **{f"launches_per_second_{way}": medians[way] for way in WAYS},
        **{f"rounds_{way}": rounds[way] for way in WAYS},
        "ratio_pass_through": medians["pass-through"] / plain,
        "ratio_paced": medians["paced"] / plain,
        "extra_microseconds_pass_through": (1 / medians["pass-through"] - 1 / plain) * 1e6,
        "extra_microseconds_paced": (1 / medians["paced"] - 1 / plain) * 1e6,
    }
    print(
        f"launches on the fake driver: {plain:,.0f}/s without the shim, "
        f"{medians['pass-through']:,.0f}/s passed through (ratio "
        f"{report['ratio_pass_through']:.3f}, +{report['extra_microseconds_pass_through']:.2f} "
        f"µs), {medians['paced']:,.0f}/s paced (ratio {report['ratio_paced']:.3f}, "
        f"+{report['extra_microseconds_paced']:.2f} µs) beside {args.neighbours} pod(s)"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
