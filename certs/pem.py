"""Parameters in, PEM out: a self-signed CA and the certificates it issues.

Pure apart from key generation's randomness: the clock is a parameter. Used by the
webhook's tests today, by the local control plane (serving and client certificates) and
by `gpupack-certs` (the chart's install hook) as those land.
"""

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# notBefore is this far before issue, so a verifier whose clock is behind the issuer's
# (the API server, a webhook replica on another node) accepts a certificate at once: an
# hour, as client-go's self-signed certificates. With 5 minutes, a webhook replica 30
# minutes behind the issuer refused the API server's certificate and its own.
BACKDATE = timedelta(hours=1)


class KeyAlgorithm(StrEnum):
    RSA2048 = "rsa-2048"
    RSA3072 = "rsa-3072"
    RSA4096 = "rsa-4096"
    ECDSA_P256 = "ecdsa-p256"


class Usage(StrEnum):
    SERVER = "server"
    CLIENT = "client"


PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def private_key(self) -> PrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
            raise TypeError(f"unsupported private key type {type(key).__name__}")
        return key


def _new_key(algorithm: KeyAlgorithm) -> PrivateKey:
    if algorithm is KeyAlgorithm.ECDSA_P256:
        return ec.generate_private_key(ec.SECP256R1())
    return rsa.generate_private_key(public_exponent=65537, key_size=int(algorithm.split("-")[1]))


def _pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def new_ca(
    common_name: str,
    *,
    now: datetime,
    valid_for: timedelta = timedelta(days=3650),
    algorithm: KeyAlgorithm = KeyAlgorithm.RSA2048,
) -> KeyPair:
    key = _new_key(algorithm)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def _san(names: list[str]) -> list[x509.GeneralName]:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return entries


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    now: datetime,
    names: list[str] | None = None,
    usage: Usage = Usage.SERVER,
    organization: str | None = None,
    valid_for: timedelta = timedelta(days=365),
    algorithm: KeyAlgorithm = KeyAlgorithm.RSA2048,
) -> KeyPair:
    """A leaf certificate signed by `ca`. `names` become SANs (IP addresses are detected);
    `organization` is a client certificate's group for Kubernetes RBAC."""
    key = _new_key(algorithm)
    ca_cert = ca.certificate
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    eku = (
        ExtendedKeyUsageOID.SERVER_AUTH
        if usage is Usage.SERVER
        else ExtendedKeyUsageOID.CLIENT_AUTH
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + valid_for, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
    cert = builder.sign(ca.private_key(), hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def new_key_pair(algorithm: KeyAlgorithm = KeyAlgorithm.RSA2048) -> tuple[bytes, bytes]:
    """(private key PEM, public key PEM): e.g. the API server's service-account signing key."""
    key = _new_key(algorithm)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _pem(key), public
