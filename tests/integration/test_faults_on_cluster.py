"""Faults of the control plane and of gpupack's own processes, on the local cluster, with
what users care about asserted: no pod escapes the webhook or is double-booked, no GPU
is handed away while used, and everything converges within a stated time.

Each test starts a burst of fractional pods (a Deployment the ReplicaSet controller
creates pod by pod), breaks something once part of it is bound, and waits for the whole
burst to be bound; `docs/operations.md` ("Faults") says what each fault does and how
gpupack recovers, with the times measured here.
"""

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpupack import keys
from hack import polling
from hack.localcluster import ApiError, Kube, LocalCluster
from hack.localcluster.processes import Restarter
from tests.integration.scheduling import JSON, assert_consistent, capacity_pods, create, pods_of
from tests.integration.workloads import deployment

pytestmark = pytest.mark.integration

CONVERGE_SECONDS = 180  # the burst is bound within this of the fault (stated in the docs)
LOGS: list[Callable[[], str]] = [lambda: ""]  # the extender's log's end, for a failure


@pytest.fixture
def kubelet(scheduler: LocalCluster) -> Iterator[Restarter]:
    """The scheduler pod's and the webhook's containers restart when they exit, as in a
    pod: kube-scheduler exits when it loses its Lease (here after 4 s without the API
    server, the test timings; 15 s with the chart's)."""
    names = [*scheduler.scheduler_processes(), "gpupack-webhook"]
    with Restarter(scheduler.processes, names) as restarter:
        yield restarter


