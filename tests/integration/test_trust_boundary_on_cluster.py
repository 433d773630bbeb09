"""gpupack's trust boundary on the real API server, with the chart's admission policies:
forged decisions, edited allocations, capacity pods deleted or evicted under their pods,
device variables and GPU quotas. Each forgery is attempted and refused by the API server
(or, where it passes admission, by the scheduler)."""

from collections.abc import Iterator
from typing import Any

import pytest

from gpupack import keys, seal
from hack.localcluster import SYSTEM_NAMESPACE, ApiError, Kube, LocalCluster
from tests.integration.scheduling import capacity_pods, create, wait_bound
from tests.integration.workloads import deployment

pytestmark = pytest.mark.integration
JSON = dict[str, Any]


def bare_pod(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", **spec.pop("container", {})}],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


def refused(kube: Kube, ns: str, body: JSON) -> str:
    """Create `body` and return the API server's refusal (the test fails if it is taken)."""
    with pytest.raises(ApiError) as error:
        kube.create(f"/api/v1/namespaces/{ns}/pods", body)
    assert error.value.status in (403, 422), error.value.body
    return error.value.body


@pytest.fixture
def admitted(kube: Kube, opted_in_namespace: str, scheduler: LocalCluster) -> JSON:
    """One pod the webhook rewrote and gpupack-scheduler bound."""
    create(kube, deployment(opted_in_namespace, "real", 1, "300m", memory="4Gi"))
    (pod,) = wait_bound(kube, opted_in_namespace, "real", 1)
    return pod


def test_a_pod_outside_an_opted_in_scope_cannot_name_gpupack_scheduler(
    kube: Kube, plain_namespace: str, scheduler: LocalCluster
) -> None:
    forged = {keys.DECISION: "forged", keys.GPU_COMPUTE: "1m", keys.GPU_MEMORY: "1Mi"}
    why = refused(
        kube, plain_namespace, bare_pod("forged", forged, schedulerName=keys.SCHEDULER_NAME)
    )
    assert f"namespace {plain_namespace} is not opted in" in why


@pytest.mark.smoke
def test_a_made_up_decision_in_an_opted_in_namespace_is_replaced_by_a_sealed_one(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    ns = opted_in_namespace
    workload = deployment(ns, "forger", 1, "1m")
    template = workload["spec"]["template"]
    template["metadata"]["annotations"] |= {keys.DECISION: "forged", keys.SEAL: "v1.1.AAAA"}
    template["spec"]["schedulerName"] = keys.SCHEDULER_NAME
    create(kube, workload)

    (pod,) = wait_bound(kube, ns, "forger", 1)
    annotations = pod["metadata"]["annotations"]
    assert annotations[keys.DECISION] != "forged"  # the webhook's own admission uid
    key = scheduler.decision_key_file.read_bytes()
    assert seal.verify(key, ns, annotations)  # sealed by the webhook, for this namespace
    charged = pod["spec"]["containers"][0]["resources"]["requests"]
    assert (charged[keys.RESOURCE_COMPUTE], charged[keys.RESOURCE_MEMORY]) == (
        "1",
        annotations[keys.GPU_MEMORY],
    )


def test_a_pod_naming_gpupack_scheduler_without_a_gpu_request_is_refused(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    """The webhook strips the made-up decision (it has no GPU request to rewrite); the
    admission policy then refuses a gpupack-scheduler pod without one."""
    forged = {keys.DECISION: "forged", keys.SEAL: "v1.1.AAAA", keys.GPU_COMPUTE: "1m"}
    why = refused(
        kube, opted_in_namespace, bare_pod("x", forged, schedulerName=keys.SCHEDULER_NAME)
    )
    assert "did not admit" in why


@pytest.mark.parametrize(
    ("metadata", "named"),
    [
        ({"annotations": {keys.GPU_UUID: "GPU-00000000-0000-0000-0000-000000000000"}}, keys.GPU_UUID),
        ({"annotations": {keys.CAPACITY_POD: "gpupack-capacity-a100-0"}}, keys.CAPACITY_POD),
        ({"labels": {keys.HOSTING: "true"}}, keys.HOSTING),
    ],
)  # fmt: skip
def test_nobody_but_gpupack_creates_a_pod_with_what_only_its_scheduler_writes(
    kube: Kube, plain_namespace: str, metadata: JSON, named: str
) -> None:
    """A GPU, a capacity pod or the hosting label written by hand at creation, on a pod
    the webhook never sees: refused by the API server, naming the key."""
    body = bare_pod("forged")
    body["metadata"] |= metadata
    assert f"gpupack: {named} may only be written by gpupack" in refused(
        kube, plain_namespace, body
    )


@pytest.mark.smoke
@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({keys.GPU_COMPUTE: "1m"}, keys.GPU_COMPUTE),
        ({keys.GPU_UUID: "GPU-00000000-0000-0000-0000-000000000000"}, keys.GPU_UUID),
        ({keys.DECISION: None}, keys.DECISION),
        ({keys.SEAL: None}, keys.SEAL),
    ],
)
def test_nobody_but_gpupack_changes_an_admitted_pods_allocation(
    kube: Kube, admitted: JSON, edit: dict[str, str | None], named: str
) -> None:
    meta = admitted["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    for subresource in ("", "/status"):
        with pytest.raises(ApiError) as error:
            kube.merge_patch(path + subresource, {"metadata": {"annotations": edit}})
        assert error.value.status == 403
        assert f"annotation {named}" in error.value.body
    assert kube.get(path)["metadata"]["annotations"] == meta["annotations"]


@pytest.mark.parametrize("subresource", ["", "/status"])
def test_nobody_but_gpupack_changes_an_admitted_pods_gpupack_labels(
    kube: Kube, admitted: JSON, subresource: str
) -> None:
    """A gpupack.io/ label added by hand, through an update or a status update: refused,
    naming it; a label of the user's own in the same place passes (the policy's match
    condition lets every change of metadata through to its validations, which decide)."""
    meta = admitted["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}" + subresource
    with pytest.raises(ApiError) as error:
        kube.merge_patch(path, {"metadata": {"labels": {"gpupack.io/role": "capacity"}}})
    assert error.value.status == 403, error.value.body
    assert "gpupack: label gpupack.io/role is written by gpupack only" in error.value.body
    kube.merge_patch(path, {"metadata": {"labels": {"team": "a"}}})
    assert kube.get(path)["metadata"]["labels"]["team"] == "a"


def test_a_status_update_that_leaves_the_metadata_alone_passes(kube: Kube, admitted: JSON) -> None:
    """What every kubelet writes many times per pod: a status change, no metadata change.
    The policies let it through: gpupack-immutable-allocations' match condition neither
    errs (failurePolicy Fail would refuse the write) nor sends it to a check that refuses."""
    meta = admitted["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
    condition = {"type": "gpupack.io/test", "status": "True"}
    conditions = [*kube.get(path)["status"].get("conditions", []), condition]
    kube.merge_patch(path, {"status": {"conditions": conditions}})
    conditions = kube.get(path)["status"]["conditions"]
    assert any(c["type"] == "gpupack.io/test" for c in conditions), conditions
    assert kube.get(path)["metadata"]["annotations"] == meta["annotations"]


def test_a_binding_carries_no_gpupack_annotation_but_from_gpupack(
    kube: Kube, plain_namespace: str
) -> None:
    """A Binding that names a GPU, posted by anyone but gpupack-scheduler: refused before
    the pod is bound; the same Binding without it binds the pod."""
    kube.create(
        f"/api/v1/namespaces/{plain_namespace}/pods",
        bare_pod("bound-by-hand", schedulerName="nobody", tolerations=[{"operator": "Exists"}]),
    )
    path = f"/api/v1/namespaces/{plain_namespace}/pods/bound-by-hand"
    node = next(n["metadata"]["name"] for n in kube.get("/api/v1/nodes")["items"])
    binding: JSON = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "bound-by-hand", "annotations": {keys.GPU_UUID: "GPU-forged"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    with pytest.raises(ApiError) as error:
        kube.create(path + "/binding", binding)
    assert error.value.status == 403, error.value.body
    assert f"a Binding may not carry {keys.GPU_UUID}" in error.value.body
    assert not kube.get(path)["spec"].get("nodeName")
    binding["metadata"]["annotations"] = {"team": "a"}
    kube.create(path + "/binding", binding)
    assert kube.get(path)["spec"]["nodeName"] == node


def test_a_capacity_pod_that_hosts_pods_is_neither_deleted_nor_evicted(
    kube: Kube, admitted: JSON
) -> None:
    holder = admitted["metadata"]["annotations"][keys.CAPACITY_POD]
    path = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{holder}"
    assert capacity_pods(kube)[holder]["metadata"]["labels"][keys.HOSTING] == "true"

    with pytest.raises(ApiError) as deleted:
        kube.request("DELETE", path)  # (Kube.delete ignores errors)
    assert deleted.value.status == 403
    assert "holds the GPU" in deleted.value.body
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": holder}}
    with pytest.raises(ApiError) as evicted:
        kube.create(path + "/eviction", eviction)
    assert evicted.value.status == 429  # the PodDisruptionBudget of hosting capacity pods
    assert not kube.get(path)["metadata"].get("deletionTimestamp")


@pytest.mark.parametrize(
    "env",
    [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-00000000-0000-0000-0000-000000000000"},
        {"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"},
        {
            "name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpupack.io/gpu-uuid']"}},
        },
    ],
)
def test_containers_in_opted_in_namespaces_cannot_select_gpus_themselves(
    kube: Kube, opted_in_namespace: str, env: JSON
) -> None:
    why = refused(kube, opted_in_namespace, bare_pod("devices", container={"env": [env]}))
    assert "may not set NVIDIA_VISIBLE_DEVICES" in why


@pytest.mark.parametrize(
    "env",
    [
        {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "143771"},
        {"name": "NVIDIA_GPU_MEMORY_REQUEST", "value": "1"},
        {"name": "GPUPACK_CUDA_DIR", "value": "/tmp"},
    ],
)
def test_containers_in_opted_in_namespaces_cannot_set_their_own_gpu_memory_limit(
    kube: Kube, opted_in_namespace: str, env: JSON
) -> None:
    why = refused(kube, opted_in_namespace, bare_pod("memory", container={"env": [env]}))
    assert "may not set NVIDIA_GPU_MEMORY_LIMIT" in why


def test_a_limit_that_is_not_the_pods_share_is_refused_on_a_pod_gpupack_admitted(
    kube: Kube, opted_in_namespace: str
) -> None:
    # The webhook rewrites the GPU container's own variables; a sidecar's it leaves, so
    # only the admission policy stands between it and a limit of its choosing.
    body = bare_pod(
        "sidecar-limit",
        container={"resources": {"limits": {"nvidia.com/gpu": "1"}}},
    )
    body["spec"]["containers"].append(
        {"name": "s", "image": "busybox",
         "env": [{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "99999"}]}
    )  # fmt: skip
    why = refused(kube, opted_in_namespace, body)
    assert "may not set NVIDIA_GPU_MEMORY_LIMIT" in why


def test_the_limit_gpupack_writes_passes_its_own_policy(
    kube: Kube, opted_in_namespace: str, scheduler: LocalCluster
) -> None:
    create(kube, deployment(opted_in_namespace, "held", 1, "300m", memory="4Gi"))
    (pod,) = wait_bound(kube, opted_in_namespace, "held", 1)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_GPU_MEMORY_LIMIT"] == env["NVIDIA_GPU_MEMORY_REQUEST"] == "4096"
    assert env["GPUPACK_CUDA_DIR"] == "/run/gpupack/cuda"  # and the shim's directory too
    assert pod["metadata"]["annotations"][keys.ENFORCEMENT] == "memory"
    assert {"name": "gpupack-cuda", "csi": {"driver": "cuda.gpupack.io"}} in pod["spec"]["volumes"]


def test_device_variables_are_refused_everywhere_but_the_exempt_namespaces(
    kube: Kube, plain_namespace: str
) -> None:
    """security.deviceEnv.scope=cluster (the default): a namespace gpupack never shares
    in is no way onto every GPU of a node; kube-system (exempt, with the GPU operator's
    namespaces) keeps its device agents' variables as written."""
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]
    kube.create(
        f"/api/v1/namespaces/{plain_namespace}/pods", bare_pod("ok", container={"env": env})
    )
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    with pytest.raises(ApiError) as refused:
        kube.create(
            f"/api/v1/namespaces/{plain_namespace}/pods", bare_pod("all", container={"env": env})
        )
    assert refused.value.status == 403
    assert "may not set NVIDIA_VISIBLE_DEVICES" in refused.value.body
    agent = bare_pod(f"device-agent-{plain_namespace}", container={"env": env})
    stored = kube.create("/api/v1/namespaces/kube-system/pods", agent)
    try:
        assert stored["spec"]["containers"][0]["env"] == env
    finally:
        kube.delete(f"/api/v1/namespaces/kube-system/pods/{agent['metadata']['name']}")


@pytest.fixture
def quota_namespace(kube: Kube) -> Iterator[str]:
    name = kube.create_namespace("it-quota", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    kube.create(
        f"/api/v1/namespaces/{name}/resourcequotas",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus"},
            "spec": {
                "hard": {
                    f"requests.{keys.RESOURCE_COMPUTE}": "1000",  # one GPU of compute
                    f"requests.{keys.RESOURCE_MEMORY}": "20Gi",
                }
            },
        },
    )
    kube.wait_for(
        "the quota's status",
        lambda: (
            kube.get(f"/api/v1/namespaces/{name}/resourcequotas/gpus").get("status", {}).get("hard")
        ),
        timeout=30,
    )
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")


def test_a_gpu_quota_admits_pods_up_to_it_and_refuses_the_next(
    kube: Kube, quota_namespace: str, scheduler: LocalCluster
) -> None:
    ns = quota_namespace

    def gpu_pod(name: str, compute: str, memory: str) -> JSON:
        template = deployment(ns, name, 1, compute, memory=memory)["spec"]["template"]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            **template,
            "metadata": {**template["metadata"], "name": name},
        }

    for index in range(2):  # 2 x 400m, 2 x 8Gi: inside 1000m and 20Gi
        kube.create(f"/api/v1/namespaces/{ns}/pods", gpu_pod(f"p{index}", "400m", "8Gi"))
    compute = refused(kube, ns, gpu_pod("over-compute", "300m", "1Gi"))
    assert "exceeded quota: gpus" in compute
    assert keys.RESOURCE_COMPUTE in compute
    memory = refused(kube, ns, gpu_pod("over-memory", "100m", "8Gi"))
    assert "exceeded quota: gpus" in memory
    assert keys.RESOURCE_MEMORY in memory
    # The quota's extended resources are no node's: kube-scheduler ignores them (the
    # extender's managedResources) and the pods are placed on shared GPUs.
    for index in range(2):
        kube.wait_for(
            f"p{index} bound",
            lambda index=index: kube.get(f"/api/v1/namespaces/{ns}/pods/p{index}")["spec"].get(
                "nodeName"
            ),  # type: ignore[misc]
            timeout=60,
        )


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        pytest.param({"metadata": {"labels": {"app": "hijacked"}}}, "labels", id="label"),
        pytest.param(
            {"metadata": {"annotations": {"prometheus.io/scrape": "true"}}},
            "prometheus.io/scrape",
            id="annotation",
        ),
        pytest.param({"spec": {"activeDeadlineSeconds": 1}}, "spec", id="spec"),
    ],
)
def test_the_schedulers_pod_patch_reaches_nothing_but_the_deletion_cost(
    admitted: JSON, as_scheduler: Kube, edit: JSON, named: str
) -> None:
    """The scheduler may patch pods cluster-wide for pod-deletion-cost alone: the API
    server refuses any other change it makes to a user's pod."""
    meta = admitted["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    refused_to_scheduler(as_scheduler, path, edit, named)
    cost = {keys.POD_DELETION_COST: "100", keys.DELETION_COST: "100"}
    as_scheduler.merge_patch(path, {"metadata": {"annotations": cost}})


@pytest.fixture
def as_scheduler(scheduler: LocalCluster) -> Iterator[Kube]:
    """A client with gpupack-scheduler's ServiceAccount and the chart's RBAC for it."""
    client = Kube.from_kubeconfig(
        scheduler.component_kubeconfig("gpupack-scheduler", "templates/scheduler.yaml")
    )
    try:
        yield client
    finally:
        client.close()


def refused_to_scheduler(as_scheduler: Kube, path: str, edit: JSON, named: str) -> None:
    """The merge patch `edit` of `path`, refused by the chart's admission policy, naming
    `named`."""
    with pytest.raises(ApiError) as error:
        as_scheduler.merge_patch(path, edit)
    assert error.value.status == 403, error.value.body
    assert "gpupack: the scheduler may" in error.value.body
    assert named in error.value.body


@pytest.fixture
def bare_node(kube: Kube) -> Iterator[str]:
    """A Node object no kubelet serves: only its metadata and spec matter here."""
    name = "trust-node-labels"
    kube.create(
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"team": "a"}}},
    )
    try:
        yield name
    finally:
        kube.delete(f"/api/v1/nodes/{name}")


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        pytest.param({"metadata": {"labels": {"team": "b"}}}, "team", id="other-label"),
        pytest.param({"metadata": {"annotations": {"note": "x"}}}, "annotations", id="annotation"),
        pytest.param({"spec": {"unschedulable": True}}, "spec", id="cordon"),
    ],
)
def test_the_schedulers_node_patch_reaches_nothing_but_adding_gpupacks_node_label(
    kube: Kube, as_scheduler: Kube, bare_node: str, edit: JSON, named: str
) -> None:
    """Where Karpenter may run, the scheduler labels GPU nodes with gpupack.io/node, and
    that is all the API server lets it do to a node: it cannot relabel, annotate, cordon
    or taint one, nor change or remove the label once written."""
    path = f"/api/v1/nodes/{bare_node}"
    refused_to_scheduler(as_scheduler, path, edit, named)

    as_scheduler.merge_patch(path, {"metadata": {"labels": {keys.NODE: bare_node}}})
    assert kube.get(path)["metadata"]["labels"][keys.NODE] == bare_node
    for value in ("another", None):
        with pytest.raises(ApiError) as error:
            as_scheduler.merge_patch(path, {"metadata": {"labels": {keys.NODE: value}}})
        assert error.value.status == 403, error.value.body
        assert "never changed or removed" in error.value.body
