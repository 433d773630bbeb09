"""How the chart issues and renews the webhook's certificate: gpupack-certs as install
hooks and a renewal CronJob with the hooks' exact arguments and permissions, or
cert-manager with its CA injector."""

from typing import Any

import pytest

from certs.cli import build_parser
from certs.plan import service_dns_names
from hack.localcluster.containers import pod_spec
from tests.chart.test_chart import CUSTOM, NAMESPACE, of_kind, render

CERT_MANAGER = "--set=certificates.provider=cert-manager"


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


def pod_of(job_or_cronjob: dict[str, Any]) -> dict[str, Any]:
    return dict(pod_spec(job_or_cronjob))


def test_the_renewal_cronjob_runs_what_the_install_hook_runs_without_helm() -> None:
    docs = render(*CUSTOM)
    hook = named(docs, "Job", "gpupack-certs")
    cronjob = named(docs, "CronJob", "gpupack-certs-renewal")

    (hook_container,) = pod_of(hook)["containers"]
    (container,) = pod_of(cronjob)["containers"]
    assert container["command"] == hook_container["command"] == ["gpupack-certs"]
    assert container["args"] == hook_container["args"]
    args = build_parser().parse_args(container["args"])
    assert args.renew_before_days < args.cert_validity_days  # so a daily run renews in time
    assert "helm.sh/hook" not in cronjob["metadata"].get("annotations", {})  # it stays
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    assert cronjob["spec"]["schedule"] == "23 3 * * *"
    assert pod_of(cronjob)["serviceAccountName"] == "gpupack-certs-renewal"


def test_the_renewal_job_may_do_exactly_what_the_hook_may() -> None:
    docs = render()
    for kind in ("Role", "ClusterRole"):
        suffix = "" if kind == "Role" else f"-{NAMESPACE}"
        hook = named(docs, kind, f"gpupack-certs{suffix}")
        renewal = named(docs, kind, f"gpupack-certs-renewal{suffix}")
        assert renewal["rules"] == hook["rules"]
        for rule in renewal["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"]
            if set(rule["verbs"]) & {"update", "patch"}:
                assert rule["resourceNames"]  # only its own Secrets and webhook configuration
    binding = named(docs, "ClusterRoleBinding", f"gpupack-certs-renewal-{NAMESPACE}")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpupack-certs-renewal", "namespace": NAMESPACE}
    ]


def test_the_renewal_schedule_and_time_zone_are_values() -> None:
    docs = render(
        "--set=certificates.renewal.schedule=@hourly",
        "--set=certificates.renewal.timeZone=Europe/Paris",
    )
    spec = named(docs, "CronJob", "gpupack-certs-renewal")["spec"]
    assert (spec["schedule"], spec["timeZone"]) == ("@hourly", "Europe/Paris")


def test_with_cert_manager_it_issues_the_certificate_and_injects_the_ca() -> None:
    docs = render(CERT_MANAGER, "--set=certificates.extraDnsNames[0]=webhook.example.internal")

    assert "gpupack-certs" not in [j["metadata"]["name"] for j in of_kind(docs, "Job")]
    assert of_kind(docs, "CronJob") == []
    certificate = named(docs, "Certificate", "gpupack-webhook")
    spec = certificate["spec"]
    assert spec["secretName"] == "gpupack-webhook-tls"  # the Secret the webhook mounts
    assert tuple(spec["dnsNames"]) == service_dns_names(
        "gpupack-webhook", NAMESPACE, ("webhook.example.internal",)
    )
    assert (spec["duration"], spec["renewBefore"]) == ("8760h", "720h")
    assert spec["privateKey"] == {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}
    assert spec["issuerRef"] == {"name": "gpupack-ca", "kind": "Issuer", "group": "cert-manager.io"}
    ca_issuer = named(docs, "Issuer", "gpupack-ca")
    ca_certificate = named(docs, "Certificate", "gpupack-webhook-ca")
    assert ca_certificate["spec"]["isCA"] is True
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_certificate["spec"]["secretName"]
    assert named(docs, "Issuer", "gpupack-selfsigned")["spec"] == {"selfSigned": {}}

    (config,) = of_kind(docs, "MutatingWebhookConfiguration")
    annotations = config["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/gpupack-webhook"
    assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])


@pytest.mark.parametrize(
    ("algorithm", "key"),
    [
        pytest.param("rsa-3072", {"algorithm": "RSA", "size": 3072}, id="rsa"),
        pytest.param("ecdsa-p256", {"algorithm": "ECDSA", "size": 256}, id="ecdsa"),
    ],
)
def test_cert_manager_keys_follow_the_key_algorithm(algorithm: str, key: dict[str, Any]) -> None:
    docs = render(CERT_MANAGER, f"--set=certificates.keyAlgorithm={algorithm}")
    for name in ("gpupack-webhook", "gpupack-webhook-ca"):
        private_key = named(docs, "Certificate", name)["spec"]["privateKey"]
        assert {k: private_key[k] for k in ("algorithm", "size")} == key


def test_an_existing_cert_manager_issuer_is_used_instead_of_a_ca_of_our_own() -> None:
    docs = render(
        CERT_MANAGER,
        "--set=certificates.certManager.issuerRef.name=corporate",
        "--set=certificates.certManager.issuerRef.kind=ClusterIssuer",
    )
    assert of_kind(docs, "Issuer") == []
    assert [c["metadata"]["name"] for c in of_kind(docs, "Certificate")] == ["gpupack-webhook"]
    assert named(docs, "Certificate", "gpupack-webhook")["spec"]["issuerRef"] == {
        "name": "corporate",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_the_schema_refuses_an_unknown_provider() -> None:
    with pytest.raises(AssertionError, match="certificates/provider"):
        render_failing("--set=certificates.provider=vault")


def render_failing(*values: str) -> None:
    try:
        render(*values)
    except Exception as exc:  # subprocess.CalledProcessError: helm refused
        raise AssertionError(getattr(exc, "stderr", str(exc))) from None
