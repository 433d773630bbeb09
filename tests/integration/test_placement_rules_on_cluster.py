"""Every placement rule a user writes holds for fractional pods: kube-scheduler owns the
rules, gpupack owns the GPUs.

Each test names the rule it proves, with pinned 300m shares: packed blindly, the pods of
each workload would all share one GPU on one node, and the rule would be broken.
"""

import copy
from collections.abc import Iterator

import pytest

from hack.localcluster import Kube, LocalCluster
from tests.integration.scheduling import (
    JSON,
    assert_consistent,
    create,
    events,
    pods_of,
    wait_bound,
)
from tests.integration.workloads import deployment

pytestmark = pytest.mark.integration

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
A100 = [f"gpu-a100-{i}" for i in range(4)]


def template(obj: JSON) -> JSON:
    spec: JSON = obj["spec"]["template"]["spec"]
    return spec


def only_on(obj: JSON, nodes: list[str]) -> JSON:
    template(obj)["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": nodes}]}
                ]
            }
        }
    }
    return obj


def nodes_of(pods: list[JSON]) -> list[str]:
    return sorted(p["spec"]["nodeName"] for p in pods)


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def label_nodes(kube: Kube, labels: dict[str, dict[str, str | None]]) -> None:
    for name, values in labels.items():
        kube.merge_patch(node_path(name), {"metadata": {"labels": values}})


def test_required_pod_anti_affinity_keeps_replicas_on_different_nodes(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    obj = only_on(deployment(ns, "spread", 3), A100)
    template(obj)["affinity"]["podAntiAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "spread"}}, "topologyKey": HOSTNAME}
        ]
    }
    create(kube, obj)

    pods = wait_bound(kube, ns, "spread", 3, timeout=120)

    assert len(set(nodes_of(pods))) == 3, nodes_of(pods)
    assert_consistent(kube, pods)


def test_required_pod_affinity_puts_replicas_beside_the_pod_they_name(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    anchor = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cache", "namespace": ns, "labels": {"role": "cache"}},
        "spec": {
            "nodeSelector": {HOSTNAME: "gpu-a100-2"},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            "terminationGracePeriodSeconds": 0,
        },
    }
    kube.create(f"/api/v1/namespaces/{ns}/pods", anchor)
    obj = only_on(deployment(ns, "near", 2), A100)
    template(obj)["affinity"]["podAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"role": "cache"}}, "topologyKey": HOSTNAME}
        ]
    }
    create(kube, obj)

    pods = wait_bound(kube, ns, "near", 2, timeout=120)

    assert nodes_of(pods) == ["gpu-a100-2", "gpu-a100-2"]
    assert_consistent(kube, pods)


@pytest.fixture
def zones(kube: Kube) -> Iterator[dict[str, str]]:
    zones = {name: ("zone-a" if i < 2 else "zone-b") for i, name in enumerate(A100)}
    label_nodes(kube, {name: {ZONE: zone} for name, zone in zones.items()})
    yield zones
    label_nodes(kube, {name: {ZONE: None} for name in zones})


def test_topology_spread_do_not_schedule_balances_replicas_over_zones(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster, zones: dict[str, str]
) -> None:
    ns = opted_in_namespace
    obj = only_on(deployment(ns, "zonal", 4), A100)
    template(obj)["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "zonal"}},
        }
    ]
    create(kube, obj)

    pods = wait_bound(kube, ns, "zonal", 4, timeout=120)

    per_zone = [zones[n] for n in nodes_of(pods)]
    assert sorted(per_zone) == ["zone-a", "zone-a", "zone-b", "zone-b"], nodes_of(pods)
    assert_consistent(kube, pods)


