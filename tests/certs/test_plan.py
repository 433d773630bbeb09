import base64
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from certs.cli import ca_bundle_patch
from certs.pem import KeyAlgorithm
from certs.plan import (
    TLS_TYPE,
    CertsError,
    Wanted,
    issue_pairs,
    review,
    secret_manifests,
    service_dns_names,
    stored_pair,
    trust_bundle,
)

NOW = datetime(2026, 11, 21, tzinfo=UTC)
NAMES = service_dns_names("gpupack-webhook", "gpupack-system")
WANTED = Wanted(NAMES, algorithm=KeyAlgorithm.ECDSA_P256)


def secrets(wanted: Wanted = WANTED, now: datetime = NOW) -> tuple[dict, dict]:  # type: ignore[type-arg]
    ca, leaf = issue_pairs(None, wanted, now, "s")
    return secret_manifests("s", "ns", ca, leaf)


def test_service_names_cover_every_form_the_api_server_may_use() -> None:
    assert NAMES == (
        "gpupack-webhook",
        "gpupack-webhook.gpupack-system",
        "gpupack-webhook.gpupack-system.svc",
        "gpupack-webhook.gpupack-system.svc.cluster.local",
    )
    assert service_dns_names("w", "n", ("w", "10.0.0.1"))[-1] == "10.0.0.1"


def test_missing_secrets_are_issued() -> None:
    assert not review(None, None, WANTED, NOW, "s").keep
    _, serving = secrets()
    assert not review(serving, None, WANTED, NOW, "s").keep


def test_valid_secrets_are_kept() -> None:
    ca_secret, serving = secrets()
    verdict = review(serving, ca_secret, WANTED, NOW + timedelta(days=100), "s")
    assert verdict.keep, verdict.reason


def test_the_serving_secret_holds_no_signing_key() -> None:
    ca_secret, serving = secrets()
    assert set(serving["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert serving["type"] == ca_secret["type"] == TLS_TYPE
    assert serving["data"]["ca.crt"] == ca_secret["data"]["tls.crt"]
    assert ca_secret["metadata"]["name"] == "s-ca"


@pytest.mark.parametrize(
    ("wanted", "later", "reason"),
    [
        pytest.param(
            Wanted((*NAMES, "extra.example"), algorithm=KeyAlgorithm.ECDSA_P256),
            0,
            "DNS names",
            id="names-changed",
        ),
        pytest.param(WANTED, 340, "renewal window", id="inside-renewal-window"),
    ],
)
def test_reissue_when(wanted: Wanted, later: int, reason: str) -> None:
    ca_secret, serving = secrets()
    verdict = review(serving, ca_secret, wanted, NOW + timedelta(days=later), "s")
    assert not verdict.keep
    assert reason in verdict.reason


def test_a_leaf_signed_by_another_ca_is_reissued() -> None:
    ca_secret, _ = secrets()
    _, serving = secrets()
    assert "not signed by the stored CA" in review(serving, ca_secret, WANTED, NOW, "s").reason


def test_a_secret_of_another_type_is_never_touched() -> None:
    with pytest.raises(CertsError, match="not 'kubernetes.io/tls'"):
        review({"type": "Opaque", "data": {}}, None, WANTED, NOW, "Secret ns/s")


def test_renewal_keeps_a_ca_with_time_left_and_replaces_one_without() -> None:
    ca_secret, _ = secrets()
    ca_pem = base64.b64decode(ca_secret["data"]["tls.crt"])
    kept, _ = issue_pairs(ca_secret, WANTED, NOW + timedelta(days=340), "s")
    assert kept.cert_pem == ca_pem  # caBundle unchanged: no failed calls during rollout
    replaced, _ = issue_pairs(ca_secret, WANTED, NOW + timedelta(days=3400), "s")
    assert replaced.cert_pem != ca_pem


def _issuers(bundle: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(bundle)


def _trusted(leaf: x509.Certificate, bundle: bytes) -> bool:
    for ca in _issuers(bundle):
        try:
            leaf.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


def test_a_ca_rollover_trusts_the_old_ca_until_it_expires() -> None:
    old_ca_secret, old_serving = secrets()
    old_leaf = stored_pair(old_serving, "s").certificate
    rollover = NOW + timedelta(days=3400)  # the CA has less than a leaf's lifetime left
    new_ca, new_leaf = issue_pairs(old_ca_secret, WANTED, rollover, "s")

    bundle = trust_bundle(new_ca, old_ca_secret, rollover, "s")
    _, serving = secret_manifests("s", "ns", new_ca, new_leaf, bundle)

    assert base64.b64decode(serving["data"]["ca.crt"]) == bundle
    assert len(_issuers(bundle)) == 2
    assert _trusted(old_leaf, bundle)  # pods not yet updated keep working
    assert _trusted(new_leaf.certificate, bundle)
    expired = NOW + timedelta(days=3651)
    assert trust_bundle(new_ca, old_ca_secret, expired, "s") == new_ca.cert_pem


def test_a_renewal_with_the_same_ca_trusts_that_ca_alone() -> None:
    ca_secret, _ = secrets()
    ca, _ = issue_pairs(ca_secret, WANTED, NOW + timedelta(days=340), "s")
    assert trust_bundle(ca, ca_secret, NOW + timedelta(days=340), "s") == ca.cert_pem
    assert trust_bundle(ca, None, NOW, "s") == ca.cert_pem


def test_ca_bundle_patch_sets_every_entry_and_guards_by_name() -> None:
    config = {
        "webhooks": [
            {"name": "a", "clientConfig": {"caBundle": "old"}},
            {"name": "b", "clientConfig": {}},
        ]
    }
    patch = ca_bundle_patch(config, b"PEM")
    assert patch == [
        {"op": "test", "path": "/webhooks/0/name", "value": "a"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "UEVN"},
        {"op": "test", "path": "/webhooks/1/name", "value": "b"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "UEVN"},
    ]
    current = {"webhooks": [{"name": "a", "clientConfig": {"caBundle": "UEVN"}}]}
    assert ca_bundle_patch(current, b"PEM") == []
