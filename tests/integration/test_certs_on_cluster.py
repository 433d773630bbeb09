"""`gpupack-certs` as the install hook runs it, against a real API server."""

import base64
import copy
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.localcluster import Kube, LocalCluster, chart_webhook_configuration, free_port
from tests.integration.tools import gpupack_certs

pytestmark = pytest.mark.integration
PLACEHOLDER = base64.b64encode(b"placeholder").decode()
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def target(kube: Kube, local_cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    """A namespace and a webhook configuration of this test's own (its namespaceSelector
    matches nothing, so it never intercepts a pod)."""
    namespace, config = f"certs-{uuid.uuid4().hex[:6]}", f"certs-test-{uuid.uuid4().hex[:6]}"
    kube.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    body = chart_webhook_configuration(Path(local_cluster.binary("helm")))
    body["metadata"]["name"] = config
    for webhook in body["webhooks"]:
        webhook["namespaceSelector"] = {"matchLabels": {"gpupack.test/never": "true"}}
        webhook["clientConfig"] = {"url": "https://127.0.0.1:1/mutate", "caBundle": PLACEHOLDER}
    kube.create("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", body)
    yield namespace, config
    kube.delete(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{config}")
    kube.delete(f"/api/v1/namespaces/{namespace}")


def certs(
    kubeconfig: Path, namespace: str, config: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    return gpupack_certs(
        kubeconfig, f"--namespace={namespace}", f"--webhook-config={config}", *extra
    )


def secret(kube: Kube, namespace: str, name: str = "gpupack-webhook-tls") -> dict:  # type: ignore[type-arg]
    return kube.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")  # type: ignore[no-any-return]


def bundles(kube: Kube, config: str) -> set[str]:
    body = kube.get(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{config}")
    return {w["clientConfig"].get("caBundle", "") for w in body["webhooks"]}


def test_install_then_rerun_then_rename_then_renew(
    kube: Kube, local_cluster: LocalCluster, target: tuple[str, str]
) -> None:
    namespace, config = target
    admin = local_cluster.kubeconfig

    first = certs(admin, namespace, config)
    assert first.returncode == 0, first.stderr
    assert "issued, because" in first.stdout
    stored = secret(kube, namespace)
    assert stored["type"] == "kubernetes.io/tls"
    assert set(stored["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert bundles(kube, config) == {stored["data"]["ca.crt"]}  # both entries

    again = certs(admin, namespace, config)
    assert again.returncode == 0, again.stderr
    assert "kept" in again.stdout
    assert "caBundle already current" in again.stdout
    assert (
        secret(kube, namespace)["metadata"]["resourceVersion"]
        == stored["metadata"]["resourceVersion"]
    )

    renamed = certs(admin, namespace, config, "--dns-name=webhook.example.internal")
    assert "because the DNS names changed" in renamed.stdout
    after = secret(kube, namespace)
    assert after["data"]["tls.crt"] != stored["data"]["tls.crt"]
    assert after["data"]["ca.crt"] == stored["data"]["ca.crt"]  # same CA: caBundle unchanged
    assert b"webhook.example.internal" not in base64.b64decode(stored["data"]["tls.crt"])

    renewed = certs(
        admin,
        namespace,
        config,
        "--dns-name=webhook.example.internal",
        "--cert-validity-days=400",
        "--renew-before-days=366",
    )
    assert "in the renewal window" in renewed.stdout
    assert secret(kube, namespace)["data"]["tls.crt"] != after["data"]["tls.crt"]


def test_a_secret_of_another_type_is_left_alone(
    kube: Kube, local_cluster: LocalCluster, target: tuple[str, str]
) -> None:
    namespace, config = target
    theirs = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": "gpupack-webhook-tls", "namespace": namespace},
        "data": {"x": "eQ=="},
    }
    kube.create(f"/api/v1/namespaces/{namespace}/secrets", theirs)
    before = copy.deepcopy(secret(kube, namespace))
    result = certs(local_cluster.kubeconfig, namespace, config)
    assert result.returncode == 2
    assert "not 'kubernetes.io/tls'" in result.stderr
    assert secret(kube, namespace) == before
    assert bundles(kube, config) == {base64.b64encode(b"placeholder").decode()}


def test_missing_permissions_fail_clearly_and_write_nothing(
    kube: Kube, local_cluster: LocalCluster, target: tuple[str, str]
) -> None:
    namespace, config = target
    nobody = local_cluster.user_kubeconfig("gpupack-test-nobody")
    result = certs(nobody, namespace, config)
    assert result.returncode == 1
    assert "HTTP 403" in result.stderr
    assert "Secret" in result.stderr
    assert kube.get(f"/api/v1/namespaces/{namespace}/secrets")["items"] == []


def test_an_unreachable_api_server_fails_clearly(
    tmp_path: Path, local_cluster: LocalCluster
) -> None:
    config = local_cluster.kubeconfig.read_text().replace(
        str(local_cluster.api_port), str(free_port())
    )
    (tmp_path / "kubeconfig").write_text(config)
    result = certs(tmp_path / "kubeconfig", "gpupack-system", "gpupack-webhook")
    assert result.returncode == 1
    assert "cannot reach the API server" in result.stderr