def test_host_ports_keep_two_pods_off_one_node(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    obj = only_on(deployment(ns, "ports", 2), A100)
    template(obj)["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 18080}]
    create(kube, obj)

    pods = wait_bound(kube, ns, "ports", 2, timeout=120)

    assert len(set(nodes_of(pods))) == 2, nodes_of(pods)
    assert_consistent(kube, pods)


def test_a_cordoned_node_gets_no_new_pods_even_with_room_on_its_gpu(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    first = only_on(deployment(ns, "first", 1), ["gpu-l4-0"])
    create(kube, first)
    wait_bound(kube, ns, "first", 1)
    # The same pool (same scheduling metadata): the GPU on gpu-l4-0 has 700m free.
    second = copy.deepcopy(first)
    second["metadata"]["name"] = "second"
    second["spec"]["selector"]["matchLabels"]["app"] = "second"
    second["spec"]["template"]["metadata"]["labels"]["app"] = "second"
    kube.merge_patch(node_path("gpu-l4-0"), {"spec": {"unschedulable": True}})
    try:
        create(kube, second)
        kube.wait_for(
            "a FailedScheduling event naming the cordon",
            lambda: [
                e for e in events(kube, ns, "FailedScheduling") if "unschedulable" in e["note"]
            ],
            timeout=30,
        )
        assert not any(p["spec"].get("nodeName") for p in pods_of(kube, ns, "second"))
    finally:
        kube.merge_patch(node_path("gpu-l4-0"), {"spec": {"unschedulable": False}})

    (pod,) = wait_bound(kube, ns, "second", 1, timeout=60)
    assert pod["spec"]["nodeName"] == "gpu-l4-0"


@pytest.fixture
def local_volume(kube: Kube, opted_in_namespace: str) -> Iterator[str]:
    """A PersistentVolume that lives on gpu-a100-3 only, and a claim bound to it."""
    ns = opted_in_namespace
    pv_name = f"local-{ns}"
    kube.create(
        "/api/v1/persistentvolumes",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "local": {"path": "/mnt/data"},
                "claimRef": {"namespace": ns, "name": "data"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": HOSTNAME, "operator": "In", "values": ["gpu-a100-3"]}
                                ]
                            }
                        ]
                    }
                },
            },
        },
    )
    kube.create(
        f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            # Bound as the volume controller would bind it (this control plane runs none).
            "metadata": {
                "name": "data",
                "namespace": ns,
                "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
            },
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "",
                "volumeName": pv_name,
            },
        },
    )
    yield "data"
    kube.delete(f"/api/v1/persistentvolumes/{pv_name}")


def test_a_pod_with_a_node_bound_volume_goes_where_the_volume_is(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster, local_volume: str
) -> None:
    ns = opted_in_namespace
    obj = only_on(deployment(ns, "stateful", 2), A100)
    template(obj)["volumes"] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": local_volume}}
    ]
    create(kube, obj)

    pods = wait_bound(kube, ns, "stateful", 2, timeout=120)

    assert nodes_of(pods) == ["gpu-a100-3", "gpu-a100-3"]
    assert_consistent(kube, pods)


@pytest.fixture
def priorities(kube: Kube) -> Iterator[None]:
    for name, value in (("it-low", 100), ("it-high", 1000)):
        kube.create(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    yield
    for name in ("it-low", "it-high"):
        kube.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def test_a_higher_priority_pod_gets_a_new_gpu_instead_of_evicting_fractional_pods(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster, priorities: None
) -> None:
    """gpupack does not preempt for GPU share: its refusals are unresolvable, so
    kube-scheduler evicts nobody for them; the high-priority pod gets capacity (which
    inherits its priority) and the low-priority pods keep running (docs/scheduler.md)."""
    ns = opted_in_namespace
    low = only_on(deployment(ns, "low", 3), ["gpu-a100-1"])
    template(low)["priorityClassName"] = "it-low"
    create(kube, low)
    before = {p["metadata"]["uid"] for p in wait_bound(kube, ns, "low", 3)}
    high = only_on(deployment(ns, "high", 1, "500m"), ["gpu-a100-1"])
    template(high)["priorityClassName"] = "it-high"
    template(high)["tolerations"] = template(low)["tolerations"]  # the same pool as low

    create(kube, high)

    (pod,) = wait_bound(kube, ns, "high", 1, timeout=90)
    after = {p["metadata"]["uid"] for p in pods_of(kube, ns, "low") if p["spec"].get("nodeName")}
    assert after == before, "no low-priority pod was evicted"
    assert not events(kube, ns, "Preempted")
    low_gpus = {
        p["metadata"]["annotations"]["gpupack.io/gpu-uuid"] for p in pods_of(kube, ns, "low")
    }
    assert pod["metadata"]["annotations"]["gpupack.io/gpu-uuid"] not in low_gpus
    assert_consistent(kube, [pod, *pods_of(kube, ns, "low")])


def test_with_the_extender_stopped_pods_wait_and_are_bound_once_it_is_back(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    scheduler.stop_scheduler(extender_only=True)
    try:
        create(kube, deployment(ns, "patient", 3))
        # kube-scheduler tries, and fails without its extender: its own verdict says so.
        kube.wait_for(
            "kube-scheduler's try without its extender",
            lambda: [
                e
                for e in events(kube, ns, "FailedScheduling")
                if "patient" in e["regarding"]["name"]
            ],
            timeout=60,
        )
        assert not any(p["spec"].get("nodeName") for p in pods_of(kube, ns, "patient"))
    finally:
        scheduler.processes["gpupack-scheduler"].start()

    pods = wait_bound(kube, ns, "patient", 3, timeout=120)
    assert_consistent(kube, pods)
