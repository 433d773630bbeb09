"""A burst at cluster scale: gpupack's whole path against kube-scheduler, in one run.

On one local cluster (hack/localcluster/: `--nodes` kwok A100 nodes of 8 GPUs, no
capacity at start; the webhook and the gpupack scheduler run as the chart runs them; the
simulated GPU assigner stands in for the nodes' agents):

1. gpupack: `--pods` pods asking `nvidia.com/gpu: 1` with `250m` / `10Gi` shares are
   created at once (`--threads` clients) in an opted-in namespace; timed from the first
   create to the last pod bound. Each pod and capacity pod is followed through a watch,
   and the timeline of its stages is reported as percentiles of seconds after the first
   create: a pod `admitted` (created, as the webhook rewrote it), `refused` (the first
   verdict kube-scheduler wrote on it: no GPU had room yet), `placed` (bound); a capacity
   pod `created`, `bound` (kube-scheduler chose its node), `running` (the node started
   it: kwok here), `named` (its GPU's UUID written).
2. kube-scheduler: as many pods asking one whole GPU each (same CPU and memory) are
   created in a namespace that is not opted in, on the same nodes (their GPUs minus the
   capacity pods'), and timed the same way.

Reports both paces, `ratio` = gpupack's pods per second / kube-scheduler's (target 0.5,
goal 0.8), the capacity pods made against the lower bound (the GPUs the shares need) and
the most that existed at once, and the peak resident memory (VmHWM) of the extender, of
the webhook and of gpupack's two kube-schedulers (fractional pods', capacity pods');
where the CPU went during gpupack's burst (each process of the cluster, and this
benchmark's clients and watch), the CPU per placed pod of both bursts (all processes
together: `cpu_ms_per_placed_pod`, a steadier figure than the pace), the extender's
filter results and requeues, and the writes the API server answered during each burst
(by verb and resource, from its `apiserver_request_total`). Then `memory`
(benchmarks/scale/memory.py): what the extender's and the webhook's own classes keep per
10,000 pods and per 1,000 nodes, built from the cluster's objects at the end, against
the same with every object kept whole.

The stand-in for the node agents (`SimulatedGpuAssigner`) is event-driven: it watches
the capacity pods and names each one when the event that shows it Running arrives, four
writes at a time, each node's labels read once; the timeline's `named` minus `bound`
shows what it costs.

Usage: .venv/bin/python -m benchmarks.scale.run [--nodes 500] [--pods 2000]
(needs the binaries: run hack/test or hack/demo once). The last line is one JSON object.
"""

import argparse
import json
import math
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks.pods import pause_pod
from benchmarks.processes import cpu_seconds
from benchmarks.scale.memory import footprints
from gpupack import keys
from gpupack.runtime.transport import connect
from hack.localcluster import (
    SYSTEM_NAMESPACE,
    Kube,
    LocalCluster,
    NodePool,
    SimulatedGpuAssigner,
)
from hack.localcluster.client import ApiError

TARGET: Final = 0.5
GOAL: Final = 0.8
GPUS_PER_NODE: Final = 8
GPU_MEMORY_MIB: Final = 81920
COMPUTE: Final = "250m"
MEMORY: Final = "10Gi"
CAPACITY_ROLE: Final = "gpupack.io/role"


def pod(name: str, gpu_share: bool) -> dict[str, Any]:
    """A pod asking one GPU: shared (`COMPUTE`, `MEMORY`) where the namespace is opted in."""
    share = {keys.GPU_COMPUTE: COMPUTE, keys.GPU_MEMORY: MEMORY} if gpu_share else None
    return pause_pod(name, "burst", gpu=True, share=share)


