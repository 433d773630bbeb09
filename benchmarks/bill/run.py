"""The bill over time, live: `python -m benchmarks.bill.run`.

One local cluster (hack/localcluster/) with no GPU node of its own, Karpenter's kwok
provider buying 8-GPU nodes (`consolidationPolicy: WhenEmptyOrUnderutilized`,
`consolidateAfter` 30 s) in two NodePools of two products, the webhook and
gpupack-scheduler with the chart's default values. A trace of Deployments
(`benchmarks.bill.trace`) is replayed twice at the same moments: in an opted-in
namespace on H100 nodes (gpupack: shares, capacity pods) and in a plain namespace on
A100 nodes (whole GPUs, kube-scheduler alone). Each pod pins its share (gpu-compute,
gpu-memory) and asks `nvidia.com/gpu: 1`, so both sides run the same pods.

Every `--interval` seconds a look at the cluster (`sample`) counts, per side, Karpenter's
NodeClaims (the nodes billed), the GPUs held (running capacity pods; whole-GPU pods on a
node), what ran and its bound (`tally`), each pod's wait from creation to scheduled, and
any share bound to a GPU no running capacity pod holds. After the last departure it keeps
looking until both sides' nodes are gone. The moves are the Events of each namespace:
gpupack's `GPUConsolidation` and Karpenter's evictions. The same trace also runs through
the churn simulator (`benchmarks.churn.replay`: placement only, no capacity lifecycle,
no autoscaler) for the side-by-side in docs/scheduler.md.

Usage: .venv/bin/python -m benchmarks.bill.run [--mix short|long|openb] [--workloads 96]
       [--duration 900] [--scale 1.0] [--seed 1] [--interval 2] [--nodes-timeout 600]
(needs the binaries: run hack/test or hack/demo once). Progress goes to stderr; the last
stdout line is one JSON object.
"""

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from benchmarks.bill.simulated import simulated
from benchmarks.bill.tally import Seen, Side, compare
from benchmarks.bill.trace import MIXES, Workload, bound_gpus, trace
from benchmarks.capacity.run import TOLERATE_GPUS, deployment
from benchmarks.openb.trace import DEFAULT_PODS
from gpupack import keys
from gpupack.codec import parse_time
from gpupack.quantity import format_memory, parse_compute, parse_memory
from hack.localcluster import Kube, LocalCluster, SimulatedGpuAssigner
from hack.localcluster.karpenter import A100_X8, H100_X8, Karpenter

JSON = dict[str, Any]
SIDES: Final = ("gpupack", "whole")
NODEPOOL: Final = {"gpupack": "gpu", "whole": "whole"}
PRODUCT: Final = {"gpupack": H100_X8.product, "whole": A100_X8.product}
CONSOLIDATE_AFTER: Final = 30.0
GPUS_PER_NODE: Final = 8


def log(message: str) -> None:
    print(f"[bill] {message}", file=sys.stderr, flush=True)


def manifest(side: str, namespace: str, workload: Workload) -> JSON:
    made = deployment(
        namespace,
        workload.name,
        workload.replicas,
        f"{workload.compute}m",
        nodeSelector={keys.GFD_PRODUCT: PRODUCT[side]},
        tolerations=[TOLERATE_GPUS],
    )
    annotations = made["spec"]["template"]["metadata"]["annotations"]
    del annotations[keys.POLICY]  # the built-in the webhook detects, as users get
    annotations[keys.GPU_MEMORY] = format_memory(workload.memory)
    return made


