"""What the scheduler's integration tests share: test timings, workload helpers, and the
check that every bound pod sits on a GPU a live capacity pod holds, within its size."""

import urllib.request
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from gpupack import keys
from gpupack.policy import BUILTIN, policy_spec
from gpupack.quantity import parse_compute, parse_memory
from hack.localcluster import SYSTEM_NAMESPACE, Kube, LocalCluster

JSON = dict[str, Any]
FAST = [
    "--grace-period=3",
    # Headroom off: these tests count the capacity pods an emptied pool gives back; the
    # headroom has tests of its own (test_headroom_on_cluster.py, with the chart's value).
    "--headroom-pods=0",
    "--unused-grace-period=3",
    "--orphan-grace=2",
    "--retry-period=1",
    "--log-level=debug",
]
FAST_LEASE = [
    "scheduler.leaderElection.leaseDurationSeconds=4",
    "scheduler.leaderElection.renewDeadlineSeconds=3",
    "scheduler.leaderElection.retryPeriodSeconds=1",
]


def create(kube: Kube, obj: JSON) -> None:
    ns = obj["metadata"]["namespace"]
    kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", obj)


def pods_of(kube: Kube, ns: str, app: str) -> list[JSON]:
    items: list[JSON] = kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"app={app}")[
        "items"
    ]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def all_bound(kube: Kube, ns: str, app: str, count: int) -> Callable[[], list[JSON] | None]:
    def check() -> list[JSON] | None:
        pods = pods_of(kube, ns, app)
        ok = len(pods) == count and all(p["spec"].get("nodeName") for p in pods)
        return pods if ok else None

    return check


def wait_bound(kube: Kube, ns: str, app: str, count: int, timeout: float = 60) -> list[JSON]:
    try:
        pods: list[JSON] = kube.wait_for(
            f"{count} pods of {app} bound", all_bound(kube, ns, app, count), timeout=timeout
        )
    except Exception as exc:
        states = [
            (
                p["metadata"]["name"],
                p["spec"].get("nodeName"),
                p.get("status", {}).get("conditions"),
            )
            for p in pods_of(kube, ns, app)
        ]
        raise AssertionError(f"{exc}; pods: {states}") from None
    return pods


def capacity_pods(kube: Kube) -> dict[str, JSON]:
    items = kube.get(
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", labelSelector="gpupack.io/role=capacity"
    )["items"]
    return {p["metadata"]["name"]: p for p in items}


def assert_consistent(kube: Kube, pods: list[JSON]) -> dict[str, list[JSON]]:
    """Every pod sits on a GPU a live capacity pod holds on the same node, and no GPU is
    booked past its compute or memory. Returns the pods by GPU."""
    capacity = capacity_pods(kube)
    by_gpu: dict[str, list[JSON]] = defaultdict(list)
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        holder = capacity[annotations[keys.CAPACITY_POD]]
        assert holder["metadata"]["annotations"][keys.GPU_UUID] == annotations[keys.GPU_UUID]
        assert holder["spec"]["nodeName"] == pod["spec"]["nodeName"]
        by_gpu[annotations[keys.GPU_UUID]].append(pod)
    for uuid_, on_gpu in by_gpu.items():
        compute = sum(
            parse_compute(p["metadata"]["annotations"][keys.GPU_COMPUTE], "c") for p in on_gpu
        )
        assert compute <= 1000, (uuid_, compute)
        memory = sum(
            parse_memory(p["metadata"]["annotations"].get(keys.GPU_MEMORY, "0"), "m")
            for p in on_gpu
        )
        holder = next(
            c for c in capacity.values() if c["metadata"]["annotations"].get(keys.GPU_UUID) == uuid_
        )
        assert memory <= parse_memory(holder["metadata"]["annotations"][keys.GPU_MEMORY], "m")
    return by_gpu


def events(kube: Kube, ns: str, reason: str) -> list[JSON]:
    items: list[JSON] = kube.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reason") == reason]


def component_metric(cluster: LocalCluster, process: str, sample: str) -> float | None:
    """One sample (`name{labels}`) of a running component's metrics, by its process
    name; None when absent or not served yet."""
    target = cluster.metrics_targets[process]
    url = f"http://127.0.0.1:{target.port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            lines = reply.read().decode().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return None


def scheduler_metric(cluster: LocalCluster, sample: str) -> float | None:
    """One sample of the gpupack-scheduler's metrics (`name{labels}`), None when absent."""
    return component_metric(cluster, "gpupack-scheduler", sample)


def consolidating_policy(
    kube: Kube, name: str, window: int, evictions: int = 1
) -> Callable[[], None]:
    """Create the GPUPolicy `name`: batch, with consolidation On and a budget of
    `evictions` per workload per `window` seconds. Returns what deletes it."""
    spec = policy_spec(BUILTIN["batch"])
    spec["consolidation"] = {
        "mode": "On",
        "windowSeconds": window,
        "evictionsPerWindow": evictions,
    }
    policies = f"/apis/gpupack.io/v1alpha1/namespaces/{SYSTEM_NAMESPACE}/gpupolicies"
    body = {
        "apiVersion": "gpupack.io/v1alpha1",
        "kind": "GPUPolicy",
        "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
        "spec": spec,
    }
    kube.create(policies, body)
    return lambda: kube.delete(f"{policies}/{name}")
