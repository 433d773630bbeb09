"""Capacity under placement rules and bursts: what gpupack holds versus what it needs.

Four scenarios, each on a fresh local cluster (hack/localcluster/: the webhook, the
gpupack scheduler as the chart runs it, kwok GPU nodes, simulated GPU discovery):

1. **rules**: 13 pods of 300m in one opted-in namespace, under the placement rules users
   write, on four 8-GPU A100 nodes in two zones, one of them cordoned: 3 replicas with
   required pod anti-affinity on the hostname, 3 spread over the zones
   (`DoNotSchedule`), 2 with a host port, 2 plain ones, and 2 pods that must sit on the
   node of a database pod (required pod affinity). The database pod is pinned to node 0
   and placed first; another team's 7 whole-GPU pods hold the rest of node 0, so that
   node is full. 10 pods can be placed: the 2 pods next to the database cannot (no new
   GPU could help them), nor the third anti-affinity replica (only nodes 1 and 2 have
   GPUs and take pods; an autoscaler could add a node for it). Timed from the creation
   of the 12 after the database.
2. **burst**: `--burst` replicas (default 40) of a 250m Deployment on A100 nodes, at once.
3. **karpenter**: the same burst in a cluster that starts with no GPU node at all, where
   Karpenter's kwok provider buys 8-GPU A100 nodes (tainted `nvidia.com/gpu`, which the
   burst tolerates) for capacity pods that fit nowhere.
3b. **karpenter-full**: the same burst where the cluster's own GPU nodes (two 8-GPU A100,
   two 2-GPU L4) are full of another team's whole-GPU pods and Karpenter may buy A100
   and L4 nodes. The L4 nodes are infeasible for the A100-pinned pods, so their
   capacity pods have nodes to avoid; it also reports the capacity pods Karpenter
   ignored unsimulated (its `FailedScheduling` "... is not allowed"), and stops waiting
   after `--timeout` seconds (pods never bound: `seconds_to_all_bound` null).

4. **churn**: four Deployments of 8 pods of 300m (one pool) on nodes Karpenter buys, then
   scaled down to 2 replicas each, under a GPUPolicy whose consolidation is `Off`;
   after `--settle` seconds, what is held; then the policy's consolidation is turned
   `On` (budget 2 evictions per workload per 30 s) and, `--settle` seconds later, what
   is held again, and the evictions it took. The scheduler runs with the chart's values
   `scheduler.gracePeriodSeconds=30` and `scheduler.consolidation.intervalSeconds=5`,
   so capacity emptied by the scale-down itself is released within the settle time.

Each of the first four reports: capacity pods created (every name seen), GPUs held
(capacity pods on a node) at peak, at the moment every placeable pod is bound and
`--settle` seconds later (default 60), capacity pods still pending then (GPUs asked
for, which an autoscaler would buy if it could), GPUs in use (holding at least one
bound share), GPU nodes in use, seconds until every placeable pod is bound, and the
lower bounds they are measured against in the same run: the GPUs the shares need under
gpupack's own packing (`gpupack.packing.plan`, one pool) and the nodes those GPUs need
(and, for rules, the 3 nodes its anti-affinity needs). Ratios are held / lower bound.

Usage: .venv/bin/python -m benchmarks.capacity.run [--burst 40] [--settle 60]
       [--only rules,burst,karpenter,karpenter-full,churn] [--timeout 300]
(needs the binaries: run hack/test or hack/demo once). Progress goes to stderr; the last
stdout line is one JSON object.
"""

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gpupack import keys
from gpupack.packing import Allocation, plan
from gpupack.policy import BUILTIN, policy_spec
from hack.localcluster import Kube, LocalCluster, NodePool, SimulatedGpuAssigner
from hack.localcluster.karpenter import A100_X8, L4_X2, Karpenter, hold_gpus

