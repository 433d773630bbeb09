"""`helm install`, `upgrade` and `uninstall` of the chart on a real API server.

kwok runs no containers, so the hook Job's work is done here by running gpupack-certs
locally with the Job's exact arguments, read from the manifest the chart renders for
the same values, at the points where Helm would run it (before and after each phase).
A cluster of its own: the chart's cluster-scoped objects would collide with the session
cluster's webhook registration.
"""

import base64
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from certs import pem
from gpupack import keys, seal
from hack.localcluster import ApiError, Kube, LocalCluster
from hack.localcluster.chart import service_account_user
from tests.integration.tools import REPO, SMALL, cluster_of_its_own, gpupack_certs, run_module

pytestmark = pytest.mark.integration
CHART = REPO / "charts" / "gpupack"
NS = "gpupack-system"


@pytest.fixture(scope="module")
def chart_cluster(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[LocalCluster]:
    with cluster_of_its_own(tmp_path_factory, cluster, "chart", node_pools=SMALL) as local:
        yield local


def helm(cluster: LocalCluster, *args: str) -> str:
    command = [str(cluster.bin_dir / "helm"), f"--kubeconfig={cluster.kubeconfig}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def rendered(cluster: LocalCluster, *values: str) -> list[dict[str, Any]]:
    """What `helm template` renders for this release and `values`."""
    text = helm(
        cluster, "template", "gpupack", str(CHART), f"--namespace={NS}", "--kube-version=1.35.0",
        *values,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(text) if d]


def pod_of(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The pod spec of the Job or CronJob `name` among `docs`."""
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    spec = found["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else found["spec"]
    pod: dict[str, Any] = spec["template"]["spec"]
    return pod


def as_service_account(cluster: LocalCluster, pod: dict[str, Any]) -> Path:
    """A kubeconfig for the ServiceAccount `pod` runs as."""
    user, groups = service_account_user(pod["serviceAccountName"], NS)
    return cluster.user_kubeconfig(user, groups)


def hook_args(cluster: LocalCluster, values: list[str]) -> list[str]:
    args: list[str] = pod_of(rendered(cluster, *values), "Job", "gpupack-certs")["containers"][0][
        "args"
    ]
    return args


def run_hook(cluster: LocalCluster, args: list[str]) -> str:
    result = gpupack_certs(cluster.kubeconfig, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def webhook_config(kube: Kube) -> dict[str, Any]:
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpupack-webhook"
    config: dict[str, Any] = kube.get(path)
    return config


def dns_names(secret: dict[str, Any]) -> list[str]:
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    return list(
        cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value.get_values_for_type(x509.DNSName)
    )


def gone(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
    except ApiError as exc:
        return exc.status == 404
    return False


def uninstall_hook(cluster: LocalCluster) -> tuple[int, str]:
    """The pre-delete hook's command with the Job's arguments, as its ServiceAccount."""
    pod = pod_of(rendered(cluster), "Job", "gpupack-uninstall")
    args = pod["containers"][0]["args"]
    result = run_module("scheduler.uninstall", as_service_account(cluster, pod), *args)
    return result.returncode, result.stdout + result.stderr


def assert_uninstall_guard(cluster: LocalCluster, kube: Kube) -> None:
    """Uninstall refuses while a pod shares a GPU, and leaves no capacity pod after."""
    ns = kube.create_namespace("it-uninstall", {keys.OPTIMIZE: keys.OPTIMIZE_ENABLED})
    key = base64.b64decode(
        kube.get(f"/api/v1/namespaces/{NS}/secrets/gpupack-decision-key")["data"]["key"]
    )
    annotations = {
        keys.DECISION: "d-1",
        keys.ENFORCEMENT: "accounting",
        keys.GPU_COMPUTE: "300m",
        keys.GPU_MEMORY: "1Gi",
        keys.POLICY: "batch",
    }
    annotations[keys.SEAL] = seal.seal(key, ns, annotations, int(time.time()))
    charge = {keys.RESOURCE_COMPUTE: "300", keys.RESOURCE_MEMORY: "1Gi"}
    fractional = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "shares", "annotations": annotations},
        "spec": {
            "schedulerName": keys.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "resources": {"limits": charge, "requests": charge},
                    # as the webhook writes it (no webhook runs here): its GPU, none other
                    "env": [
                        {
                            "name": "NVIDIA_VISIBLE_DEVICES",
                            "valueFrom": {
                                "fieldRef": {
                                    "fieldPath": f"metadata.annotations['{keys.GPU_UUID}']"
                                }
                            },
                        }
                    ],
                }
            ],
        },
    }
    kube.create(f"/api/v1/namespaces/{ns}/pods", fractional)
    capacity = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "capacity-x", "labels": {keys.ROLE: keys.ROLE_CAPACITY}},
        "spec": {"containers": [{"name": "c", "image": "x"}], "terminationGracePeriodSeconds": 0},
    }
    kube.create(f"/api/v1/namespaces/{NS}/pods", capacity)

    code, out = uninstall_hook(cluster)
    assert code == 1, out
    assert f"refusing to uninstall: 1 pods share GPUs through gpupack ({ns}/shares)" in out
    assert not gone(kube, f"/api/v1/namespaces/{NS}/pods/capacity-x")

    kube.request(
        "DELETE", f"/api/v1/namespaces/{ns}/pods/shares", params={"gracePeriodSeconds": "0"}
    )
    kube.wait_for("the pod to go", lambda: gone(kube, f"/api/v1/namespaces/{ns}/pods/shares"))
    code, out = uninstall_hook(cluster)
    assert code == 0, out
    kube.wait_for("no capacity pod", lambda: gone(kube, f"/api/v1/namespaces/{NS}/pods/capacity-x"))
    kube.delete(f"/api/v1/namespaces/{ns}")


def renewal_args(cluster: LocalCluster) -> tuple[list[str], dict[str, Any]]:
    """The renewal CronJob's arguments and pod, as the chart renders them."""
    pod = pod_of(rendered(cluster), "CronJob", "gpupack-certs-renewal")
    return pod["containers"][0]["args"], pod


def assert_renewed_in_cluster(cluster: LocalCluster, kube: Kube) -> None:
    """The renewal CronJob's command, as its ServiceAccount, renews a certificate that is
    about to expire, with the same CA, so caBundle does not change; no Helm involved."""
    secrets = f"/api/v1/namespaces/{NS}/secrets"
    assert kube.get(f"/apis/batch/v1/namespaces/{NS}/cronjobs/gpupack-certs-renewal")
    ca_secret = kube.get(f"{secrets}/gpupack-webhook-tls-ca")
    ca = pem.KeyPair(
        base64.b64decode(ca_secret["data"]["tls.crt"]),
        base64.b64decode(ca_secret["data"]["tls.key"]),
    )
    serving = kube.get(f"{secrets}/gpupack-webhook-tls")
    names = dns_names(serving)
    issued = datetime.now(UTC) - timedelta(days=360)
    expiring = pem.issue(ca, names[0], now=issued, names=names, valid_for=timedelta(days=365))
    serving["data"]["tls.crt"] = base64.b64encode(expiring.cert_pem).decode()
    serving["data"]["tls.key"] = base64.b64encode(expiring.key_pem).decode()
    kube.merge_patch(f"{secrets}/gpupack-webhook-tls", {"data": serving["data"]})
    bundle_before = {w["clientConfig"]["caBundle"] for w in webhook_config(kube)["webhooks"]}

    args, pod = renewal_args(cluster)
    as_cronjob = as_service_account(cluster, pod)
    result = gpupack_certs(as_cronjob, *args)
    assert result.returncode == 0, result.stderr
    assert "in the renewal window" in result.stdout

    renewed = kube.get(f"{secrets}/gpupack-webhook-tls")
    leaf = x509.load_pem_x509_certificate(base64.b64decode(renewed["data"]["tls.crt"]))
    assert leaf.not_valid_after_utc > datetime.now(UTC) + timedelta(days=300)
    assert renewed["data"]["ca.crt"] == serving["data"]["ca.crt"]
    assert {w["clientConfig"]["caBundle"] for w in webhook_config(kube)["webhooks"]} == (
        bundle_before
    )
    again = gpupack_certs(as_cronjob, *args)
    assert again.returncode == 0, again.stderr
    assert "kept" in again.stdout


def assert_crds_upgraded(cluster: LocalCluster, kube: Kube) -> None:
    """An upgrade's pre-upgrade hook (gpupack-crds with the Job's arguments, as its
    ServiceAccount) puts back a field an older CRD lacked; nothing else may run it."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpupolicies.gpupack.io"
    spec_path = ("spec", "versions", 0, "schema", "openAPIV3Schema", "properties", "spec")

    def update_mode_in_schema() -> bool:
        node: Any = kube.get(path)
        for step in spec_path:
            node = node[step]
        return "updateMode" in node["properties"]

    stale = kube.get(path)  # as an older release left it: without updateMode
    node: Any = stale
    for step in spec_path:
        node = node[step]
    del node["properties"]["updateMode"]
    kube.request("PUT", path, stale)
    assert not update_mode_in_schema()

    docs = rendered(cluster)
    pod = pod_of(docs, "Job", "gpupack-crds")
    # The hook's ServiceAccount and RBAC exist only while hooks run: create its RBAC as
    # rendered, for the duration of this check.
    rbac = [
        d
        for d in docs
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding")
        and d["metadata"]["name"].startswith("gpupack-crds")
    ]
    for obj in rbac:
        kube.apply(obj)
    try:
        crds = str(CHART / "crds")  # what the Job's ConfigMap holds (tests/chart checks)
        result = run_module("ops.crds", as_service_account(cluster, pod), crds)
        assert result.returncode == 0, result.stderr
        assert "CustomResourceDefinition gpupolicies.gpupack.io: applied" in result.stdout
        assert update_mode_in_schema()
        refused = run_module("ops.crds", cluster.user_kubeconfig("nobody", []), crds)
        assert refused.returncode == 1
        assert "403" in refused.stderr
    finally:
        for obj in rbac:
            kind = "clusterroles" if obj["kind"] == "ClusterRole" else "clusterrolebindings"
            kube.delete(f"/apis/rbac.authorization.k8s.io/v1/{kind}/{obj['metadata']['name']}")


def test_install_upgrade_uninstall(chart_cluster: LocalCluster) -> None:
    kube = chart_cluster.kube()
    secrets = f"/api/v1/namespaces/{NS}/secrets"

    args = hook_args(chart_cluster, [])
    run_hook(chart_cluster, args)  # pre-install: Secrets; no webhook configuration yet
    helm(
        chart_cluster,
        "install",
        "gpupack",
        str(CHART),
        f"--namespace={NS}",
        "--create-namespace",
        "--no-hooks",
    )
    out = run_hook(chart_cluster, args)  # post-install: caBundle, owner
    # namespaces, workloads, and devices (before 1.36 the webhook writes
    # NVIDIA_VISIBLE_DEVICES=void: docs/security.md)
    assert "caBundle set on 3 webhook(s)" in out
    serving = kube.get(f"{secrets}/gpupack-webhook-tls")
    assert serving["type"] == "kubernetes.io/tls"
    assert {w["clientConfig"]["caBundle"] for w in webhook_config(kube)["webhooks"]} == {
        serving["data"]["ca.crt"]
    }
    deployment = kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/gpupack-webhook")
    assert serving["metadata"]["ownerReferences"][0]["uid"] == deployment["metadata"]["uid"]
    assert "gpupack-webhook.gpupack-system.svc" in dns_names(serving)
    policies = kube.get(f"/apis/gpupack.io/v1alpha1/namespaces/{NS}/gpupolicies")["items"]
    assert sorted(p["metadata"]["name"] for p in policies) == [
        "batch",
        "build",
        "near-real-time",
        "real-time",
        "real-time-mps",
        "training",
    ]
    driver = kube.get("/apis/storage.k8s.io/v1/csidrivers/mps.gpupack.io")["spec"]
    assert driver["volumeLifecycleModes"] == ["Ephemeral"]
    assert driver["podInfoOnMount"] is True
    assert_renewed_in_cluster(chart_cluster, kube)
    assert_crds_upgraded(chart_cluster, kube)

    renamed = ["--set=webhook.serviceName=gpupack-admission"]
    new_args = hook_args(chart_cluster, renamed)
    assert "because the DNS names changed" in run_hook(chart_cluster, new_args)  # pre-upgrade
    helm(
        chart_cluster, "upgrade", "gpupack", str(CHART), f"--namespace={NS}", "--no-hooks", *renamed
    )
    run_hook(chart_cluster, new_args)  # post-upgrade
    reissued = kube.get(f"{secrets}/gpupack-webhook-tls")
    assert "gpupack-admission.gpupack-system.svc" in dns_names(reissued)
    assert reissued["data"]["ca.crt"] == serving["data"]["ca.crt"]  # the CA, and caBundle, stay
    config = webhook_config(kube)
    assert {w["clientConfig"]["service"]["name"] for w in config["webhooks"]} == {
        "gpupack-admission"
    }
    assert {w["clientConfig"]["caBundle"] for w in config["webhooks"]} == {
        serving["data"]["ca.crt"]
    }
    assert gone(kube, f"/api/v1/namespaces/{NS}/services/gpupack-webhook")

    assert_uninstall_guard(chart_cluster, kube)
    helm(chart_cluster, "uninstall", "gpupack", f"--namespace={NS}", "--wait", "--no-hooks")
    leftovers = [
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpupack-webhook",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpupack-webhook",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/gpupack-webhook",
        f"/apis/apps/v1/namespaces/{NS}/deployments/gpupack-webhook",
        f"/api/v1/namespaces/{NS}/services/gpupack-admission",
        f"{secrets}/gpupack-webhook-tls",  # the garbage collector, through the owner
        f"{secrets}/gpupack-webhook-tls-ca",
        "/apis/storage.k8s.io/v1/csidrivers/mps.gpupack.io",
    ]
    kube.wait_for(
        "nothing of gpupack to remain", lambda: all(gone(kube, p) for p in leftovers), timeout=60
    )
    assert kube.get(f"/apis/gpupack.io/v1alpha1/namespaces/{NS}/gpupolicies")["items"] == []
    assert not gone(
        kube, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpupolicies.gpupack.io"
    )  # by design
