"""What `kubectl gpupack` reports: status from the cluster's pods, and what-if from
today's whole-GPU pods through the webhook's decision and capacity planner."""

from typing import Any

from gpupack import keys
from ops.report import status, what_if, why_pending
from webhook.policies import BUILTIN_POLICIES as BUILTIN_POLICY_SET

JSON = dict[str, Any]
ENABLED = {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED}


def whole(name: str, ns: str = "ml", gpus: str = "1", node: str = "n1", **meta: Any) -> JSON:
    container = {"name": "c", "resources": {"limits": {keys.NVIDIA_GPU: gpus}}}
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"u-{name}", **meta},
        "spec": {"containers": [container], "schedulerName": "default-scheduler", "nodeName": node},
        "status": {"phase": "Running"},
    }


def shared(
    name: str, ns: str = "ml", *, node: str | None = "n1", gpu: str = "GPU-1", compute: str = "300m"
) -> JSON:
    annotations = {
        keys.DECISION: f"d-{name}",
        keys.GPU_COMPUTE: compute,
        keys.GPU_MEMORY: "8Gi",
        keys.POLICY: "batch",
        keys.SEAL: "v1.x.y",
    }
    if node:
        annotations[keys.GPU_UUID] = gpu
    spec: JSON = {"containers": [{"name": "c"}], "schedulerName": keys.SCHEDULER_NAME}
    if node:
        spec["nodeName"] = node
    meta = {"name": name, "namespace": ns, "annotations": annotations}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def capacity(name: str, *, gpu: str | None, draining: bool = False) -> JSON:
    annotations = {keys.GPU_UUID: gpu} if gpu else {}
    if draining:
        annotations[keys.DRAINING] = "2026-11-28T09:00:00Z"
    return {
        "metadata": {
            "name": name,
            "namespace": keys.SYSTEM_NAMESPACE,
            "labels": {keys.ROLE: keys.ROLE_CAPACITY, keys.POOL: "p1"},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "pause"}]},
        "status": {"phase": "Running" if gpu else "Pending"},
    }


def namespace(name: str, labels: dict[str, str] | None = None) -> JSON:
    return {"metadata": {"name": name, "labels": labels or {}}}


def test_status_counts_gpus_held_against_gpus_asked_and_says_why_pods_wait() -> None:
    pods = [
        shared("a"), shared("b"), shared("c", ns="research", gpu="GPU-2"),
        shared("waits", node=None),
        capacity("cap-1", gpu="GPU-1"), capacity("cap-2", gpu="GPU-2"), capacity("cap-3", gpu=None),
        whole("escaped"),  # in an opted-in namespace, never rewritten
        whole("other", ns="web"),  # not opted in: not counted anywhere
    ]  # fmt: skip
    events = [
        {
            "reason": "FailedScheduling",
            "involvedObject": {"name": "waits", "namespace": "ml"},
            "lastTimestamp": "2026-11-23T10:00:00Z",
            "message": "0/8 nodes are available: 8 gpupack: insufficient GPU compute.",
        },
        {
            "reason": "FailedScheduling",
            "involvedObject": {"name": "waits", "namespace": "ml"},
            "lastTimestamp": "2026-11-23T09:00:00Z",
            "message": "older",
        },
    ]
    report = status(pods, {"ml": namespace("ml", ENABLED)}, events)

    assert (report.held, report.coming, report.in_use, report.asked) == (2, 1, 2, 4)
    assert report.saved == 1
    assert report.namespaces["ml"].pods == 3
    assert report.namespaces["ml"].compute == 900
    assert report.namespaces["research"].gpus_asked == 1
    (waiting,) = report.waiting
    assert waiting.pod == "ml/waits"
    assert "insufficient GPU compute" in waiting.why
    assert report.escaped == ["ml/escaped"]


