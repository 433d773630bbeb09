"""What the webhook adds to pod creation, measured through a real API server.

One local cluster (hack/localcluster/) with the webhook registered as the chart
registers it. In one run: create N single-GPU pods in an opted-in namespace (each one
admitted through gpupack: decision, patch, capacity planning, capacity pods created as
the pool grows) and N in a namespace that is not opted in (the API server's selectors
skip the webhook), one after another over one keep-alive connection, in alternating
rounds. Reports both times and `ratio` = opted-in / not. Target: ratio <= 1.3.

Usage: .venv/bin/python benchmarks/admission_overhead/run.py [--pods 200] [--rounds 2]
(needs the binaries: run hack/test or hack/demo once, or source hack/lib/binaries.sh).
The last output line is one JSON object.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hack.localcluster import SYSTEM_NAMESPACE, Kube, LocalCluster

TARGET: Final = 1.3


def gpu_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "resources": {
                        "limits": {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"}
                    },
                }
            ],
        },
    }


def namespace(kube: Kube, opted_in: bool) -> str:
    labels = {"gpupack.io/optimize": "enabled"} if opted_in else {}
    return kube.create_namespace(f"bench-{'in' if opted_in else 'out'}", labels)


def create_pods(kube: Kube, ns: str, count: int) -> float:
    started = time.perf_counter()
    for index in range(count):
        kube.create(f"/api/v1/namespaces/{ns}/pods", gpu_pod(f"p-{index}"))
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=200, help="pods per namespace and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (median)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp)) as cluster:
        cluster.install_webhook()
        kube = cluster.kube()
        create_pods(kube, namespace(kube, opted_in=False), 20)  # warm-up: connections, caches
        times: dict[str, list[float]] = {"opted_in": [], "not_opted_in": []}
        for round_ in range(args.rounds):
            order = (True, False) if round_ % 2 == 0 else (False, True)
            for opted_in in order:
                ns = namespace(kube, opted_in)
                seconds = create_pods(kube, ns, args.pods)
                key = "opted_in" if opted_in else "not_opted_in"
                times[key].append(seconds)
                print(
                    f"  round {round_ + 1} {key:12s}: {args.pods} pods in {seconds:.2f} s",
                    file=sys.stderr,
                )
        capacity = len(kube.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods")["items"])
    opted, plain = statistics.median(times["opted_in"]), statistics.median(times["not_opted_in"])
    result = {
        "benchmark": "admission-overhead",
        "pods": args.pods,
        "rounds": args.rounds,
        "opted_in_s": round(opted, 3),
        "not_opted_in_s": round(plain, 3),
        "opted_in_ms_per_pod": round(opted / args.pods * 1000, 2),
        "not_opted_in_ms_per_pod": round(plain / args.pods * 1000, 2),
        "capacity_pods_created": capacity,
        "ratio": round(opted / plain, 3),
        "target": TARGET,
        "meets_target": opted / plain <= TARGET,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
