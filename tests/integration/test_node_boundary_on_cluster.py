"""The GPU node is a trust boundary (docs/security.md), asked of the API server itself:
what each of gpupack's credentials may do (`kubectl auth can-i --list`, against the table
the docs give), and what the admission policies refuse when those credentials, or a
user, try more (impersonation, as `kubectl --as` does: the API server, RBAC and the
policies decide as for the real token)."""

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupack import keys
from hack.localcluster import SYSTEM_NAMESPACE, ApiError, Kube, LocalCluster
from hack.localcluster.chart import CHART_DIR, EXPORTER_NAME, SCHEDULER_NAME

pytestmark = pytest.mark.integration
JSON = dict[str, Any]
SECURITY = Path(__file__).parents[2] / "docs" / "security.md"
NODE_NAME = "authentication.kubernetes.io/node-name"
EXPORTER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{EXPORTER_NAME}"
SCHEDULER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{SCHEDULER_NAME}"


# --- rights per ServiceAccount ----------------------------------------------------------

RELEASE = "gpupack-rights"  # a release of its own: its RBAC beside the session's
RIGHTS_NAMESPACE = "gpupack-rights-system"


BUILT_IN = ("system:kube-scheduler", "system:volume-scheduler",
            "extension-apiserver-authentication-reader")  # fmt: skip


def documented_rights() -> dict[str, set[tuple[str, str, str, str]]]:
    """docs/security.md's table "Rights per ServiceAccount": ServiceAccount -> {(where,
    resource, names, verbs)}, where is `cluster` or `release namespace`."""
    text = SECURITY.read_text()
    table = text[text.index("### Rights per ServiceAccount") :]
    rights: dict[str, set[tuple[str, str, str, str]]] = {}
    for line in table.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("ServiceAccount", "") or set(cells[0]) <= {"-"}:
            continue
        account, where, resource, names, verbs = cells
        verbs = ", ".join(sorted(v.strip() for v in verbs.split(",")))
        rights.setdefault(account, set()).add((where, resource, names, verbs))
    return rights


def granted(cluster: LocalCluster, account: str, namespace: str) -> dict[tuple[str, str], set[str]]:
    """`kubectl auth can-i --list` of the ServiceAccount in `namespace`: (resource, names)
    -> verbs, without what every authenticated user has (discovery, self reviews)."""
    listed = cluster.tool(
        "kubectl", "auth", "can-i", "--list",
        f"--as=system:serviceaccount:{RIGHTS_NAMESPACE}:{account}", f"--namespace={namespace}",
    )  # fmt: skip
    rights: dict[tuple[str, str], set[str]] = {}
    for line in listed.splitlines()[1:]:
        match = re.match(r"^(\S+)\s+\[\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$", line)
        if not match or match.group(1).startswith("selfsubject"):
            continue
        resource, names, verbs = match.groups()
        named = ", ".join(sorted(names.replace(RELEASE, "gpupack").split())) or "any"
        rights.setdefault((resource, named), set()).update(verbs.split())
    return rights


def beyond(
    rights: dict[tuple[str, str], set[str]], anyone: dict[tuple[str, str], set[str]]
) -> dict[tuple[str, str], set[str]]:
    """`rights` without the verbs `anyone` has on the same resource and names."""
    out = {key: verbs - anyone.get(key, set()) for key, verbs in rights.items()}
    return {key: verbs for key, verbs in out.items() if verbs}


@pytest.fixture(scope="module")
def rights_release(cluster: LocalCluster | None) -> Iterator[tuple[LocalCluster, set[str]]]:
    """The chart's RBAC, as `helm template` renders it with the defaults, under a release
    of its own, applied to the local cluster; and which built-in roles it binds (not
    applied: their rules are the Kubernetes release's)."""
    if cluster is None:
        pytest.skip("applies a second release's RBAC: needs the local cluster")
    admin = cluster.kube()
    rendered = subprocess.run(
        [cluster.binary("helm"), "template", RELEASE, str(CHART_DIR),
         f"--namespace={RIGHTS_NAMESPACE}", "--kube-version=1.35.0"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RIGHTS_NAMESPACE}})
    made, built_in = [], set()
    for doc in yaml.safe_load_all(rendered):
        if not doc or doc["kind"] not in (
            "ClusterRole",
            "Role",
            "ClusterRoleBinding",
            "RoleBinding",
        ):
            continue
        role = doc.get("roleRef", {}).get("name", "")
        if role in BUILT_IN:
            built_in.add(f"{doc['subjects'][0]['name'].replace(RELEASE, 'gpupack')} {role}")
            continue
        doc["metadata"].pop("annotations", None)  # helm's hooks: applied as they are
        admin.apply(doc)
        made.append(doc)
    yield cluster, built_in
    for doc in made:
        kind, name = doc["kind"], doc["metadata"]["name"]
        scope = f"namespaces/{RIGHTS_NAMESPACE}/" if kind in ("Role", "RoleBinding") else ""
        plural = {"ClusterRole": "clusterroles", "Role": "roles"}.get(kind, kind.lower() + "s")
        admin.delete(f"/apis/rbac.authorization.k8s.io/v1/{scope}{plural}/{name}")
    admin.delete(f"/api/v1/namespaces/{RIGHTS_NAMESPACE}")