@dataclass
class Timeline:
    """What the watch saw, as seconds on this process's monotonic clock."""

    # namespace -> pod uid -> stage -> when
    pods: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    capacity: dict[str, dict[str, float]] = field(default_factory=dict)
    capacity_alive: set[str] = field(default_factory=set)
    capacity_most: int = 0
    bound: dict[str, int] = field(default_factory=dict)  # namespace -> pods bound
    lock: threading.Lock = field(default_factory=threading.Lock)

    def see(self, kind: str, obj: dict[str, Any], now: float) -> None:
        metadata = obj["metadata"]
        uid, namespace = metadata["uid"], metadata["namespace"]
        labels = metadata.get("labels") or {}
        is_capacity = namespace == SYSTEM_NAMESPACE and labels.get(CAPACITY_ROLE) == "capacity"
        with self.lock:
            if is_capacity:
                self._see_capacity(kind, uid, obj, now)
                return
            stages = self.pods.setdefault(namespace, {}).setdefault(uid, {})
            stages.setdefault("admitted", now)
            if kind == "DELETED":
                return
            if "refused" not in stages and _refused(obj):
                stages["refused"] = now
            if "placed" not in stages and obj["spec"].get("nodeName"):
                stages["placed"] = now
                self.bound[namespace] = self.bound.get(namespace, 0) + 1

    def _see_capacity(self, kind: str, uid: str, obj: dict[str, Any], now: float) -> None:
        if kind == "DELETED":
            self.capacity_alive.discard(uid)
            return
        stages = self.capacity.setdefault(uid, {})
        stages.setdefault("created", now)
        self.capacity_alive.add(uid)
        self.capacity_most = max(self.capacity_most, len(self.capacity_alive))
        if "bound" not in stages and obj["spec"].get("nodeName"):
            stages["bound"] = now
        if "running" not in stages and (obj.get("status") or {}).get("phase") == "Running":
            stages["running"] = now
        annotations = obj["metadata"].get("annotations") or {}
        if "named" not in stages and keys.GPU_UUID in annotations:
            stages["named"] = now

    def bound_in(self, namespace: str) -> int:
        with self.lock:
            return self.bound.get(namespace, 0)

    def pods_of(self, namespace: str) -> list[dict[str, float]]:
        with self.lock:
            return list(self.pods.get(namespace, {}).values())


def _refused(obj: dict[str, Any]) -> bool:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return True
    return False


def follow(kube: Kube, timeline: Timeline, stop: threading.Event) -> threading.Thread:
    """Watch every pod from now on into `timeline`, until `stop`."""
    start = kube.get("/api/v1/pods", limit="1")["metadata"]["resourceVersion"]
    ready = threading.Event()

    def run() -> None:
        version = start
        while not stop.is_set():
            try:
                ready.set()
                for kind, obj in kube.watch("/api/v1/pods", version, timeout=60):
                    if kind == "BOOKMARK":
                        version = obj["metadata"]["resourceVersion"]
                        continue
                    if kind == "ERROR":
                        raise RuntimeError(f"the watch failed: {obj}")
                    version = obj["metadata"]["resourceVersion"]
                    timeline.see(kind, obj, time.monotonic())
                    if stop.is_set():
                        return
            except (ApiError, OSError) as error:
                print(f"  watch: {error}; watching again", file=sys.stderr)

    thread = threading.Thread(target=run, name="timeline", daemon=True)
    thread.start()
    ready.wait(10)
    return thread


def burst(
    kube: Kube, namespace: str, count: int, threads: int, gpu_share: bool
) -> tuple[float, float]:
    """Create `count` pods at once; (first create, last create) on the monotonic clock."""
    started = time.monotonic()

    def client(indexes: range) -> None:
        try:
            for index in indexes:
                kube.create(f"/api/v1/namespaces/{namespace}/pods", pod(f"p-{index}", gpu_share))
        finally:
            kube.close()  # this thread's connection

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(client, [range(i, count, threads) for i in range(threads)]))
    return started, time.monotonic()


def wait_bound(timeline: Timeline, namespace: str, count: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if timeline.bound_in(namespace) >= count:
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(
        f"only {timeline.bound_in(namespace)} of {count} pods bound in {namespace} "
        f"after {timeout:g} s"
    )


def percentiles(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)], 2)

    return {"count": len(ordered), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)}


def stages(records: list[dict[str, float]], names: list[str], origin: float) -> dict[str, Any]:
    return {n: percentiles([r[n] - origin for r in records if n in r]) for n in names}


