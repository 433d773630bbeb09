import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs.pem import KeyAlgorithm, Usage, issue, new_ca, new_key_pair

NOW = datetime(2026, 11, 21, tzinfo=UTC)


@pytest.mark.parametrize("algorithm", [KeyAlgorithm.ECDSA_P256, KeyAlgorithm.RSA2048])
def test_serving_certificate_verifies_against_its_ca(
    tmp_path: Path, algorithm: KeyAlgorithm
) -> None:
    ca = new_ca("gpupack-ca", now=NOW, algorithm=algorithm)
    leaf = issue(
        ca,
        "gpupack-webhook",
        now=NOW,
        names=["gpupack-webhook.gpupack-system.svc", "127.0.0.1"],
        algorithm=algorithm,
    )
    cert = leaf.certificate
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gpupack-webhook.gpupack-system.svc"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    cert.verify_directly_issued_by(ca.certificate)  # raises if the signature is wrong
    # The standard library accepts the pair as a server identity and the CA as trust.
    (tmp_path / "tls.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "tls.key").write_bytes(leaf.key_pem)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    assert client.cert_store_stats()["x509_ca"] == 1


def test_client_certificate_carries_group_and_client_usage() -> None:
    ca = new_ca("ca", now=NOW, algorithm=KeyAlgorithm.ECDSA_P256)
    cert = issue(
        ca,
        "admin",
        now=NOW,
        usage=Usage.CLIENT,
        organization="system:masters",
        algorithm=KeyAlgorithm.ECDSA_P256,
    ).certificate
    assert cert.subject.rfc4514_string() == "CN=admin,O=system:masters"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_leaf_never_outlives_its_ca() -> None:
    ca = new_ca("ca", now=NOW, valid_for=timedelta(days=10), algorithm=KeyAlgorithm.ECDSA_P256)
    leaf = issue(ca, "x", now=NOW, valid_for=timedelta(days=365), algorithm=KeyAlgorithm.ECDSA_P256)
    assert leaf.certificate.not_valid_after_utc == ca.certificate.not_valid_after_utc
    assert leaf.certificate.not_valid_before_utc == NOW - timedelta(hours=1)


def test_key_pair_halves_belong_together() -> None:
    from cryptography.hazmat.primitives import serialization

    private_pem, public_pem = new_key_pair(KeyAlgorithm.ECDSA_P256)
    private = serialization.load_pem_private_key(private_pem, password=None)
    public = serialization.load_pem_public_key(public_pem)
    assert private.public_key() == public
