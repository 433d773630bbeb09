"""The compute pacing's proof on a real GPU (`hack/gpu-proof`, part of the shim's run):
two matmul loops at 300m and 700m, alone and together, paced and not; a latency loop beside
a saturating neighbour, paced and not; and a training step with every launch paced, against
no shim (target <= 1.03). Each pod is a directory with its `compute` file and a link to
its GPU's `gpu-time`, as the node agent's CSI driver makes them."""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupack import cuda  # the standard library only: no dependencies
from hack.gpu_proof_cases import CASES

if TYPE_CHECKING:
    from hack.gpu_proof_shim import Proof

GIB = 1 << 30


def paced_pod(proof: "Proof", name: str, gpu_time: Path, compute: str | None) -> Path:
    """A pod of one GPU's paced pods: its `compute` file and the GPU's `gpu-time`."""
    pod = proof.pod(name, 64 * GIB)
    if compute is not None:
        (pod / "compute").write_text(f"{compute}\n")
    if not (pod / "gpu-time").exists():
        os.link(gpu_time, pod / "gpu-time")
    return pod


def together(proof: "Proof", runs: list[tuple[str, Path, list[str]]], seconds: float) -> list[Any]:
    """Programs started at once, measured over the same window after 3 s of settling."""
    begin = time.time() + 3.0
    window = [str(begin), str(begin + seconds)]
    procs = [
        subprocess.Popen(  # noqa: S603 (our interpreter and case)
            [sys.executable, "-c", CASES[name], *window, *args],
            env=proof.env(pod, GPUPACK_CUDA_QUIET="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, pod, args in runs
    ]
    results: list[Any] = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        lines = out.strip().splitlines()
        results.append(
            json.loads(lines[-1])
            if proc.returncode == 0 and lines
            else {"error": err.strip()[-400:]}
        )
    return results


def run(proof: "Proof") -> None:
    """Compute pacing on the GPU: two matmul loops at 300m and 700m, alone and
    together, with and without pacing; a latency loop beside a saturating neighbour;
    a training step's overhead when every launch is paced."""
    gpu_time = proof.scratch / "gpu-time"
    gpu_time.write_bytes(bytes(cuda.GPU_TIME_BYTES))
    rates: dict[str, float] = {}
    for share in ("300", "700"):
        [alone] = together(
            proof,
            [("matmul-loop", paced_pod(proof, f"alone-{share}", gpu_time, f"{share} share"), [])],
            5.0,
        )
        rates[share] = alone.get("iterations", 0) / 5.0
    pair: dict[str, list[float]] = {}
    for mode in ("off", "share"):
        fresh = proof.scratch / f"gpu-time-{mode}"
        fresh.write_bytes(bytes(cuda.GPU_TIME_BYTES))
        got = together(
            proof,
            [
                ("matmul-loop", paced_pod(proof, f"{mode}-{s}", fresh, f"{s} {mode}"), [])
                for s in ("300", "700")
            ],
            10.0,
        )
        pair[mode] = [
            g.get("iterations", 0) / 10.0 / rates[s] if rates.get(s) else 0.0
            for g, s in zip(got, ("300", "700"), strict=True)
        ]
    shares = pair["share"]
    proof.check(
        "compute-pair",
        {"alone_iterations_per_s": rates, "fraction_of_alone": pair},
        len(shares) == 2 and abs(shares[0] - 0.3) <= 0.05 and abs(shares[1] - 0.7) <= 0.05,
        "300m and 700m matmul loops together run at 0.3 and 0.7 of their alone rates "
        "(+-0.05); without pacing about 0.5 each",
    )
    latency: dict[str, Any] = {}
    for mode in ("off", "share"):
        fresh = proof.scratch / f"gpu-time-latency-{mode}"
        fresh.write_bytes(bytes(cuda.GPU_TIME_BYTES))
        server = paced_pod(proof, f"server-{mode}", fresh, f"300 {mode}")
        batch = paced_pod(proof, f"batch-{mode}", fresh, f"700 {mode}")
        got = together(proof, [("latency-loop", server, []), ("matmul-loop", batch, [])], 10.0)
        latency[mode] = got[0]
    off, paced = latency["off"].get("p50_ms"), latency["share"].get("p50_ms")
    proof.check(
        "compute-latency",
        latency,
        off is not None and paced is not None and paced <= off * 1.1,
        "a 300m server's requests beside a saturating 700m neighbour: p50 with pacing no "
        "worse than without (p50 and p99 reported)",
    )
    steps: dict[str, list[float]] = {"without": [], "paced": []}
    for _ in range(3):
        trained = paced_pod(proof, "train-paced", proof.scratch / "gpu-time", "1000 cap")
        for which, pod in (("without", None), ("paced", trained)):
            r = proof.program("train-step", pod, "30", GPUPACK_CUDA_QUIET="1")
            if "median_step_s" in r:
                steps[which].append(r["median_step_s"])
    ratio = (
        statistics.median(steps["paced"]) / statistics.median(steps["without"])
        if steps["paced"] and steps["without"]
        else None
    )
    proof.check(
        "compute-overhead",
        {"train_step_s": steps, "train_step_ratio": ratio},
        ratio is not None and ratio <= 1.03,
        "a training step with every launch paced (1000m cap: timed, never held) "
        "<= 1.03 x without the shim",
    )