def test_status_counts_the_pods_held_to_their_memory_share() -> None:
    held, mps_held, accounted = shared("a"), shared("b"), shared("c")
    held["metadata"]["annotations"][keys.ENFORCEMENT] = "memory"
    mps_held["metadata"]["annotations"][keys.ENFORCEMENT] = "mps,memory"
    accounted["metadata"]["annotations"][keys.ENFORCEMENT] = "accounting"
    report = status([held, mps_held, accounted], {"ml": namespace("ml", ENABLED)}, [])
    assert report.namespaces["ml"].memory_enforced == 2
    assert report.namespaces["ml"].pods == 3


def test_what_if_shares_one_gpu_pods_and_keeps_multi_gpu_pods_whole() -> None:
    nodes = {
        "n1": {
            "metadata": {"name": "n1", "labels": {keys.GFD_MEMORY_MIB: "81920"}},
            "status": {"allocatable": {keys.NVIDIA_GPU: "8"}},
        }
    }
    pods = [
        *(whole(f"serve-{i}") for i in range(6)),
        whole("train", gpus="2"),
        whole("done", ns="ml") | {"status": {"phase": "Succeeded"}},
        shared("already"),  # gpupack's already: not counted
    ]
    for pod in pods[:6]:
        pod["metadata"]["annotations"] = {keys.GPU_COMPUTE: "250m", keys.GPU_MEMORY: "10Gi"}
    report = what_if(pods, {"ml": namespace("ml")}, nodes, BUILTIN_POLICY_SET)

    assert report.gpus_now == 8  # six one-GPU pods and a two-GPU pod
    assert report.gpus_needed == 2 + 2  # 6 x 250m fit on 2 GPUs; the 2-GPU pod stays whole
    assert (report.nodes_now, report.nodes_needed) == (1, 1)
    shared_group = next(g for (ns, policy), g in report.groups.items() if policy)
    assert (shared_group.pods, shared_group.gpus_now, shared_group.compute) == (6, 6, 1500)
    ((kept, why),) = report.whole
    assert kept == "ml/train"
    assert "2 GPUs" in why


def test_a_waiting_pod_is_explained_with_its_share_event_and_pool() -> None:
    pod = shared("waits", node=None)
    lines = why_pending(pod, [], [capacity("cap-3", gpu=None)])
    assert lines[0].startswith("ml/waits waits for a GPU share: 300m compute, 8Gi memory")
    assert "kube-scheduler has not reported on it yet" in lines[1]
    assert why_pending(shared("a"), [], [])[0].startswith("ml/a is not pending: bound to n1")
    unbound = whole("w")
    del unbound["spec"]["nodeName"]
    assert "is not gpupack's" in why_pending(unbound, [], [])[0]


def test_status_says_what_holds_the_gpus_the_shares_do_not_need() -> None:
    """Pool p1 holds six GPUs; its four 300m shares need two. GPU-1 and GPU-2 host three
    of them (needed), GPU-3 hosts one but is draining, and the three empty ones are no
    headroom (GPU-1 has room for one more 300m share): each is in its grace period."""
    pods = [
        shared("a"), shared("b"), shared("c", gpu="GPU-2"), shared("d", gpu="GPU-3"),
        capacity("cap-1", gpu="GPU-1"), capacity("cap-2", gpu="GPU-2"),
        capacity("cap-3", gpu="GPU-3", draining=True),
        capacity("cap-4", gpu="GPU-4"), capacity("cap-5", gpu="GPU-5"),
        capacity("cap-6", gpu="GPU-6"),
    ]  # fmt: skip
    held = status(pods, {}, []).slack
    assert (held.held, held.needed) == (6, 2)
    assert (held.draining, held.fragmentation, held.headroom, held.grace) == (1, 0, 0, 3)

    pods = [
        shared("a", compute="900m"), shared("b", compute="800m", gpu="GPU-2"),
        capacity("cap-1", gpu="GPU-1"), capacity("cap-2", gpu="GPU-2"),
        capacity("cap-4", gpu="GPU-4"), capacity("cap-5", gpu="GPU-5"),
    ]  # fmt: skip
    held = status(pods, {}, []).slack
    assert (held.held, held.needed) == (4, 2)
    # One more 900m share fits on neither used GPU: one empty GPU is the pool's headroom.
    assert (held.draining, held.fragmentation, held.headroom, held.grace) == (0, 0, 1, 1)
