"""`helm install`, `upgrade` and `uninstall` of the chart on a real API server.

kwok runs no containers, so the hook Job's work is done here by running gpupack-certs
locally with the Job's exact arguments, read from the manifest the chart renders for
the same values, at the points where Helm would run it (before and after each phase).
A cluster of its own: the chart's cluster-scoped objects would collide with the session
cluster's webhook registration.
"""

import base64
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from cryptography import x509

from hack.localcluster import ApiError, Kube, LocalCluster, NodePool
from tests.integration.tools import REPO, gpupack_certs

pytestmark = pytest.mark.integration
CHART = REPO / "charts" / "gpupack"
NS = "gpupack-system"
SMALL = (NodePool("cpu", 1, 0, "none", 0, "16", "64Gi"),)


@pytest.fixture(scope="module")
def chart_cluster(
    tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster | None
) -> Iterator[LocalCluster]:
    if cluster is None:
        pytest.skip("installs into a cluster of its own: needs the local control plane")
    with LocalCluster(tmp_path_factory.mktemp("chart"), node_pools=SMALL) as local:
        yield local


def helm(cluster: LocalCluster, *args: str) -> str:
    command = [str(cluster.bin_dir / "helm"), f"--kubeconfig={cluster.kubeconfig}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def hook_args(cluster: LocalCluster, values: list[str]) -> list[str]:
    rendered = helm(
        cluster,
        "template",
        "gpupack",
        str(CHART),
        f"--namespace={NS}",
        "--kube-version=1.35.0",
        *values,
    )
    (job,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Job"]
    args: list[str] = job["spec"]["template"]["spec"]["containers"][0]["args"]
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
    assert "caBundle set on 2 webhook(s)" in out
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

    helm(chart_cluster, "uninstall", "gpupack", f"--namespace={NS}", "--wait")
    leftovers = [
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpupack-webhook",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpupack-webhook",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/gpupack-webhook",
        f"/apis/apps/v1/namespaces/{NS}/deployments/gpupack-webhook",
        f"/api/v1/namespaces/{NS}/services/gpupack-admission",
        f"{secrets}/gpupack-webhook-tls",  # the garbage collector, through the owner
        f"{secrets}/gpupack-webhook-tls-ca",
    ]
    kube.wait_for(
        "nothing of gpupack to remain", lambda: all(gone(kube, p) for p in leftovers), timeout=60
    )
    assert kube.get(f"/apis/gpupack.io/v1alpha1/namespaces/{NS}/gpupolicies")["items"] == []
    assert not gone(
        kube, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpupolicies.gpupack.io"
    )  # by design
