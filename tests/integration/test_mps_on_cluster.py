"""real-time-mps on a real control plane: the wiring the webhook writes passes the API
server's `restricted` Pod Security level, the pods land on a GPU whose capacity pod runs
the MPS daemon and takes nothing else, and a daemon restart (as the kubelet reports it)
becomes Events on the GPU and its pods and a metric.

kwok runs no containers: the daemon itself is tested as a process with a stand-in
control binary (tests/node/test_mps_daemon.py), the CSI driver's mounts in a private
mount namespace (tests/node/test_mps_volumes.py).
"""

from collections.abc import Iterator

import pytest

from gpupack import keys
from gpupack.pool import metadata_key, scheduling_metadata
from hack.localcluster import SYSTEM_NAMESPACE, ApiError, Kube, LocalCluster
from scheduler.manifest import capacity_pod
from tests.integration.scheduling import (
    JSON,
    capacity_pods,
    create,
    events,
    scheduler_metric,
    wait_bound,
)
from tests.integration.workloads import RESTRICTED, deployment

pytestmark = pytest.mark.integration


@pytest.fixture
def restricted_namespace(kube: Kube) -> Iterator[str]:
    labels = {
        keys.OPTIMIZE: keys.OPTIMIZE_ENABLED,
        "pod-security.kubernetes.io/enforce": "restricted",
    }
    name = kube.create_namespace("it-mps", labels)
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")


def restricted(obj: JSON) -> JSON:
    for container in obj["spec"]["template"]["spec"]["containers"]:
        container["securityContext"] = dict(RESTRICTED)
    return obj


def test_mps_pods_pass_restricted_and_share_only_their_own_mps_gpu(
    kube: Kube, restricted_namespace: str, scheduler: LocalCluster
) -> None:
    ns = restricted_namespace
    selector = {"kubernetes.io/hostname": "gpu-a100-1"}
    mps = restricted(
        deployment(ns, "mps", 2, "200m", policy="real-time-mps", node_selector=selector)
    )
    plain = restricted(
        deployment(ns, "plain", 1, "200m", policy="real-time", node_selector=selector)
    )
    plain["spec"]["template"]["spec"]["tolerations"] = mps["spec"]["template"]["spec"][
        "tolerations"
    ]
    create(kube, mps)  # refused by the API server if the wiring broke `restricted`
    create(kube, plain)  # the same scheduling metadata: only the MPS mark tells them apart

    pods = wait_bound(kube, ns, "mps", 2)
    (other,) = wait_bound(kube, ns, "plain", 1)

    for pod in pods:
        spec = pod["spec"]
        assert {"name": "gpupack-mps", "csi": {"driver": "mps.gpupack.io"}} in spec["volumes"]
        (container,) = spec["containers"]
        mounts = {m["mountPath"]: m.get("subPath") for m in container["volumeMounts"]}
        assert mounts["/run/gpupack/mps"] is None
        assert mounts["/dev/shm"] == "shm"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpupack/mps/pipe"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    holders = {p["metadata"]["annotations"][keys.CAPACITY_POD] for p in pods}
    assert len(holders) == 1  # one workload shares its GPU
    (holder,) = holders
    capacity = capacity_pods(kube)
    daemon = capacity[holder]
    assert daemon["metadata"]["labels"]["gpupack.io/sharing"] == "mps"
    assert daemon["spec"]["containers"][0]["command"] == ["gpupack-mps-daemon"]
    assert daemon["spec"]["volumes"] == [
        {"name": "gpupack-mps", "csi": {"driver": "mps.gpupack.io"}}
    ]
    # The plain pod, with the very same scheduling metadata, is in another pool.
    other_holder = capacity[other["metadata"]["annotations"][keys.CAPACITY_POD]]
    assert other_holder["metadata"]["name"] != holder
    assert "gpupack.io/sharing" not in other_holder["metadata"]["labels"]
    assert other_holder["metadata"]["labels"][keys.POOL] != daemon["metadata"]["labels"][keys.POOL]