def eventually(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """`hack.polling.eventually` through an API server that may be down (connection
    refused, 5xx while it starts): any exception is "not yet"."""
    return polling.eventually(what, check, timeout, interval=0.5, tolerate=(Exception,))


def bound(kube: Kube, ns: str, app: str) -> list[JSON]:
    return [p for p in pods_of(kube, ns, app) if p["spec"].get("nodeName")]


def start_burst(kube: Kube, ns: str, app: str, count: int, compute: str, first: int) -> None:
    """`count` pods of `compute` and 4Gi each (an L4 holds four of 250m, five of 200m)."""
    create(kube, deployment(ns, app, count, compute, memory="4Gi"))
    eventually(f"{first} pods of {app} bound", lambda: len(bound(kube, ns, app)) >= first, 90)


def converged(kube: Kube, ns: str, app: str, count: int) -> tuple[list[JSON], float]:
    """All `count` pods bound (and the seconds it took from now); none escaped."""
    started = time.monotonic()

    def done() -> list[JSON] | None:
        pods = pods_of(kube, ns, app)
        return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else None

    try:
        pods: list[JSON] = eventually(f"{count} pods of {app} bound", done, CONVERGE_SECONDS)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{situation(kube, ns, app)}\n{LOGS[0]()}") from None
    for pod in pods:
        assert_admitted(pod)
    return pods, time.monotonic() - started


def situation(kube: Kube, ns: str, app: str) -> str:
    """What a person needs to see when a burst did not converge."""
    pods = pods_of(kube, ns, app)
    waiting = [p for p in pods if not p["spec"].get("nodeName")]
    lines = [f"{len(pods)} pods, {len(waiting)} unbound"]
    for pod in waiting[:5]:
        conditions = [
            (c.get("type"), c.get("reason"), (c.get("message") or "")[:300])
            for c in pod.get("status", {}).get("conditions", [])
        ]
        lines.append(f"  {pod['metadata']['name']}: {conditions}")
    capacity = capacity_pods(kube)
    lines.append(
        "capacity pods: "
        + ", ".join(
            f"{name} {c['status'].get('phase')} {c['spec'].get('nodeName')} "
            f"{(c['metadata'].get('annotations') or {}).get(keys.GPU_UUID, 'no-uuid')[:12]}"
            for name, c in capacity.items()
        )
    )
    return "\n".join(lines)


def assert_admitted(pod: JSON) -> None:
    """The webhook rewrote it (it did not escape with a whole GPU), the scheduler placed
    it: its seal, gpupack's scheduler, no nvidia.com/gpu left."""
    annotations = pod["metadata"].get("annotations") or {}
    name = pod["metadata"]["name"]
    assert keys.SEAL in annotations, f"{name} escaped the webhook"
    assert pod["spec"]["schedulerName"] == keys.SCHEDULER_NAME, name
    for container in pod["spec"]["containers"]:
        for section in ("requests", "limits"):
            assert keys.NVIDIA_GPU not in (container.get("resources") or {}).get(section, {})


def restart(cluster: LocalCluster, kubelet: Restarter, name: str, down: float = 3.0) -> None:
    """Stop the local cluster's process `name`, leave it down `down` seconds, start it."""
    process = cluster.processes[name]
    with kubelet.paused():
        process.stop()
        time.sleep(down)
        process.start()


@pytest.mark.parametrize(
    ("process", "down"),
    [
        pytest.param("kube-apiserver", 3.0, id="api-server"),
        pytest.param("etcd", 3.0, id="etcd"),
        # kube-scheduler's container alone, beside a running extender: the extender's
        # reservations expire if no bind comes, and the restarted one filters again.
        pytest.param("gpupack-scheduler-kube-scheduler", 2.0, id="kube-scheduler"),
    ],
)
def test_a_restart_during_a_burst_loses_no_pod_and_books_no_gpu_twice(
    kube: Kube,
    opted_in_namespace: str,
    scheduler: LocalCluster,
    kubelet: Restarter,
    process: str,
    down: float,
) -> None:
    LOGS[0] = lambda: scheduler.processes["gpupack-scheduler"].tail(60)
    ns = opted_in_namespace
    start_burst(kube, ns, "burst", 24, "250m", first=8)

    restart(scheduler, kubelet, process, down)
    eventually("the API server answering", lambda: kube.get("/api/v1/namespaces/default"), 60)
    pods, seconds = converged(kube, ns, "burst", 24)

    by_gpu = assert_consistent(kube, pods)
    assert sum(len(v) for v in by_gpu.values()) == 24
    assert len(by_gpu) <= 6 + 1  # 24 x 250m pack onto 6 GPUs; one more may have come
    print(f"{process} restarted: converged in {seconds:.1f} s; restarts {kubelet.restarts}")


def test_a_gpu_node_deleted_under_its_shares_frees_its_gpus_and_the_shares_come_back(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    """The node goes (a cloud instance reclaimed): the pod garbage collector deletes its
    pods, the capacity pods and the shares with them; the ReplicaSet makes new pods, which
    get GPUs elsewhere; nothing stays booked on the GPUs that went."""
    ns = opted_in_namespace
    app = "nodegone"
    start_burst(kube, ns, app, 6, "300m", first=6)
    pods, _ = converged(kube, ns, app, 6)
    victim = pods[0]["spec"]["nodeName"]
    gone = {
        p["metadata"]["annotations"][keys.GPU_UUID] for p in pods if p["spec"]["nodeName"] == victim
    }
    node = kube.get(f"/api/v1/nodes/{victim}")

    kube.delete(f"/api/v1/nodes/{victim}")
    deleted = time.monotonic()
    try:

        def replaced() -> list[JSON] | None:
            now = pods_of(kube, ns, app)
            placed = [p for p in now if p["spec"].get("nodeName")]
            ok = len(placed) == 6 and all(p["spec"]["nodeName"] != victim for p in placed)
            return placed if ok else None

        pods = eventually("the shares placed off the deleted node", replaced, CONVERGE_SECONDS)
        for pod in pods:
            assert_admitted(pod)
        by_gpu = assert_consistent(kube, pods)
        assert not gone & set(by_gpu)
        placed = time.monotonic() - deleted

        def released() -> bool:  # the pod garbage collector takes them in its own time
            held = {
                c["metadata"]["annotations"].get(keys.GPU_UUID)
                for c in capacity_pods(kube).values()
                if c["spec"].get("nodeName") == victim
            }
            return not held - {None}

        eventually("the deleted node's capacity pods gone", released, CONVERGE_SECONDS)
        print(
            f"node deleted: shares placed again in {placed:.1f} s, "
            f"its capacity pods gone in {time.monotonic() - deleted:.1f} s"
        )
    finally:  # the node back as it was, for the tests that follow (kwok adopts it again)
        node["metadata"] = {
            k: v for k, v in node["metadata"].items() if k in ("name", "labels", "annotations")
        }

        def recreated() -> bool:
            try:
                kube.create("/api/v1/nodes", node)
            except ApiError as error:
                if error.status != 409:  # AlreadyExists: an earlier try got through
                    raise
            return True

        eventually(f"{victim} created again", recreated, 60)
