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
from pathlib import Path

import pytest
import uvicorn
from starlette.types import ASGIApp

from certs import pem
from webhook.serve import build_uvicorn_config

ALGORITHM = pem.KeyAlgorithm.ECDSA_P256  # fast to generate, and what kube-apiserver accepts


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


class CertificateAuthority:
    """A throwaway CA (EC P-256, from `certs.pem`) that issues serving certificates."""

    def __init__(self, common_name: str = "gpupack test CA") -> None:
        self._ca = pem.new_ca(common_name, now=datetime.now(UTC), algorithm=ALGORITHM)
        self.pem = self._ca.cert_pem

    def issue(
        self,
        common_name: str = "gpupack-webhook.gpupack-system.svc",
        names: tuple[str, ...] = ("localhost", "gpupack-webhook.gpupack-system.svc", "127.0.0.1"),
        *,
        issued: datetime | None = None,
        valid_for: timedelta = timedelta(days=365),
    ) -> CertPair:
        """A new key pair and a serving certificate for it, signed by this CA, issued at
        `issued` (default now) and valid for `valid_for` from then."""
        leaf = pem.issue(
            self._ca,
            common_name,
            now=issued or datetime.now(UTC),
            names=list(names),
            valid_for=valid_for,
            algorithm=ALGORITHM,
        )
        return CertPair(leaf.cert_pem, leaf.key_pem)

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