class Replay:
    """The cluster's state as samples, per side, from the replay's start."""

    def __init__(self, kube: Kube, namespaces: dict[str, str], system: str) -> None:
        self.kube = kube
        self.namespaces = namespaces
        self.system = system
        self.sides = {side: Side(GPUS_PER_NODE) for side in SIDES}
        self.started = time.monotonic()
        self.last_departure: float | None = None
        self._last = self.started
        self._gone: dict[str, float] = {}
        self._stop = threading.Event()

    def sample(self) -> dict[str, Seen]:
        kube = self.kube
        claims = kube.get("/apis/karpenter.sh/v1/nodeclaims")["items"]
        nodes = dict.fromkeys(SIDES, 0)
        for claim in claims:
            pool = (claim["metadata"].get("labels") or {}).get("karpenter.sh/nodepool")
            for side in SIDES:
                nodes[side] += pool == NODEPOOL[side]
        capacity = kube.get(
            f"/api/v1/namespaces/{self.system}/pods",
            labelSelector=f"{keys.ROLE}={keys.ROLE_CAPACITY}",
        )["items"]
        held = {
            p["metadata"]["name"]
            for p in capacity
            if p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Running"
        }
        seen: dict[str, Seen] = {}
        now = time.time()
        for side in SIDES:
            pods = kube.get(f"/api/v1/namespaces/{self.namespaces[side]}/pods")["items"]
            running = [
                p
                for p in pods
                if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
            ]
            self._waits(side, pods, now)
            if side == "gpupack":
                shares = [_share(p) for p in running]
                orphans = sum(
                    1
                    for p in running
                    if (p["metadata"].get("annotations") or {}).get(keys.CAPACITY_POD) not in held
                )
                seen[side] = Seen(nodes[side], len(held), bound_gpus(shares), len(running), orphans)
            else:
                seen[side] = Seen(nodes[side], len(running), len(running), len(running))
        return seen

    def _waits(self, side: str, pods: list[JSON], now: float) -> None:
        """Each pod's wait: creation to PodScheduled, or to now while it waits."""
        waits = self.sides[side].waits
        for pod in pods:
            created = parse_time(pod["metadata"].get("creationTimestamp", ""))
            if created is None:
                continue
            scheduled = None
            for condition in (pod.get("status") or {}).get("conditions") or ():
                if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
                    scheduled = parse_time(condition.get("lastTransitionTime", ""))
            waits[pod["metadata"]["uid"]] = max(0.0, (scheduled or now) - created)

    def look(self) -> bool:
        """One sample added to the sums; whether every side's nodes are gone after the
        last departure."""
        seen = self.sample()
        now = time.monotonic()
        if self.last_departure is not None:  # what still holds nodes, as it drains away
            log(
                f"+{now - self.last_departure:5.1f}s after the last departure: "
                + ", ".join(f"{s} {one.nodes} nodes {one.gpus} GPUs" for s, one in seen.items())
            )
        for side, one in seen.items():
            self.sides[side].add(one, now - self._last)
            if self.last_departure is not None and side not in self._gone and one.nodes == 0:
                self._gone[side] = now
                self.sides[side].nodes_gone_after = now - self.last_departure
            elif one.nodes:
                self._gone.pop(side, None)  # bought again: not gone yet
        self._last = now
        return self.last_departure is not None and len(self._gone) == len(SIDES)

    @contextmanager
    def sampling(self, interval: float) -> Iterator["Replay"]:
        def run() -> None:
            try:
                while not self._stop.wait(interval):
                    try:
                        self.look()
                    except Exception as error:  # a sample lost is not a benchmark lost
                        log(f"sample failed: {error}")
            finally:
                self.kube.close()  # this thread's connection (the client keeps one per thread)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    def count_moves(self) -> None:
        for side in SIDES:
            namespace = self.namespaces[side]
            events = self.kube.get(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
            for event in events["items"]:
                if event.get("reason") not in ("GPUConsolidation", "Evicted"):
                    continue
                pod = str((event.get("regarding") or {}).get("name", ""))
                workload = pod.rsplit("-", 2)[0]
                moves = self.sides[side].moves
                moves[workload] = moves.get(workload, 0) + 1


def _share(pod: JSON) -> tuple[int, int]:
    annotations = pod["metadata"].get("annotations") or {}
    compute = parse_compute(annotations.get(keys.GPU_COMPUTE, "0"), keys.GPU_COMPUTE)
    memory = parse_memory(annotations.get(keys.GPU_MEMORY, "0"), keys.GPU_MEMORY)
    return compute, memory


def replay(workdir: Path, workloads: list[Workload], args: argparse.Namespace) -> dict[str, Side]:
    with LocalCluster(workdir, node_pools=()) as local:
        local.install_webhook()
        karpenter = Karpenter(
            local,
            instance_types=(H100_X8,),
            more_pools={"whole": (A100_X8,)},
            gpu_limit=args.gpu_limit,
            consolidate_after=f"{CONSOLIDATE_AFTER:g}s",
        ).start()  # before gpupack: its --autoscaler=auto finds it
        try:
            local.install_scheduler(extra_args=("--no-leader-elect",))
            local.exporter_kubeconfig()  # the chart's RBAC for the node agents
            with SimulatedGpuAssigner(
                Kube.from_kubeconfig(local.kubeconfig), agent=local.node_agent
            ):
                return _replay(local, karpenter, workloads, args)
        finally:
            karpenter.stop()


def _replay(
    local: LocalCluster, karpenter: Karpenter, workloads: list[Workload], args: argparse.Namespace
) -> dict[str, Side]:
    kube = local.kube()
    namespaces = {
        "gpupack": kube.create_namespace("bill-gpupack", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED}),
        "whole": kube.create_namespace("bill-whole"),
    }
    events = sorted(
        [(w.start, 1, w) for w in workloads] + [(w.end, 0, w) for w in workloads],
        key=lambda e: (e[0], e[1], e[2].name),
    )
    state = Replay(Kube.from_kubeconfig(local.kubeconfig), namespaces, local.namespace)
    with state.sampling(args.interval):
        for at, arrives, workload in events:
            delay = state.started + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for side in SIDES:
                path = f"/apis/apps/v1/namespaces/{namespaces[side]}/deployments"
                if arrives:
                    kube.create(path, manifest(side, namespaces[side], workload))
                else:
                    kube.delete(f"{path}/{workload.name}")
            log(f"t={at:7.1f}s {'+' if arrives else '-'}{workload.name}")
        state.last_departure = time.monotonic()
        state.count_moves()
        state.kube.close()  # the connection count_moves opened in this thread
        log("last departure; waiting for Karpenter to remove every node")
        deadline = time.monotonic() + args.nodes_timeout
        while time.monotonic() < deadline and not all(
            state.sides[s].nodes_gone_after is not None for s in SIDES
        ):
            time.sleep(args.interval)
    for namespace in namespaces.values():
        kube.delete(f"/api/v1/namespaces/{namespace}")
    return state.sides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mix", choices=MIXES, default="short", help="the trace (short)")
    parser.add_argument("--workloads", type=int, default=96, help="Deployments (96)")
    parser.add_argument("--duration", type=float, default=900.0, help="arrivals span (900 s)")
    parser.add_argument("--scale", type=float, default=1.0, help="time scale, (0, 1] (1)")
    parser.add_argument("--seed", type=int, default=1, help="the trace's seed (1)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between looks (2)")
    parser.add_argument(
        "--nodes-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the nodes to go after the last departure (600)",
    )
    parser.add_argument("--gpu-limit", type=int, default=256, help="GPUs per NodePool (256)")
    parser.add_argument(
        "--openb-pods", type=Path, default=DEFAULT_PODS, help="the openb mix's pod list"
    )
    args = parser.parse_args(argv)
    try:
        workloads = trace(
            args.mix, args.workloads, args.duration, args.seed, args.scale, args.openb_pods
        )
    except (ValueError, OSError) as error:
        parser.error(str(error))
    pods = sum(w.replicas for w in workloads)
    log(f"{len(workloads)} workloads, {pods} pods, {args.mix} mix, scale {args.scale:g}")
    with tempfile.TemporaryDirectory(prefix="gpupack-bench-bill-") as tmp:
        sides = replay(Path(tmp), workloads, args)
    result: JSON = {
        "mix": args.mix,
        "workloads": len(workloads),
        "pods": pods,
        "scale": args.scale,
        "seed": args.seed,
        "consolidate_after_seconds": CONSOLIDATE_AFTER,
        **{side: sides[side].report() for side in SIDES},
        "compare": compare(sides["gpupack"], sides["whole"]),
        "simulator": simulated(workloads, GPUS_PER_NODE),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
