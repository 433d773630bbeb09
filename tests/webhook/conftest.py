"""Shared fixtures for the webhook's tests: a throwaway certificate authority that issues
serving certificates, and a real uvicorn server (TLS, uvloop, httptools) in a thread."""

import hashlib
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address
from pathlib import Path

import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from starlette.types import ASGIApp

from webhook.serve import build_uvicorn_config


@dataclass(frozen=True)
class CertPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the certificate's DER form, hex: compare with a peer's certificate."""
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(self.cert_pem.decode())).hexdigest()

    def write(self, cert_path: Path, key_path: Path) -> None:
        key_path.write_bytes(self.key_pem)
        cert_path.write_bytes(self.cert_pem)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class CertificateAuthority:
    """A self-signed CA (EC P-256) that issues serving certificates for 127.0.0.1."""

    def __init__(self, common_name: str = "gpupack test CA") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        self._name = _name(common_name)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str = "gpupack-webhook.gpupack-system.svc",
        dns_names: tuple[str, ...] = ("localhost", "gpupack-webhook.gpupack-system.svc"),
        ips: tuple[str, ...] = ("127.0.0.1",),
    ) -> CertPair:
        """A new key pair and a serving certificate for it, signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        names += [x509.IPAddress(IPv4Address(ip)) for ip in ips]
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return CertPair(
            cert_pem=cert.public_bytes(serialization.Encoding.PEM),
            key_pem=key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts only this CA (hostname checking on)."""
        return ssl.create_default_context(cadata=self.pem.decode())


@dataclass(frozen=True)
class ServingFiles:
    cert: Path
    key: Path
    pair: CertPair


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority()


@pytest.fixture
def serving_files(tmp_path: Path, ca: CertificateAuthority) -> ServingFiles:
    """A serving certificate and key, written to tls.crt and tls.key in a temp dir."""
    pair = ca.issue()
    files = ServingFiles(tmp_path / "tls.crt", tmp_path / "tls.key", pair)
    pair.write(files.cert, files.key)
    return files


@dataclass(frozen=True)
class RunningServer:
    server: uvicorn.Server
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@contextmanager
def run_server(app: ASGIApp, ssl_context: ssl.SSLContext) -> Iterator[RunningServer]:
    """Run `app` with the webhook's uvicorn settings on 127.0.0.1 and a free port.

    The socket is bound and listening before the thread starts, so clients can connect
    at once (the kernel queues them until the server accepts); no polling for readiness.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = build_uvicorn_config(app, host="127.0.0.1", port=port, ssl_context=ssl_context)
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True
    )
    thread.start()
    try:
        yield RunningServer(server, port)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"