@pytest.mark.parametrize(("level", "admitted"), [("baseline", True), ("restricted", False)])
def test_an_mps_capacity_pod_meets_baseline_not_restricted(
    kube: Kube, level: str, admitted: bool
) -> None:
    # What docs/mps.md says of the daemon's pod: its root user and added capabilities
    # are all within `baseline`; `restricted` refuses them.
    ns = kube.create_namespace(f"it-{level}", {"pod-security.kubernetes.io/enforce": level})
    try:
        inherited = scheduling_metadata({}, mps=True)
        pod = capacity_pod(
            metadata_key(inherited),
            inherited,
            index=0,
            created_for="it/Deployment/x",
            mps_image="ghcr.io/gpupack/gpupack:test",
            namespace=ns,
        )
        # PodSecurity judges the rest; gpupack-capacity is its scheduler's alone.
        pod["spec"]["schedulerName"] = "default-scheduler"
        try:
            kube.create(f"/api/v1/namespaces/{ns}/pods", pod, dry_run=True)
            refused = None
        except ApiError as error:
            refused = str(error)
        assert (refused is None) == admitted, refused
        if refused is not None:
            assert "violates PodSecurity" in refused
    finally:
        kube.delete(f"/api/v1/namespaces/{ns}")


def test_a_daemon_restart_is_reported_on_the_gpu_and_its_pods_and_it_takes_no_new_pods(
    kube: Kube, restricted_namespace: str, scheduler: LocalCluster
) -> None:
    ns = restricted_namespace
    selector = {"kubernetes.io/hostname": "gpu-a100-2"}
    create(
        kube,
        restricted(
            deployment(ns, "llm", 2, "200m", policy="real-time-mps", node_selector=selector)
        ),
    )
    pods = wait_bound(kube, ns, "llm", 2)
    holder = pods[0]["metadata"]["annotations"][keys.CAPACITY_POD]
    ready = 'gpupack_scheduler_mps_daemons{state="ready"}'

    def every_daemon_seen() -> bool:  # this GPU's too, before its daemon "restarts"
        running = [
            p
            for p in capacity_pods(kube).values()
            if p["metadata"]["labels"].get("gpupack.io/sharing") == "mps"
            and p["status"].get("phase") == "Running"
        ]
        return (scheduler_metric(scheduler, ready) or 0) >= len(running)

    kube.wait_for("the scheduler counting every MPS daemon ready", every_daemon_seen)

    # What the kubelet writes when the daemon's container died and restarts.
    kube.merge_patch(
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{holder}/status",
        {
            "status": {
                "containerStatuses": [
                    {
                        "name": "capacity",
                        "image": "ghcr.io/gpupack/gpupack",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 1,
                        "state": {"running": {}},
                        "lastState": {"terminated": {"reason": "Error", "exitCode": 1}},
                    }
                ]
            }
        },
    )

    on_pods = kube.wait_for(
        "MPSDaemonRestarted on both pods",
        lambda: found if len(found := events(kube, ns, "MPSDaemonRestarted")) >= 2 else None,
    )
    assert {e["regarding"]["name"] for e in on_pods} == {p["metadata"]["name"] for p in pods}
    assert "Error with status 1" in on_pods[0]["note"]
    on_gpu = kube.wait_for(
        "MPSDaemonRestarted on the capacity pod",
        lambda: [
            e
            for e in events(kube, SYSTEM_NAMESPACE, "MPSDaemonRestarted")
            if e["regarding"]["name"] == holder
        ],
    )
    assert on_gpu[0]["type"] == "Warning"
    not_ready = 'gpupack_scheduler_mps_daemons{state="not_ready"}'
    kube.wait_for(
        "the daemon counted not ready", lambda: (scheduler_metric(scheduler, not_ready) or 0) >= 1
    )

    # A third pod of the workload would join its GPU; while the daemon does not answer,
    # it gets another.
    kube.merge_patch(f"/apis/apps/v1/namespaces/{ns}/deployments/llm", {"spec": {"replicas": 3}})
    names = {p["metadata"]["name"] for p in pods}
    (third,) = [
        p for p in wait_bound(kube, ns, "llm", 3, timeout=90) if p["metadata"]["name"] not in names
    ]
    assert third["metadata"]["annotations"][keys.CAPACITY_POD] != holder
