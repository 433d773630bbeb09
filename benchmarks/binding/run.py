"""Binding throughput: the gpupack path versus kube-scheduler alone, on one local cluster.

In one run (hack/localcluster/, webhook registered as the chart registers it):

1. gpupack: GPUs held first. The gpupack scheduler, as the chart runs it (a
   kube-scheduler with the chart's configuration, its extender choosing, reserving and
   binding each GPU share), places N single-GPU pods of an opted-in namespace (the
   webhook rewrites them to 50m shares; the extender creates their capacity pods); they
   are deleted, and their capacity pods stay (grace period one hour). Then, with the
   scheduler stopped, N new pods are created; the scheduler is started again and timed
   from its start to the last of the N pods bound.
2. kube-scheduler: with kube-scheduler stopped, create N plain pods (same CPU and
   memory requests, no GPU) in a namespace that is not opted in; start kube-scheduler
   and time from its start to the last pod bound.

Both times include the scheduler's own start and cache sync. Reports pods per second
for both and `ratio` = gpupack / kube-scheduler. Target: ratio >= 0.8.

Usage: .venv/bin/python -m benchmarks.binding.run [--pods 500]
(needs the binaries: run hack/test or hack/demo once). The last line is one JSON object.
"""

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from benchmarks.pods import pause_pod
from gpupack import keys
from hack.localcluster import (
    SCHEDULER_NAME,
    SYSTEM_NAMESPACE,
    Kube,
    LocalCluster,
    NodePool,
    SimulatedGpuAssigner,
)

TARGET: Final = 0.8
# Room for both runs' pods: 8 nodes x 250 pods, 40 GPUs.
NODES: Final = (
    NodePool("gpu-a100", 4, 8, "NVIDIA-A100-SXM4-80GB", 81920, "96", "1024Gi", pods=250),
    NodePool("gpu-l4", 4, 2, "NVIDIA-L4", 23034, "16", "64Gi", pods=250),
)


SHARE: Final = {keys.GPU_COMPUTE: "50m", keys.GPU_MEMORY: "2Gi"}


def pod(name: str, gpu: bool) -> dict[str, Any]:
    return pause_pod(name, "bench", gpu=gpu, share=SHARE if gpu else None)


def namespace(kube: Kube, opted_in: bool) -> str:
    labels = {"gpupack.io/optimize": "enabled"} if opted_in else {}
    return kube.create_namespace(f"bind-{'in' if opted_in else 'out'}", labels)


def create_pods(kube: Kube, ns: str, count: int, gpu: bool) -> None:
    def one(index: int) -> None:
        kube.create(f"/api/v1/namespaces/{ns}/pods", pod(f"p-{index}", gpu))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


def bound(kube: Kube, ns: str) -> int:
    items = kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    return sum(1 for p in items if p["spec"].get("nodeName"))


def wait_all_bound(kube: Kube, ns: str, count: int, timeout: float = 600) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if bound(kube, ns) >= count:
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(f"only {bound(kube, ns)} of {count} pods bound in {ns}")


def capacity_ready(kube: Kube) -> tuple[int, int]:
    items = kube.get(
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", labelSelector="gpupack.io/role=capacity"
    )["items"]
    ready = sum(
        1
        for p in items
        if p.get("status", {}).get("phase") == "Running"
        and "gpupack.io/gpu-uuid" in (p["metadata"].get("annotations") or {})
    )
    return ready, len(items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=500, help="pods per scheduler")
    args = parser.parse_args(argv)
    log = sys.stderr
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp), node_pools=NODES) as cluster,
    ):
        cluster.install_webhook()
        kube = cluster.kube()
        cluster.exporter_kubeconfig()  # the chart's RBAC for the node agents
        with SimulatedGpuAssigner(cluster.kube(), agent=cluster.node_agent):
            scheduler_args = ["--no-leader-elect", "--grace-period=3600"]
            cluster.install_scheduler(extra_args=scheduler_args)
            warm = namespace(kube, opted_in=True)
            create_pods(kube, warm, args.pods, gpu=True)
            wait_all_bound(kube, warm, args.pods)

            def all_ready() -> bool:
                ready, total = capacity_ready(kube)
                return ready == total > 0

            kube.wait_for("every capacity pod running with its GPU", all_ready, timeout=300)
            kube.delete(f"/api/v1/namespaces/{warm}")
            kube.wait_for(
                "the first pods gone",
                lambda: not kube.get(f"/api/v1/namespaces/{warm}/pods")["items"],
                timeout=300,
            )
            cluster.stop_scheduler(SCHEDULER_NAME)
            ns_in = namespace(kube, opted_in=True)
            create_pods(kube, ns_in, args.pods, gpu=True)
            gpus = capacity_ready(kube)[0]
            print(f"  gpupack: {args.pods} pods pending, {gpus} GPUs held", file=log)
            started = time.monotonic()
            cluster.install_scheduler(extra_args=scheduler_args)
            gpupack_s = wait_all_bound(kube, ns_in, args.pods) - started
            print(
                f"  gpupack (kube-scheduler, extender): {args.pods} bound in {gpupack_s:.2f} s",
                file=log,
            )
            cluster.stop_scheduler(SCHEDULER_NAME)

        scheduler = cluster.processes["kube-scheduler"]
        scheduler.stop()
        ns_out = namespace(kube, opted_in=False)
        create_pods(kube, ns_out, args.pods, gpu=False)
        started = time.monotonic()
        scheduler.start()
        kube_s = wait_all_bound(kube, ns_out, args.pods) - started
        print(f"  kube-scheduler:    {args.pods} pods bound in {kube_s:.2f} s", file=log)
    ratio = kube_s / gpupack_s
    result = {
        "benchmark": "binding",
        "pods": args.pods,
        "gpus_held": gpus,
        "gpupack_seconds": round(gpupack_s, 3),
        "kube_scheduler_seconds": round(kube_s, 3),
        "gpupack_pods_per_second": round(args.pods / gpupack_s, 1),
        "kube_scheduler_pods_per_second": round(args.pods / kube_s, 1),
        "ratio": round(ratio, 3),
        "target": TARGET,
        "meets_target": ratio >= TARGET,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
