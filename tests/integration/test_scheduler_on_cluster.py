"""The scheduler against a real control plane: pods end up bound where the GPUs are held.

The session's scheduler runs with short timings (grace period, lease) so scale-down
and failover happen within a test. Each test isolates its pool with a toleration of its
own, so capacity pods of one test never serve another.
"""

import contextlib
import time

import pytest

from gpupack import keys
from gpupack.capacity import capacity_name
from hack.localcluster import SYSTEM_NAMESPACE, ApiError, Kube, LocalCluster
from scheduler.manifest import capacity_pod
from tests.integration.scheduling import (
    FAST,
    FAST_LEASE,
    JSON,
    all_bound,
    assert_consistent,
    capacity_pods,
    create,
    events,
    pods_of,
    wait_bound,
)
from tests.integration.workloads import deployment, gpu_pod

pytestmark = pytest.mark.integration
# A quiet window (seconds): room for what must not happen (an eviction, a second Event,
# a takeover) to show itself, where no signal says it never will.
QUIET = 3.0


@pytest.mark.smoke
def test_nine_300m_pods_are_bound_on_three_gpus(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    create(kube, deployment(ns, "llm", 9))

    pods = wait_bound(kube, ns, "llm", 9)

    by_gpu = assert_consistent(kube, pods)
    assert len(by_gpu) == 3
    assert sorted(len(v) for v in by_gpu.values()) == [3, 3, 3]
    holders = {p["metadata"]["annotations"][keys.CAPACITY_POD] for p in pods}

    def marked() -> bool:
        capacity = capacity_pods(kube)
        return all(
            capacity[h]["metadata"].get("annotations", {}).get(keys.CA_SAFE_TO_EVICT) == "false"
            and capacity[h]["metadata"]["annotations"].get(keys.KARPENTER_DO_NOT_DISRUPT) == "true"
            for h in holders
        )

    kube.wait_for("do-not-evict annotations on the hosting capacity pods", marked, timeout=20)
    assert (
        len(
            kube.wait_for(
                "Scheduled events",
                lambda: (
                    events(kube, ns, "Scheduled")
                    if len(events(kube, ns, "Scheduled")) >= 9
                    else None
                ),
            )
        )
        >= 9
    )


def test_pods_are_tracked_per_gpu_on_a_multi_gpu_node(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    create(
        kube,
        deployment(ns, "wide", 4, "600m", node_selector={"kubernetes.io/hostname": "gpu-a100-0"}),
    )

    pods = wait_bound(kube, ns, "wide", 4)

    by_gpu = assert_consistent(kube, pods)
    assert len(by_gpu) == 4  # 600m + 600m never share a GPU, even on one node
    assert {p["spec"]["nodeName"] for p in pods} == {"gpu-a100-0"}


def test_node_constraints_are_respected(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    create(kube, deployment(ns, "l4", 3, "500m", node_selector={keys.GFD_PRODUCT: "NVIDIA-L4"}))

    pods = wait_bound(kube, ns, "l4", 3)

    assert_consistent(kube, pods)
    nodes = {n["metadata"]["name"]: n for n in kube.get("/api/v1/nodes")["items"]}
    assert all(
        nodes[p["spec"]["nodeName"]]["metadata"]["labels"][keys.GFD_PRODUCT] == "NVIDIA-L4"
        for p in pods
    )


@pytest.mark.smoke
def test_the_scheduler_adds_capacity_when_the_pool_is_full_and_releases_it_when_empty(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    # 16Gi each on 22.5Gi L4s: one pod per GPU. At admission no GPU of the pool is known,
    # so the webhook plans by compute (one GPU for all three); the scheduler learns the
    # device memory and asks for the rest.
    create(
        kube,
        deployment(
            ns, "mem", 3, "100m", memory="16Gi", node_selector={keys.GFD_PRODUCT: "NVIDIA-L4"}
        ),
    )

    pods = wait_bound(kube, ns, "mem", 3, timeout=90)

    by_gpu = assert_consistent(kube, pods)
    assert len(by_gpu) == 3
    assert events(kube, ns, "CapacityRequested"), "the scheduler created capacity"
    holders = {p["metadata"]["annotations"][keys.CAPACITY_POD] for p in pods}

    kube.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/mem")
    kube.wait_for(
        "the empty capacity pods deleted after the grace period",
        lambda: not (holders & set(capacity_pods(kube))),
        timeout=60,
    )


def test_capacity_pods_are_placed_by_a_kube_scheduler_of_their_own(
    kube: Kube, scheduler: LocalCluster
) -> None:
    """Capacity pods never queue behind fractional pods: the chart places them with a
    kube-scheduler of their own, which binds one while the fractional pods' is stopped.
    (With both profiles in one kube-scheduler, a capacity pod created for a burst waited
    behind every share queued before it: `benchmarks/scale`.)"""
    shares = scheduler.processes["gpupack-scheduler-kube-scheduler"]
    name = capacity_name("0123456789abcdef", 0)
    path = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{name}"
    shares.stop()
    try:
        manifest = capacity_pod(
            "0123456789abcdef",
            {"nodeSelector": {keys.GFD_PRODUCT: "NVIDIA-L4"}},
            index=0,
            created_for="test/Pod/alone",
        )
        # As the extender creates it: only gpupack's scheduler names gpupack-capacity.
        as_scheduler = kube.impersonating(
            f"system:serviceaccount:{SYSTEM_NAMESPACE}:gpupack-scheduler"
        )
        try:
            as_scheduler.create(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", manifest)
        finally:
            as_scheduler.close()
        node = kube.wait_for(
            "the capacity pod bound", lambda: kube.get(path)["spec"].get("nodeName"), timeout=30
        )
        assert node.startswith("gpu-l4-")
        assert not shares.alive()
    finally:
        with contextlib.suppress(ApiError):
            kube.delete(path)
        shares.start()


def test_real_time_mps_pods_never_share_a_gpu_with_another_workload(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    selector = {
        "kubernetes.io/hostname": "gpu-a100-1"
    }  # one node, so a shared pool would be tempting
    for name in ("mps-a", "mps-b"):
        obj = deployment(ns, name, 2, "200m", policy="real-time-mps", node_selector=selector)
        obj["spec"]["template"]["spec"]["tolerations"] = [
            {"key": "gpupack.test/isolate", "value": ns, "effect": "NoSchedule"}
        ]
        create(kube, obj)

    a = wait_bound(kube, ns, "mps-a", 2)
    b = wait_bound(kube, ns, "mps-b", 2)

    gpus_a = {p["metadata"]["annotations"][keys.GPU_UUID] for p in a}
    gpus_b = {p["metadata"]["annotations"][keys.GPU_UUID] for p in b}
    assert not gpus_a & gpus_b
    assert len(gpus_a) == len(gpus_b) == 1  # the same workload does share


def test_a_standby_takes_over_when_the_leader_dies(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    lease_path = (
        f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/gpupack-scheduler"
    )
    leader = kube.wait_for("a leader", lambda: kube.get(lease_path)["spec"].get("holderIdentity"))
    scheduler.install_scheduler(name="gpupack-scheduler-standby", extra_args=FAST, sets=FAST_LEASE)
    try:
        time.sleep(QUIET)  # the standby's caches sync while the leader holds on
        assert kube.get(lease_path)["spec"]["holderIdentity"] == leader
        scheduler.stop_scheduler(kill=True)  # SIGKILL: no release, the Lease must expire
        killed = time.monotonic()

        kube.wait_for(
            "the standby holding the Lease",
            lambda: kube.get(lease_path)["spec"].get("holderIdentity") not in (None, leader),
            timeout=30,
        )
        took_over = time.monotonic() - killed
        create(kube, deployment(ns, "after", 3))
        assert_consistent(kube, wait_bound(kube, ns, "after", 3))
        assert took_over < 20, f"took {took_over:.1f}s"
    finally:
        scheduler.stop_scheduler("gpupack-scheduler-standby")
        scheduler.install_scheduler(extra_args=FAST, sets=FAST_LEASE)


def test_an_extender_killed_while_binding_200_pods_never_double_books(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    """SIGKILL of the extender mid-burst: its reservations die with it; kube-scheduler's
    binds fail until it is back, and the restarted extender rebuilds its ledger from the
    annotations alone."""
    ns = opted_in_namespace
    create(kube, deployment(ns, "burst", 200, "100m"))

    def some_bound() -> bool:
        return sum(1 for p in pods_of(kube, ns, "burst") if p["spec"].get("nodeName")) >= 20

    kube.wait_for("the first binds", some_bound, timeout=90)
    scheduler.stop_scheduler(kill=True, extender_only=True)
    bound_at_kill = sum(1 for p in pods_of(kube, ns, "burst") if p["spec"].get("nodeName"))
    scheduler.processes["gpupack-scheduler"].start()

    pods = wait_bound(kube, ns, "burst", 200, timeout=240)

    by_gpu = assert_consistent(kube, pods)
    assert sum(len(v) for v in by_gpu.values()) == 200
    assert bound_at_kill < 200, "the kill happened mid-burst"


def test_a_pod_whose_capacity_pod_vanished_is_evicted_and_replaced_on_a_held_gpu(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    create(kube, deployment(ns, "orphan", 2, "400m"))
    pods = wait_bound(kube, ns, "orphan", 2)
    victim = pods[0]["metadata"]["annotations"][keys.CAPACITY_POD]
    first_names = {p["metadata"]["name"] for p in pods}

    # Nobody may delete a capacity pod that hosts pods (the chart's admission policy), but
    # the control plane's own cleanup does when a node is gone: as its pod GC would.
    path = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{victim}"
    with pytest.raises(ApiError) as refused:
        kube.request("DELETE", path)  # (Kube.delete ignores errors)
    assert refused.value.status == 403
    assert "holds the GPU" in refused.value.body
    user = "system:serviceaccount:kube-system:pod-garbage-collector"
    gc = Kube.from_kubeconfig(scheduler.user_kubeconfig(user, ["system:serviceaccounts"]))
    try:
        gc.request("DELETE", path)
    finally:
        gc.close()

    kube.wait_for(
        "a GPUCapacityLost event", lambda: events(kube, ns, "GPUCapacityLost"), timeout=60
    )

    def replaced() -> list[JSON] | None:
        # Both pods shared the GPU, so both were evicted; their replacements are bound
        # to GPUs that live capacity pods hold (a new capacity pod may reuse the name).
        current = all_bound(kube, ns, "orphan", 2)()
        if current is None or {p["metadata"]["name"] for p in current} & first_names:
            return None
        return current

    assert_consistent(
        kube, kube.wait_for("the evicted pod replaced on a held GPU", replaced, timeout=90)
    )


def test_pods_a_gpu_cannot_hold_any_more_are_reported_and_left_running(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    create(kube, deployment(ns, "shrunk", 2, "300m", memory="30Gi"))
    pods = wait_bound(kube, ns, "shrunk", 2)
    by_gpu = assert_consistent(kube, pods)
    assert len(by_gpu) == 1, "two 300m, 30 GiB pods share one 80 GiB GPU"
    holder = pods[0]["metadata"]["annotations"][keys.CAPACITY_POD]

    # The node agent reports that the GPU has only 40 GiB after all (it came back
    # smaller): the two pods' 60 GiB no longer fit its books.
    scheduler.exporter_kubeconfig()  # the chart's RBAC for the node agent
    writer = scheduler.node_agent(pods[0]["spec"]["nodeName"])
    try:
        writer.merge_patch(
            f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{holder}",
            {"metadata": {"annotations": {keys.GPU_MEMORY: "40Gi"}}},
        )
    finally:
        writer.close()

    reported = kube.wait_for(
        "a GPUOvercommitted event", lambda: events(kube, ns, "GPUOvercommitted"), timeout=30
    )
    assert len(reported) == 1, "one pod fits the books; only the other is reported"
    assert "takes no new pods" in reported[0]["note"]
    # Neither pod is evicted, and the GPU stays held for both.
    time.sleep(QUIET)
    assert {p["metadata"]["uid"] for p in pods_of(kube, ns, "shrunk")} == {
        p["metadata"]["uid"] for p in pods
    }
    labels = capacity_pods(kube)[holder]["metadata"].get("labels", {})
    assert labels.get(keys.HOSTING) == "true"


def test_a_gpu_pod_created_while_the_webhook_was_down_is_reported_as_holding_a_whole_gpu(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace

    scheduler.stop_webhook()  # failurePolicy Ignore: pods are created as written
    try:
        kube.create(f"/api/v1/namespaces/{ns}/pods", gpu_pod("escaped", "1"))
        kube.create(f"/api/v1/namespaces/{ns}/pods", gpu_pod("two-gpus", "2"))
    finally:
        scheduler.reinstall_webhook()

    reported = kube.wait_for(
        "a NotRewrittenByGPUPack event",
        lambda: events(kube, ns, "NotRewrittenByGPUPack"),
        timeout=30,
    )
    time.sleep(QUIET)  # (room for a wrong second Event)
    reported = events(kube, ns, "NotRewrittenByGPUPack")
    assert [e["regarding"]["name"] for e in reported] == ["escaped"]  # two GPUs stay whole
    assert reported[0]["type"] == "Warning"
    assert "holds a whole GPU" in reported[0]["note"]
    stored = kube.get(f"/api/v1/namespaces/{ns}/pods/escaped")
    assert stored["spec"]["schedulerName"] == "default-scheduler"  # really not rewritten
