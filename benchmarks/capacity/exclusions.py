"""Capacity pods that must avoid existing nodes, and what Karpenter buys for them.

One local cluster (hack/localcluster/: the webhook, gpupack-scheduler as the chart runs
it, simulated GPU discovery) whose own GPU nodes are full: two 8-GPU A100 nodes whose
GPUs another team's whole-GPU pods hold, one 2-GPU L4 node with one GPU held. Karpenter's
kwok provider may buy 2-GPU L4 and 8-GPU A100 nodes (NodePool `gpu`) and 8-GPU H100
nodes (NodePool `h100`). Karpenter starts before gpupack-scheduler. Four cases, one after
another, each in a namespace of its own, deleted (and every bought node gone) before the
next:

1. **pinned**: 10 pods of 500m pinned to L4 GPUs (5 GPUs; the L4 node's free GPU takes
   2 pods): the fewest nodes Karpenter can buy is 2;
2. **anti-affinity**: 3 L4 replicas with required pod anti-affinity on the hostname: 2;
3. **zero**: 4 pods of 250m pinned to H100 GPUs, a type no node has: 1;
4. **near**: a pod that must sit beside `db` on the full L4 node: 0 (no node can help).

For each: NodeClaims Karpenter made against that minimum, seconds until every pod is
bound (null: not within `--timeout`), capacity pods created, and the capacity pods
Karpenter ignored without simulating them (its `FailedScheduling` "... is not allowed"),
with its verdicts on the capacity pods.

Usage: .venv/bin/python -m benchmarks.capacity.exclusions [--timeout 180]
       [--only pinned,anti-affinity,zero,near]
(needs the binaries: run hack/test or hack/demo once). Progress goes to stderr; the last
stdout line is one JSON object.
"""

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from benchmarks.capacity.run import (
    CAPACITY,
    TOLERATE_GPUS,
    bound_all,
    deployment,
    log,
)
from gpupack import keys
from hack.localcluster import Kube, LocalCluster, SimulatedGpuAssigner
from hack.localcluster.karpenter import (
    A100_X8,
    FULL_NODE_POOLS,
    H100_X8,
    L4_X2,
    Karpenter,
    hold_gpus,
)

JSON = dict[str, Any]
HOSTNAME: Final = "kubernetes.io/hostname"
L4: Final = {keys.GFD_PRODUCT: "NVIDIA-L4"}
H100: Final = {keys.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3"}


def _affinity(kind: str, app: str) -> JSON:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME}
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def pinned(ns: str) -> list[JSON]:
    return [deployment(ns, "l4", 10, "500m", nodeSelector=L4, tolerations=[TOLERATE_GPUS])]


def anti_affinity(ns: str) -> list[JSON]:
    spec = {"nodeSelector": L4, "tolerations": [TOLERATE_GPUS]}
    return [
        deployment(ns, "solo", 3, "500m", affinity=_affinity("podAntiAffinity", "solo"), **spec)
    ]


def zero(ns: str) -> list[JSON]:
    return [deployment(ns, "h100", 4, "250m", nodeSelector=H100, tolerations=[TOLERATE_GPUS])]


def near(ns: str) -> list[JSON]:
    return [
        deployment(ns, "db", 1, "500m", nodeSelector=L4, tolerations=[TOLERATE_GPUS]),
        deployment(
            ns,
            "near",
            1,
            "600m",
            affinity=_affinity("podAffinity", "db"),
            tolerations=[TOLERATE_GPUS],
        ),
    ]


# name -> (workloads, pods that can be bound, the fewest nodes Karpenter can buy)
CASES: Final[dict[str, tuple[Callable[[str], list[JSON]], int, int]]] = {
    "pinned": (pinned, 10, 2),
    "anti-affinity": (anti_affinity, 3, 2),
    "zero": (zero, 4, 1),
    "near": (near, 1, 0),
}


def run_case(local: LocalCluster, karpenter: Karpenter, name: str, timeout: float) -> JSON:
    kube = local.kube()
    make, placeable, fewest = CASES[name]
    ns = kube.create_namespace(f"bench-{name}", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    seen: set[str] = set()
    try:
        started = time.monotonic()
        for manifest in make(ns):
            kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", manifest)
        deadline = started + timeout
        seconds = None
        while time.monotonic() < deadline:
            seen |= {p["metadata"]["name"] for p in _capacity(kube, local.namespace)}
            if bound_all(kube, ns, placeable, 0.5) is not None:
                seconds = round(time.monotonic() - started, 1)
                break
        if name == "near":  # nothing to bind: give Karpenter its batch window, then look
            time.sleep(min(30.0, timeout))
            seen |= {p["metadata"]["name"] for p in _capacity(kube, local.namespace)}
        verdicts = [
            e for e in karpenter.refusals(local.namespace) if e["involvedObject"]["name"] in seen
        ]
        ignored = {
            e["involvedObject"]["name"]
            for e in karpenter.ignored(local.namespace)
            if e["involvedObject"]["name"] in seen
        }
        return {
            "nodes_bought": len(karpenter.claims()),
            "fewest_nodes": fewest,
            "seconds_to_all_bound": None if name == "near" else seconds,
            "capacity_pods_created": len(seen),
            "capacity_pods_ignored_by_karpenter": len(ignored),
            "karpenter_verdicts": sorted({e["message"][:240] for e in verdicts}),
        }
    finally:
        kube.delete(f"/api/v1/namespaces/{ns}")
        kube.wait_for(
            "the capacity released", lambda: not _capacity(kube, local.namespace), timeout=180
        )
        kube.wait_for("the bought nodes gone", lambda: not karpenter.nodes(), timeout=300)
        kube.wait_for("the NodeClaims gone", lambda: not karpenter.claims(), timeout=120)


def _capacity(kube: Kube, system: str) -> list[JSON]:
    found: list[JSON] = kube.get(f"/api/v1/namespaces/{system}/pods", labelSelector=CAPACITY)[
        "items"
    ]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds a case may take (180)"
    )
    parser.add_argument("--only", default=",".join(CASES), help="cases, comma-separated (all)")
    args = parser.parse_args(argv)
    chosen = [c.strip() for c in args.only.split(",") if c.strip()]
    if unknown := set(chosen) - set(CASES):
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    results: JSON = {}
    with (
        tempfile.TemporaryDirectory(prefix="gpupack-bench-exclusions-") as tmp,
        LocalCluster(Path(tmp), node_pools=FULL_NODE_POOLS) as local,
    ):
        hold_gpus(local.kube())
        local.install_webhook()
        karpenter = Karpenter(
            local, instance_types=(L4_X2, A100_X8), more_pools={"h100": (H100_X8,)}
        )
        karpenter.start()
        try:
            # Short grace periods: each case waits for its capacity to be released and
            # Karpenter's nodes to go before the next.
            local.install_scheduler(
                extra_args=("--no-leader-elect",),
                sets=["scheduler.gracePeriodSeconds=10", "scheduler.unusedGraceSeconds=10"],
            )
            local.exporter_kubeconfig()  # the chart's RBAC for the node agents
            with SimulatedGpuAssigner(
                Kube.from_kubeconfig(local.kubeconfig), agent=local.node_agent
            ):
                for name in chosen:
                    log(f"case {name}")
                    results[name] = run_case(local, karpenter, name, args.timeout)
                    log(json.dumps(results[name]))
        finally:
            karpenter.stop()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