JSON = dict[str, Any]
A100: Final = "NVIDIA-A100-SXM4-80GB"
GPUS_PER_NODE: Final = 8
NODES: Final = (NodePool("gpu-a100", 4, GPUS_PER_NODE, A100, 81920, "96", "1024Gi"),)
ZONE: Final = "topology.kubernetes.io/zone"
HOSTNAME: Final = "kubernetes.io/hostname"
TOLERATE_GPUS: Final = {"key": keys.NVIDIA_GPU, "operator": "Exists", "effect": "NoSchedule"}
CAPACITY: Final = f"{keys.ROLE}={keys.ROLE_CAPACITY}"
SCHEDULER_ARGS: Final = ("--no-leader-elect",)


def log(message: str) -> None:
    print(f"[capacity] {message}", file=sys.stderr, flush=True)


def pod_template(app: str, compute: str, **spec: Any) -> JSON:
    """A one-GPU pod the webhook rewrites to a `compute` share (policy batch)."""
    return {
        "metadata": {
            "labels": {"app": app},
            "annotations": {keys.POLICY: "batch", keys.GPU_COMPUTE: compute},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "16Mi", keys.NVIDIA_GPU: "1"},
                        "limits": {keys.NVIDIA_GPU: "1"},
                    },
                    **spec.pop("container", {}),
                }
            ],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


def deployment(ns: str, app: str, replicas: int, compute: str = "300m", **spec: Any) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": pod_template(app, compute, **spec),
        },
    }


def _term(app: str) -> JSON:
    return {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME}


def rules_workloads(ns: str) -> list[JSON]:
    """13 pods of 300m under the rules users write (see the module's docstring)."""
    return [
        deployment(ns, "db", 1, nodeSelector={HOSTNAME: "gpu-a100-0"}),
        deployment(
            ns,
            "spread",
            3,
            affinity={
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [_term("spread")]
                }
            },
        ),
        deployment(
            ns,
            "zoned",
            3,
            topologySpreadConstraints=[
                {
                    "maxSkew": 1,
                    "topologyKey": ZONE,
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": "zoned"}},
                }
            ],
        ),
        deployment(
            ns,
            "near-db",
            2,
            affinity={
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_term("db")]}
            },
        ),
        deployment(
            ns, "ports", 2, container={"ports": [{"containerPort": 8080, "hostPort": 8080}]}
        ),
        deployment(ns, "plain", 2),
    ]


@dataclass
class Sample:
    held: int  # capacity pods on a node: GPUs held
    asked: int  # capacity pods not on a node yet: GPUs asked for (bought, with an autoscaler)
    in_use: int  # GPUs holding a bound share
    nodes: int  # nodes with a capacity pod on them
    bound: int  # the namespace's pods bound