def cpu_per_pod(gpupack: float, kube_scheduler: float, pods: int) -> dict[str, float | None]:
    """Milliseconds of CPU per placed pod in each burst (all processes together), and
    gpupack's over kube-scheduler's."""
    return {
        "gpupack": round(gpupack / pods * 1000, 1),
        "kube_scheduler": round(kube_scheduler / pods * 1000, 1),
        "ratio": round(gpupack / kube_scheduler, 2) if kube_scheduler > 0 else None,
    }


def extender_counts(args: list[str]) -> dict[str, float]:
    """The extender's filter results and requeues, from its metrics endpoint."""
    port = next(a.split("=", 1)[1] for a in args if a.startswith("--metrics-port="))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counts = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith(
            ("gpupack_scheduler_filters_total", "gpupack_scheduler_pods_requeued_total")
        ):
            counts[name.removeprefix("gpupack_scheduler_")] = float(value)
    return counts


def api_requests(kube: Kube) -> dict[str, float]:
    """The API server's requests so far (`apiserver_request_total`), by verb, resource
    and subresource: "PATCH pods/status"."""
    counts: dict[str, float] = {}
    for line in kube.text("GET", "/metrics", content_type="text/plain").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line[len("apiserver_request_total{") :].rpartition("} ")
        labels = dict(part.split("=", 1) for part in labels_text.split(",") if "=" in part)
        label = {k: v.strip('"') for k, v in labels.items()}
        resource = label.get("resource", "")
        if label.get("subresource"):
            resource += "/" + label["subresource"]
        if not resource:
            continue
        key = f"{label.get('verb', '')} {resource}"
        counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def writes_between(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """The requests that change something (not reads or watches) between two
    `api_requests`, most first."""
    reads = ("GET ", "LIST ", "WATCH ")
    grown = {
        key: round(after[key] - before.get(key, 0.0))
        for key in after
        if not key.startswith(reads) and after[key] > before.get(key, 0.0)
    }
    return dict(sorted(grown.items(), key=lambda item: -item[1]))


def peak_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500, help="A100 nodes of 8 GPUs (500)")
    parser.add_argument("--pods", type=int, default=2000, help="pods in each burst (2000)")
    parser.add_argument("--threads", type=int, default=16, help="clients creating pods (16)")
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds a burst may take to bind (1800)"
    )
    args = parser.parse_args(argv)
    for name in ("nodes", "pods", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    needed_gpus = math.ceil(args.pods / 4)  # 250m: four pods a GPU (10Gi: eight by memory)
    if needed_gpus + args.pods > args.nodes * GPUS_PER_NODE:
        parser.error(
            f"{args.nodes} nodes hold {args.nodes * GPUS_PER_NODE} GPUs: too few for "
            f"{needed_gpus} capacity pods and {args.pods} whole-GPU pods"
        )
    pods_per_node = max(110, 4 * math.ceil(args.pods / args.nodes) + 20)
    nodes = (
        NodePool(
            "gpu-a100",
            args.nodes,
            GPUS_PER_NODE,
            "NVIDIA-A100-SXM4-80GB",
            GPU_MEMORY_MIB,
            "96",
            "1024Gi",
            pods=pods_per_node,
        ),
    )
    log = sys.stderr
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp), node_pools=nodes) as cluster,
    ):
        cluster.install_webhook()
        kube = cluster.kube()
        cluster.exporter_kubeconfig()  # the chart's RBAC for the node agents
        with SimulatedGpuAssigner(cluster.kube(), agent=cluster.node_agent):
            cluster.install_scheduler()  # the chart's arguments
            timeline, stop = Timeline(), threading.Event()
            watcher = follow(cluster.kube(), timeline, stop)

            shared = kube.create_namespace("burst-in", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
            cpu_before = cpu_seconds(cluster.processes)
            requests_before = api_requests(kube)
            first, last = burst(kube, shared, args.pods, args.threads, gpu_share=True)
            print(f"  gpupack: {args.pods} pods created in {last - first:.1f} s", file=log)
            done = wait_bound(timeline, shared, args.pods, args.timeout)
            gpupack_s = done - first
            cpu_after = cpu_seconds(cluster.processes)
            requests_after = api_requests(kube)
            gpupack_cpu = {
                name: round(cpu_after[name] - cpu_before.get(name, 0.0), 1)
                for name in sorted(cpu_after, key=lambda n: cpu_before.get(n, 0.0) - cpu_after[n])
            }
            counts = extender_counts(cluster.processes["gpupack-scheduler"].args)
            print(f"  gpupack: all bound in {gpupack_s:.1f} s", file=log)
            shared_pods = timeline.pods_of(shared)
            with timeline.lock:
                capacity = list(timeline.capacity.values())
                made, most = len(capacity), timeline.capacity_most
            gpupack_stages = {
                **stages(shared_pods, ["admitted", "refused", "placed"], first),
                **{
                    f"capacity_{k}": v
                    for k, v in stages(
                        capacity, ["created", "bound", "running", "named"], first
                    ).items()
                },
            }
            extender_mib = peak_mib(cluster.processes["gpupack-scheduler"].pid)
            webhook_mib = peak_mib(cluster.processes["gpupack-webhook"].pid)
            schedulers_mib = {
                kind: peak_mib(cluster.processes[f"gpupack-scheduler-{kind}-scheduler"].pid)
                for kind in ("kube", "capacity")
            }

            whole = kube.create_namespace("burst-out", {})
            k_cpu_before = cpu_seconds(cluster.processes)
            k_first, k_last = burst(kube, whole, args.pods, args.threads, gpu_share=False)
            created = k_last - k_first
            print(f"  kube-scheduler: {args.pods} pods created in {created:.1f} s", file=log)
            k_done = wait_bound(timeline, whole, args.pods, args.timeout)
            kube_s = k_done - k_first
            k_cpu_after = cpu_seconds(cluster.processes)
            kube_cpu = sum(k_cpu_after.values()) - sum(
                k_cpu_before.get(name, 0.0) for name in k_cpu_after
            )
            kube_writes = writes_between(requests_after, api_requests(kube))
            print(f"  kube-scheduler: all bound in {kube_s:.1f} s", file=log)
            whole_pods = timeline.pods_of(whole)
            stop.set()
            watcher.join(timeout=5)
            print("  memory: the components' stores over the cluster's objects", file=log)
            memory = footprints(
                lambda: connect(str(cluster.kubeconfig), user_agent="gpupack-benchmark")
            )

    gpupack_pace, kube_pace = args.pods / gpupack_s, args.pods / kube_s
    ratio = gpupack_pace / kube_pace
    result = {
        "benchmark": "scale",
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS_PER_NODE,
        "pods": args.pods,
        "gpupack_seconds": round(gpupack_s, 1),
        "gpupack_create_seconds": round(last - first, 1),
        "gpupack_pods_per_second": round(gpupack_pace, 1),
        "kube_scheduler_seconds": round(kube_s, 1),
        "kube_scheduler_create_seconds": round(k_last - k_first, 1),
        "kube_scheduler_pods_per_second": round(kube_pace, 1),
        "ratio": round(ratio, 3),
        "target": TARGET,
        "goal": GOAL,
        "meets_target": ratio >= TARGET,
        "capacity_pods_made": made,
        "capacity_pods_most_at_once": most,
        "capacity_lower_bound": needed_gpus,
        "extender_peak_mib": extender_mib,
        "webhook_peak_mib": webhook_mib,
        "kube_scheduler_peak_mib": schedulers_mib["kube"],
        "capacity_scheduler_peak_mib": schedulers_mib["capacity"],
        "gpupack_stages": gpupack_stages,
        "gpupack_cpu_seconds": gpupack_cpu,
        # Every process of the cluster and the benchmark's own, over each burst: steadier
        # than the pace on a machine whose load moves between runs.
        "cpu_ms_per_placed_pod": cpu_per_pod(sum(gpupack_cpu.values()), kube_cpu, args.pods),
        "extender_counts": counts,
        "gpupack_api_writes": writes_between(requests_before, requests_after),
        "kube_scheduler_api_writes": kube_writes,
        "kube_scheduler_stages": stages(whole_pods, ["admitted", "refused", "placed"], k_first),
        "memory": memory,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
