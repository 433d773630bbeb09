"""One recommender round on a large cluster, against reading the same usage.

Measured: `Recommender.tick()` (the real controller, histograms and recommendation)
over in-memory caches of `--workloads` Deployments of `--pods` fractional pods each,
every pod reporting usage every round, with an API that accepts every write. A round
charges each sample to its workload, recomputes every target and writes what changed
or is due for a checkpoint (one simulated minute passes per round, so every history
is checkpointed every fifth round, as with the defaults).

Baseline, measured in the same run and the same process: `parse_exporter_metrics` on
the exporter text carrying exactly those pods' two series, which is what reading the
usage costs before any rightsizing (the recommender pays it too, once per exporter).
`ratio` is a round divided by the baseline, at p50. Also reported: the size of one
GPURecommendation object (JSON) with a week of history, which is what etcd stores per
workload.

Usage: .venv/bin/python -m benchmarks.recommender.run [--workloads 500] [--pods 4]
       [--rounds 30] [--json PATH]
"""

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from gpupack import keys
from gpupack.objects import JSON
from recommender.controller import Recommender, Settings
from recommender.usage import Collected, PodUsage, parse_exporter_metrics

GiB = 1 << 30
NS = "bench"


class Store:
    def __init__(self, objects: list[JSON]) -> None:
        self._objects = {
            f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in objects
        }

    def get(self, key: str) -> JSON | None:
        return self._objects.get(key)

    def items(self) -> list[JSON]:
        return list(self._objects.values())


class Api:
    """Counts GPURecommendation writes (Events are not recommendation writes)."""

    def __init__(self) -> None:
        self.writes = 0
        self.events = 0
        self.last: Any = None

    def create(self, path: str, body: JSON) -> JSON:
        if path.startswith("/apis/events.k8s.io/"):
            self.events += 1
            return body
        self.writes += 1
        self.last = body
        return body

    def patch(self, path: str, body: Any, content_type: str = "") -> JSON:
        self.writes += 1
        self.last = body
        return {}

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return {}


class Source:
    def __init__(self, usage: list[PodUsage]) -> None:
        self.usage = tuple(usage)

    def collect(self) -> Collected:
        return Collected(self.usage, (), 1)

    def describe(self) -> str:
        return "benchmark"

    def close(self) -> None:
        pass


def pod(workload: int, index: int) -> JSON:
    template = f"{workload:05x}"
    return {
        "metadata": {
            "name": f"w{workload}-{template}-{index}",
            "namespace": NS,
            "labels": {"pod-template-hash": template},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": f"w{workload}-{template}", "controller": True}
            ],
            "annotations": {
                keys.DECISION: f"d-{workload}-{index}",
                keys.POLICY: "near-real-time",
                keys.GPU_COMPUTE: "400m",
                keys.GPU_MEMORY: "8Gi",
            },
        },
        "spec": {"schedulerName": keys.SCHEDULER_NAME},
        "status": {"phase": "Running"},
    }


def exposition(usage: list[PodUsage]) -> str:
    lines = ["# TYPE gpupack_pod_gpu_compute_ratio gauge"]
    for u in usage:
        lines.append(
            f'gpupack_pod_gpu_compute_ratio{{namespace="{u.namespace}",pod="{u.pod}",'
            f'container="main",gpu="GPU-0"}} {u.compute}'
        )
    lines.append("# TYPE gpupack_pod_gpu_memory_used_bytes gauge")
    for u in usage:
        lines.append(
            f'gpupack_pod_gpu_memory_used_bytes{{namespace="{u.namespace}",pod="{u.pod}",'
            f'container="main",gpu="GPU-0"}} {u.memory}'
        )
    return "\n".join(lines) + "\n"


def measure(workloads: int, pods: int, rounds: int) -> dict[str, Any]:
    objects = [pod(w, i) for w in range(workloads) for i in range(pods)]
    usage = [
        PodUsage(NS, o["metadata"]["name"], 0.1 + (n % 7) / 20, int((1.5 + n % 5) * GiB))
        for n, o in enumerate(objects)
    ]
    text = exposition(usage)
    now = [1_800_000_000.0]
    api = Api()
    recommender = Recommender(
        api,
        Store(objects),
        Store([]),
        Store([]),
        Source(usage),
        Settings(interval=60, checkpoint_interval=300),
        clock=lambda: now[0],
    )
    for _ in range(7 * 24):  # a week of hourly history first (untimed)
        recommender.tick()
        now[0] += 3600
    ours, baseline = [], []
    writes_before = api.writes
    for _ in range(rounds):
        started = time.perf_counter()
        recommender.tick()
        ours.append(time.perf_counter() - started)
        now[0] += 60
        started = time.perf_counter()
        parsed = parse_exporter_metrics(text)
        baseline.append(time.perf_counter() - started)
        assert len(parsed) == len(objects)
    p50, base50 = statistics.median(ours), statistics.median(baseline)
    size = len(json.dumps(api.last, separators=(",", ":")))
    return {
        "workloads": workloads,
        "pods": workloads * pods,
        "rounds": rounds,
        "round_p50_ms": round(p50 * 1000, 2),
        "round_max_ms": round(max(ours) * 1000, 2),
        "baseline_parse_p50_ms": round(base50 * 1000, 2),
        "ratio": round(p50 / base50, 3),
        "writes_per_round": round((api.writes - writes_before) / rounds, 1),
        "recommendation_object_bytes": size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", type=int, default=500)
    parser.add_argument("--pods", type=int, default=4, help="pods per workload")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the report here")
    args = parser.parse_args(argv)
    if min(args.workloads, args.pods, args.rounds) < 1:
        parser.error("--workloads, --pods and --rounds must be at least 1")
    report = measure(args.workloads, args.pods, args.rounds)
    for key, value in report.items():
        print(f"{key:30} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