@dataclass
class Watch:
    """Polls the cluster every `interval` seconds: capacity pods, shares, nodes."""

    kube: Kube
    namespace: str
    system: str
    interval: float = 0.5
    seen: set[str] = field(default_factory=set)
    peak: int = 0  # the most GPUs held at once
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self, kube: Kube | None = None) -> Sample:
        """One sample, read with `kube` (default: the watch's own client, which only
        its polling thread uses)."""
        kube = kube or self.kube
        capacity = [
            p
            for p in kube.get(f"/api/v1/namespaces/{self.system}/pods", labelSelector=CAPACITY)[
                "items"
            ]
            if not p["metadata"].get("deletionTimestamp")
        ]
        self.seen.update(p["metadata"]["name"] for p in capacity)
        pods = kube.get(f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        bound = [p for p in pods if p["spec"].get("nodeName")]
        holders = {(p["metadata"].get("annotations") or {}).get(keys.CAPACITY_POD) for p in bound}
        nodes = {p["spec"]["nodeName"] for p in capacity if p["spec"].get("nodeName")}
        on_node = [p for p in capacity if p["spec"].get("nodeName")]
        return Sample(
            len(on_node),
            len(capacity) - len(on_node),
            len(holders - {None}),
            len(nodes),
            len(bound),
        )

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    self.peak = max(self.peak, self.sample().held)
                except Exception as error:  # a sample lost is not a benchmark lost
                    log(f"sample failed: {error}")
        finally:
            self.kube.close()  # this thread's connection (the client keeps one per thread)

    @contextmanager
    def running(self) -> Iterator["Watch"]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()


def bound_all(kube: Kube, ns: str, count: int, timeout: float) -> float | None:
    """Seconds until `count` pods of `ns` are bound, None after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        pods = kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        if sum(1 for p in pods if p["spec"].get("nodeName")) >= count:
            return round(time.monotonic() - start, 1)
        time.sleep(0.5)
    return None


def lower_bound(shares: list[int]) -> int:
    allocations = [
        Allocation(f"p{i}", milli, 0, "ns/Deployment/x") for i, milli in enumerate(shares)
    ]
    return plan((), allocations, new_gpu_memory=None).missing


def measure(
    cluster: LocalCluster,
    workloads: Callable[[str], list[JSON]],
    count: int,
    *,
    settle: float,
    timeout: float,
    first: int = 0,
) -> JSON:
    """Create the workloads (the `first` pods' Deployment alone, and wait until they are
    bound), wait until `count` pods (the placeable ones) are bound, then `settle` seconds
    more. The time is counted from the creation of the rest."""
    kube = cluster.kube()
    ns = kube.create_namespace("bench-capacity", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    watch = Watch(Kube.from_kubeconfig(cluster.kubeconfig), ns, cluster.namespace)
    manifests = workloads(ns)
    with watch.running():
        if first:
            kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", manifests.pop(0))
            if bound_all(kube, ns, first, 120) is None:
                raise SystemExit(f"the first {first} pod(s) were not bound in 120 s")
        for manifest in manifests:
            kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", manifest)
        seconds = bound_all(kube, ns, count, timeout)
        at_bound = watch.sample(kube)
        log(f"{count} pods bound after {seconds} s; settling {settle:g} s")
        time.sleep(settle)
        settled = watch.sample(kube)
    return {
        "placeable_pods": count,
        "seconds_to_all_bound": seconds,
        "capacity_pods_created": len(watch.seen),
        "gpus_held_peak": max(watch.peak, at_bound.held, settled.held),
        "gpus_held_when_bound": at_bound.held,
        "gpus_held_settled": settled.held,
        "capacity_pods_pending_settled": settled.asked,
        "gpus_in_use": settled.in_use,
        "gpu_nodes_in_use": settled.nodes,
        "pods_bound": settled.bound,
    }


def with_bounds(result: JSON, gpus: int, nodes: int) -> JSON:
    result |= {"gpus_lower_bound": gpus, "nodes_lower_bound": nodes}
    result["held_peak_ratio"] = round(result["gpus_held_peak"] / gpus, 2)
    result["held_settled_ratio"] = round(result["gpus_held_settled"] / gpus, 2)
    result["nodes_ratio"] = round(result["gpu_nodes_in_use"] / nodes, 2)
    return result


@contextmanager
def cluster(
    workdir: Path,
    node_pools: tuple[NodePool, ...],
    autoscaler: Callable[[LocalCluster], Karpenter] | None = None,
) -> Iterator[tuple[LocalCluster, Karpenter | None]]:
    """The webhook, then `autoscaler` started (before gpupack-scheduler, whose chart
    default `--autoscaler=auto` then finds Karpenter, as in a cluster that runs it), then
    the scheduler."""
    with LocalCluster(workdir, node_pools=node_pools) as local:
        local.install_webhook()
        bought = autoscaler(local).start() if autoscaler is not None else None
        try:
            local.install_scheduler(extra_args=SCHEDULER_ARGS)
            local.exporter_kubeconfig()  # the chart's RBAC for the node agents
            with SimulatedGpuAssigner(
                Kube.from_kubeconfig(local.kubeconfig), agent=local.node_agent
            ):
                yield local, bought
        finally:
            if bought is not None:
                bought.stop()


def rules(workdir: Path, settle: float) -> JSON:
    with cluster(workdir, NODES) as (local, _):
        kube = local.kube()
        for index in range(NODES[0].count):
            name = f"gpu-a100-{index}"
            labels = {ZONE: "zone-a" if index % 2 == 0 else "zone-b"}
            kube.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": labels}})
        kube.merge_patch("/api/v1/nodes/gpu-a100-3", {"spec": {"unschedulable": True}})
        hold_gpus(kube, [("gpu-a100-0", GPUS_PER_NODE - 1)])  # another team's whole GPUs
        result = measure(local, rules_workloads, 10, settle=settle, timeout=360, first=1)
    gpus = lower_bound([300] * 9) + 1  # the database's pool is its own (pinned)
    return with_bounds(result, gpus, max(3, math.ceil(gpus / GPUS_PER_NODE)))


def burst_workloads(replicas: int) -> Callable[[str], list[JSON]]:
    def make(ns: str) -> list[JSON]:
        return [
            deployment(
                ns,
                "burst",
                replicas,
                "250m",
                nodeSelector={"nvidia.com/gpu.product": A100},
                tolerations=[TOLERATE_GPUS],  # Karpenter's GPU nodes carry the taint
            )
        ]

    return make


def burst(workdir: Path, replicas: int, settle: float) -> JSON:
    with cluster(workdir, NODES) as (local, _):
        result = measure(local, burst_workloads(replicas), replicas, settle=settle, timeout=360)
    gpus = lower_bound([250] * replicas)
    return with_bounds(result, gpus, math.ceil(gpus / GPUS_PER_NODE))


def karpenter(workdir: Path, replicas: int, settle: float) -> JSON:
    with cluster(workdir, (), autoscaler=Karpenter) as (local, autoscaler):
        assert autoscaler is not None
        result = measure(local, burst_workloads(replicas), replicas, settle=settle, timeout=480)
        result |= karpenter_verdicts(local, autoscaler)
    gpus = lower_bound([250] * replicas)
    return with_bounds(result, gpus, math.ceil(gpus / GPUS_PER_NODE))


# Existing GPU nodes of two models, every GPU held by another team's whole-GPU pods.
FULL_NODES: Final = (
    NodePool("gpu-a100", 2, GPUS_PER_NODE, A100, 81920, "96", "1024Gi"),
    NodePool("gpu-l4", 2, 2, "NVIDIA-L4", 23034, "16", "64Gi"),
)


def karpenter_full(workdir: Path, replicas: int, settle: float, timeout: float) -> JSON:
    """The burst (pinned to A100 GPUs) where the cluster's own GPU nodes, A100 and L4,
    are full and Karpenter may buy A100 and L4 nodes: the L4 nodes are infeasible for
    the pods, so their capacity pods have nodes to avoid."""
    with cluster(
        workdir, FULL_NODES, autoscaler=lambda c: Karpenter(c, instance_types=(L4_X2, A100_X8))
    ) as (local, autoscaler):
        assert autoscaler is not None
        hold_gpus(
            local.kube(),
            [(f"{p.prefix}-{i}", p.gpus) for p in FULL_NODES for i in range(p.count)],
        )
        result = measure(local, burst_workloads(replicas), replicas, settle=settle, timeout=timeout)
        result |= karpenter_verdicts(local, autoscaler)
    gpus = lower_bound([250] * replicas)
    return with_bounds(result, gpus, math.ceil(gpus / GPUS_PER_NODE))


def karpenter_verdicts(cluster: LocalCluster, autoscaler: Karpenter) -> JSON:
    """What Karpenter decided: nodes bought (NodeClaims), and the capacity pods it
    ignored unsimulated (its `FailedScheduling` "... is not allowed")."""
    ignored = {e["involvedObject"]["name"] for e in autoscaler.ignored(cluster.namespace)}
    return {
        "nodes_bought": len(autoscaler.claims()),
        "capacity_pods_ignored_by_karpenter": len(ignored),
    }


CHURN_POLICY: Final = "bench-churn"


def churn_policy(kube: Kube, system: str, mode: str) -> None:
    """Create, or set the consolidation mode of, the scenario's GPUPolicy."""
    spec = policy_spec(BUILTIN["batch"])
    spec["consolidation"] = {"mode": mode, "windowSeconds": 30, "evictionsPerWindow": 2}
    path = f"/apis/gpupack.io/v1alpha1/namespaces/{system}/gpupolicies"
    if mode == "Off":
        body = {
            "apiVersion": "gpupack.io/v1alpha1",
            "kind": "GPUPolicy",
            "metadata": {"name": CHURN_POLICY, "namespace": system},
            "spec": spec,
        }
        kube.create(path, body)
    else:
        kube.merge_patch(
            f"{path}/{CHURN_POLICY}", {"spec": {"consolidation": spec["consolidation"]}}
        )


def churn(workdir: Path, settle: float) -> JSON:
    """Scenario 4: GPUs and nodes held after a scale-down, consolidation off then on."""
    with LocalCluster(workdir, node_pools=()) as local:
        local.install_webhook()
        local.install_scheduler(
            extra_args=SCHEDULER_ARGS,
            sets=["scheduler.gracePeriodSeconds=30", "scheduler.consolidation.intervalSeconds=5"],
        )
        kube = local.kube()
        churn_policy(kube, local.namespace, "Off")
        local.exporter_kubeconfig()  # the chart's RBAC for the node agents
        autoscaler = Karpenter(local).start()
        try:
            with SimulatedGpuAssigner(
                Kube.from_kubeconfig(local.kubeconfig), agent=local.node_agent
            ):
                ns = kube.create_namespace("bench-churn", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
                watch = Watch(kube, ns, local.namespace)
                for index in range(4):
                    made = deployment(ns, f"w{index}", 8, "300m", tolerations=[TOLERATE_GPUS])
                    made["spec"]["template"]["metadata"]["annotations"][keys.POLICY] = CHURN_POLICY
                    kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", made)
                if bound_all(kube, ns, 32, 480) is None:
                    raise SystemExit("the 32 pods were not bound in 480 s")
                full = watch.sample()
                bought = len(autoscaler.nodes())
                for index in range(4):
                    scale = {"spec": {"replicas": 2}}
                    kube.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/w{index}", scale)
                log(f"32 pods on {full.held} GPUs, {bought} nodes; scaled to 8; settling")
                time.sleep(settle)
                off = watch.sample()
                nodes_off = len(autoscaler.nodes())
                churn_policy(kube, local.namespace, "On")
                log(f"consolidation Off: {off.held} GPUs, {nodes_off} nodes; turned On")
                started = time.monotonic()
                time.sleep(settle)
                on = watch.sample()
                nodes_on = len(autoscaler.nodes())
                moved = [
                    e
                    for e in kube.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
                    if e.get("reason") == "GPUConsolidation"
                ]
        finally:
            autoscaler.stop()
    gpus = lower_bound([300] * 8)
    return {
        "pods_before_scale_down": 32,
        "gpus_held_before_scale_down": full.held,
        "nodes_bought": bought,
        "pods_after_scale_down": 8,
        "gpus_lower_bound": gpus,
        "nodes_lower_bound": math.ceil(gpus / GPUS_PER_NODE),
        "consolidation_off": {"gpus_held": off.held, "gpu_nodes": nodes_off},
        "consolidation_on": {
            "gpus_held": on.held,
            "gpu_nodes": nodes_on,
            "evictions": len(moved),
            "seconds": round(time.monotonic() - started, 1),
        },
    }


SCENARIOS: Final = ("rules", "burst", "karpenter", "karpenter-full", "churn")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=40, help="replicas of the burst (default 40)")
    parser.add_argument(
        "--settle", type=float, default=60.0, help="seconds measured after every pod is bound (60)"
    )
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"scenarios, comma-separated (default: all: {', '.join(SCENARIOS)})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds karpenter-full waits for every pod to be bound (300)",
    )
    args = parser.parse_args(argv)
    if args.burst < 1:
        parser.error("--burst must be at least 1")
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    results: JSON = {}
    with tempfile.TemporaryDirectory(prefix="gpupack-bench-capacity-") as tmp:
        for name in chosen:
            log(f"scenario {name}")
            workdir = Path(tmp) / name
            workdir.mkdir()
            if name == "rules":
                results[name] = rules(workdir, args.settle)
            elif name == "burst":
                results[name] = burst(workdir, args.burst, args.settle)
            elif name == "churn":
                results[name] = churn(workdir, args.settle)
            elif name == "karpenter-full":
                results[name] = karpenter_full(workdir, args.burst, args.settle, args.timeout)
            else:
                results[name] = karpenter(workdir, args.burst, args.settle)
            log(json.dumps(results[name]))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