@pytest.mark.smoke  # every release's default roles differ (1.37 added one every account has)
def test_every_service_account_has_exactly_the_rights_the_docs_list(
    rights_release: tuple[LocalCluster, set[str]],
) -> None:
    cluster, built_in = rights_release
    # kube-scheduler's own roles, as kubeadm binds them to a scheduler: nothing else.
    assert built_in == {f"gpupack-scheduler {role}" for role in BUILT_IN}
    documented = documented_rights()
    assert set(documented) >= {"gpupack-exporter", "gpupack-csi", "gpupack-scheduler"}
    # What any ServiceAccount has that no binding names (the Kubernetes release's default
    # roles: ClusterTrustBundles read from 1.37 on) is not the chart's to list.
    anyone = granted(cluster, "bound-to-nothing", "default")
    anyone_here = granted(cluster, "bound-to-nothing", RIGHTS_NAMESPACE)
    actual: dict[str, set[tuple[str, str, str, str]]] = {}
    for account in documented:
        name = account.replace("gpupack", RELEASE, 1)
        everywhere = beyond(granted(cluster, name, "default"), anyone)
        here = beyond(granted(cluster, name, RIGHTS_NAMESPACE), anyone_here)
        rows = {("cluster", *key, ", ".join(sorted(verbs))) for key, verbs in everywhere.items()}
        for key, verbs in here.items():
            if verbs - everywhere.get(key, set()):
                rows.add(
                    (
                        "release namespace",
                        *key,
                        ", ".join(sorted(verbs - everywhere.get(key, set()))),
                    )
                )
        actual[account] = rows
    assert actual == documented


# --- the node agent's fence -------------------------------------------------------------


def gpu_nodes(kube: Kube) -> list[str]:
    nodes = kube.get("/api/v1/nodes", labelSelector="nvidia.com/gpu.present=true")["items"]
    return sorted(n["metadata"]["name"] for n in nodes if n["metadata"]["name"].startswith("gpu"))


def held_pod(name: str, node: str, role: str = keys.ROLE_CAPACITY) -> JSON:
    """A pod of the release namespace already bound to `node` (as kube-scheduler leaves a
    capacity pod), labelled as gpupack's `role`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE, "labels": {keys.ROLE: role}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "hold", "image": "registry.k8s.io/pause:3.10"}],
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


@pytest.fixture
def two_nodes_pods(kube: Kube, cluster: LocalCluster | None) -> Iterator[tuple[str, str]]:
    """A capacity pod on each of two GPU nodes, and a stand-in of a control-plane pod
    (the scheduler's) on the first; yields the two nodes."""
    if cluster is None:
        pytest.skip("impersonates gpupack's ServiceAccounts: needs the local cluster")
    cluster.exporter_kubeconfig()  # the chart's RBAC for the exporter
    first, second = gpu_nodes(kube)[:2]
    pods = [held_pod("fence-here", first), held_pod("fence-there", second),
            held_pod("fence-scheduler", first, role="scheduler")]  # fmt: skip
    path = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"
    for pod in pods:
        kube.create(path, pod)
    yield first, second
    for pod in pods:
        kube.delete(f"{path}/{pod['metadata']['name']}")


@contextmanager
def acting_as(kube: Kube, user: str, extra: dict[str, str] | None = None) -> Iterator[Kube]:
    """`kube` impersonating `user`; its connection closed after."""
    client = kube.impersonating(user, extra)
    try:
        yield client
    finally:
        client.close()


def refused_by(write: Any, policy: str) -> str:
    """The API server's refusal of `write()`, which must name the admission policy."""
    with pytest.raises(ApiError) as refused:
        write()
    assert refused.value.status == 403, refused.value
    assert f"ValidatingAdmissionPolicy '{policy}'" in refused.value.body, refused.value.body
    return refused.value.body


def test_the_node_agent_writes_only_its_annotations_on_its_own_nodes_capacity_pods(
    kube: Kube, two_nodes_pods: tuple[str, str]
) -> None:
    here, there = two_nodes_pods
    pods = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"
    uuid = {
        "metadata": {"annotations": {keys.GPU_UUID: "GPU-11111111-2222-3333-4444-555555555555"}}
    }
    fence = "gpupack-exporter-writes"
    with acting_as(kube, EXPORTER, {NODE_NAME: here}) as agent:
        stored = agent.merge_patch(f"{pods}/fence-here", uuid)  # its own: admitted
        assert stored["metadata"]["annotations"][keys.GPU_UUID].startswith("GPU-1111")

        said = refused_by(lambda: agent.merge_patch(f"{pods}/fence-there", uuid), fence)
        assert f"its token is bound to node {here}, the pod runs on {there}" in said
        label = {"metadata": {"labels": {keys.ROLE: "capacity", "team": "x"}}}
        said = refused_by(lambda: agent.merge_patch(f"{pods}/fence-here", label), fence)
        assert "may not change a pod's labels" in said
        other = {"metadata": {"annotations": {keys.GPU_COMPUTE: "1"}}}
        said = refused_by(lambda: agent.merge_patch(f"{pods}/fence-here", other), fence)
        assert "not gpupack.io/gpu-compute" in said
        owner = {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                 "name": there, "uid": "00000000-0000-0000-0000-000000000000"}]}}  # fmt: skip
        refused_by(lambda: agent.merge_patch(f"{pods}/fence-here", owner), fence)
        image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil.example/s:1"}]
        said = refused_by(
            lambda: agent.request("PATCH", f"{pods}/fence-scheduler", image,
                                  content_type="application/json-patch+json"),
            fence,
        )  # fmt: skip
        assert "only annotate gpupack's capacity pods" in said
        with pytest.raises(ApiError) as deleted:  # and RBAC: no delete at all
            agent.request("DELETE", f"{pods}/fence-here")
        assert deleted.value.status == 403
        # RBAC: no pod write outside the release namespace, where the fence is not bound.
        with pytest.raises(ApiError) as elsewhere:
            agent.merge_patch("/api/v1/namespaces/default/pods/anyone", uuid)
        assert elsewhere.value.status == 403
        assert "cannot patch resource" in elsewhere.value.body, elsewhere.value.body
    with acting_as(kube, EXPORTER) as unbound:  # a token from anywhere but a kubelet
        said = refused_by(lambda: unbound.merge_patch(f"{pods}/fence-here", uuid), fence)
        assert "bound to no node" in said


