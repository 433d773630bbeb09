"""What `gpupack-certs` should do with the webhook's Secrets: keep them, or issue anew.

Pure: the existing Secrets (or None), what is wanted, and the time in; a verdict and
the new Secrets out. Two Secrets, both `kubernetes.io/tls`: the serving one that webhook
pods mount (`tls.crt`, `tls.key`, `ca.crt`), and `<name>-ca` with the CA's key, which
only the certificate job reads, so no webhook pod ever holds a key that can sign. A CA
that is still valid is kept when only the serving certificate is renewed: caBundle
stays the same, and no webhook call fails while the new certificate reaches the pods.
"""

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from cryptography import x509

from certs.pem import KeyAlgorithm, KeyPair, issue, new_ca

TLS_TYPE: Final = "kubernetes.io/tls"
CA_KEY: Final = "ca.crt"
JSON = dict[str, Any]


class CertsError(Exception):
    """Something `gpupack-certs` must not paper over; the message says what and where."""


@dataclass(frozen=True, slots=True)
class Wanted:
    dns_names: tuple[str, ...]
    ca_validity: timedelta = timedelta(days=3650)
    cert_validity: timedelta = timedelta(days=365)
    renew_before: timedelta = timedelta(days=30)
    algorithm: KeyAlgorithm = KeyAlgorithm.ECDSA_P256


@dataclass(frozen=True, slots=True)
class Verdict:
    keep: bool
    reason: str  # one sentence: why kept, or why issued


def service_dns_names(service: str, namespace: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The names the API server may use to reach a webhook Service."""
    base = (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )
    return base + tuple(name for name in extra if name not in base)


def _decode(secret: JSON, key: str, where: str) -> bytes:
    value = (secret.get("data") or {}).get(key)
    if not value:
        raise CertsError(f"{where}: data[{key!r}] is missing")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CertsError(f"{where}: data[{key!r}] is not base64") from None


def stored_pair(secret: JSON, where: str) -> KeyPair:
    """`tls.crt` and `tls.key` of a Secret; CertsError when it is not a TLS Secret."""
    if secret.get("type") != TLS_TYPE:
        raise CertsError(
            f"{where} has type {secret.get('type')!r}, not {TLS_TYPE!r}: it is not ours, so it "
            "is left alone; delete it or choose another --secret-name"
        )
    pair = KeyPair(_decode(secret, "tls.crt", where), _decode(secret, "tls.key", where))
    try:
        pair.certificate  # noqa: B018 (parse to validate)
    except ValueError as exc:
        raise CertsError(f"{where}: tls.crt does not parse: {exc}") from None
    return pair


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName))


def review(
    serving: JSON | None, ca_secret: JSON | None, wanted: Wanted, now: datetime, where: str
) -> Verdict:
    """Keep the Secrets, or say why to issue. CertsError when one is not ours."""
    if serving is None:
        return Verdict(False, f"{where} does not exist")
    leaf = stored_pair(serving, where).certificate
    if ca_secret is None:
        return Verdict(False, f"{where}-ca (the CA) does not exist")
    ca = stored_pair(ca_secret, f"{where}-ca").certificate
    if set(wanted.dns_names) != _names(leaf):
        return Verdict(False, "the DNS names changed")
    if leaf.not_valid_after_utc - wanted.renew_before <= now:
        return Verdict(
            False, f"it expires {leaf.not_valid_after_utc:%Y-%m-%d}, in the renewal window"
        )
    try:
        leaf.verify_directly_issued_by(ca)
    except Exception as exc:  # InvalidSignature, ValueError, TypeError: no common base
        return Verdict(False, f"the serving certificate is not signed by the stored CA ({exc!r})")
    return Verdict(True, f"valid until {leaf.not_valid_after_utc:%Y-%m-%d} for the wanted names")


def issue_pairs(
    ca_secret: JSON | None, wanted: Wanted, now: datetime, where: str
) -> tuple[KeyPair, KeyPair]:
    """(CA, serving pair): signed by the stored CA while it has more than one serving
    lifetime plus the renewal window left, else by a new CA."""
    ca: KeyPair | None = None
    if ca_secret is not None:
        ca = stored_pair(ca_secret, f"{where}-ca")
    margin = wanted.renew_before + wanted.cert_validity
    if ca is None or ca.certificate.not_valid_after_utc - margin <= now:
        ca = new_ca(
            "gpupack-webhook-ca", now=now, valid_for=wanted.ca_validity, algorithm=wanted.algorithm
        )
    leaf = issue(
        ca,
        wanted.dns_names[0],
        now=now,
        names=list(wanted.dns_names),
        valid_for=wanted.cert_validity,
        algorithm=wanted.algorithm,
    )
    return ca, leaf


def trust_bundle(ca: KeyPair, ca_secret: JSON | None, now: datetime, where: str) -> bytes:
    """The CA certificates clients should trust (`ca.crt`, and so caBundle): `ca`, and,
    while it is valid, the CA it replaces. During a CA rollover webhook pods keep serving
    the old certificate until the kubelet updates their Secret volume (up to a minute or
    two); trusting both CAs means no API server call fails meanwhile."""
    if ca_secret is None:
        return ca.cert_pem
    old = stored_pair(ca_secret, f"{where}-ca")
    if old.cert_pem == ca.cert_pem or old.certificate.not_valid_after_utc <= now:
        return ca.cert_pem
    return ca.cert_pem + old.cert_pem


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


LABELS: Final = {
    "app.kubernetes.io/managed-by": "gpupack-certs",
    "app.kubernetes.io/part-of": "gpupack",
}


def secret_manifests(
    name: str, namespace: str, ca: KeyPair, leaf: KeyPair, trusted: bytes | None = None
) -> tuple[JSON, JSON]:
    """(the CA Secret `<name>-ca`, the serving Secret `<name>`), in the order to write them.
    `trusted`: the serving Secret's `ca.crt` (default: the CA's certificate)."""

    def tls(secret_name: str, data: dict[str, bytes]) -> JSON:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": TLS_TYPE,
            "metadata": {"name": secret_name, "namespace": namespace, "labels": dict(LABELS)},
            "data": {key: _b64(value) for key, value in data.items()},
        }

    return (
        tls(f"{name}-ca", {"tls.crt": ca.cert_pem, "tls.key": ca.key_pem}),
        tls(
            name,
            {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem, CA_KEY: trusted or ca.cert_pem},
        ),
    )