# --- the scheduler's fences, and its scheduler name --------------------------------------


def test_the_scheduler_cannot_re_own_or_un_finalize_a_node_or_a_users_pod(
    kube: Kube, plain_namespace: str, two_nodes_pods: tuple[str, str], cluster: LocalCluster
) -> None:
    node = two_nodes_pods[0]
    cluster.component_kubeconfig(SCHEDULER_NAME, "templates/scheduler.yaml")  # its RBAC
    dangling = [{"apiVersion": "v1", "kind": "Namespace", "name": "gone",
                 "uid": "00000000-0000-0000-0000-000000000001"}]  # fmt: skip
    path = f"/api/v1/namespaces/{plain_namespace}/pods"
    kube.create(path, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "kept", "finalizers": ["example.com/keep"]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    })  # fmt: skip
    try:
        with acting_as(kube, SCHEDULER) as scheduler:
            nodes = "gpupack-scheduler-node-writes"
            owned = {"metadata": {"ownerReferences": dangling}}
            said = refused_by(lambda: scheduler.merge_patch(f"/api/v1/nodes/{node}", owned), nodes)
            assert "may not change owner references" in said
            held = {"metadata": {"finalizers": ["example.com/hold"]}}
            said = refused_by(lambda: scheduler.merge_patch(f"/api/v1/nodes/{node}", held), nodes)
            assert "finalizers" in said

            pods = "gpupack-immutable-allocations"
            freed = {"metadata": {"finalizers": None}}
            said = refused_by(lambda: scheduler.merge_patch(f"{path}/kept", freed), pods)
            assert "finalizers" in said
            refused_by(lambda: scheduler.merge_patch(f"{path}/kept", owned), pods)
            cost = {
                "metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "5"}}
            }
            scheduler.merge_patch(f"{path}/kept", cost)  # what its patch is for: admitted
    finally:
        kube.merge_patch(f"{path}/kept", {"metadata": {"finalizers": None}})
        kube.delete(f"{path}/kept")


def test_only_the_scheduler_creates_pods_for_the_capacity_profile(
    kube: Kube, plain_namespace: str
) -> None:
    """A user who may create pods in their namespace (the built-in `edit` role)."""
    kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{plain_namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "alice-edits"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    })  # fmt: skip
    body: JSON = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "crowding"},
        "spec": {
            "schedulerName": "gpupack-capacity",
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }  # fmt: skip
    pods = f"/api/v1/namespaces/{plain_namespace}/pods"
    with acting_as(kube, "alice") as alice:
        said = refused_by(lambda: alice.create(pods, body), "gpupack-pods")
        assert "schedulerName gpupack-capacity is gpupack's own" in said
        body["spec"]["schedulerName"] = "default-scheduler"
        alice.create(pods, body, dry_run=True)  # the same pod for the default scheduler
