"""The serving certificate follows its files: rotated in place or by a Kubernetes-style
symlink swap, a new TLS connection gets the new certificate without a restart; a
half-written pair keeps the old one. Checked against a real server (uvloop) and, for the
timing rules, with a fake clock."""

import hashlib
import io
import json
import logging
import os
import socket
import ssl
import time
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from certs import pem
from webhook import tls as tls_module
from webhook.app import create_app
from webhook.audit import AuditLog
from webhook.metrics import WebhookMetrics
from webhook.tls import MINIMUM_VERSION, CertificateError, CertificateReloader, validity

from .conftest import CertificateAuthority, CertPair, RunningServer, ServingFiles, run_server

DEADLINE_SECONDS = 30.0


def served_fingerprint(port: int, client: ssl.SSLContext) -> str:
    """SHA-256 of the certificate a fresh TLS connection to 127.0.0.1:port is served."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        client.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def wait_for_fingerprint(port: int, client: ssl.SSLContext, expected: str) -> str:
    """Poll with fresh connections until `expected` is served or the deadline passes."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    seen = served_fingerprint(port, client)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = served_fingerprint(port, client)
    return seen


def webhook_app() -> Starlette:
    return create_app(
        audit=AuditLog(stream=io.StringIO()), metrics=WebhookMetrics(CollectorRegistry())
    )


@pytest.fixture
def reloader(serving_files: ServingFiles) -> CertificateReloader:
    return CertificateReloader(str(serving_files.cert), str(serving_files.key), interval=0.1)


@pytest.fixture
def server(reloader: CertificateReloader) -> Iterator[RunningServer]:
    with run_server(webhook_app(), reloader.context) as running:
        yield running


def test_rotated_files_are_served_to_new_connections(
    server: RunningServer, ca: CertificateAuthority, serving_files: ServingFiles
) -> None:
    client = ca.client_context()
    assert served_fingerprint(server.port, client) == serving_files.pair.fingerprint

    rotated = ca.issue()  # a new key pair, signed by the same CA
    rotated.write(serving_files.cert, serving_files.key)

    assert wait_for_fingerprint(server.port, client, rotated.fingerprint) == rotated.fingerprint


def _atomic_writer_layout(directory: Path, pair: CertPair, version: int) -> None:
    """What kubelet's AtomicWriter does for a Secret volume: write the files into a new
    timestamped directory, then atomically swap the `..data` symlink to it."""
    target = directory / f"..2026_01_01_00_00_0{version}.{version:04d}"
    target.mkdir()
    pair.write(target / "tls.crt", target / "tls.key")
    staging = directory / "..data_tmp"
    staging.symlink_to(target.name)
    os.replace(staging, directory / "..data")
    for name in ("tls.crt", "tls.key"):
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def test_kubernetes_secret_symlink_swap_is_picked_up(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    first, second = ca.issue(), ca.issue()
    _atomic_writer_layout(secret, first, 1)
    tls = CertificateReloader(str(secret / "tls.crt"), str(secret / "tls.key"), interval=0.1)
    client = ca.client_context()

    with run_server(webhook_app(), tls.context) as server:
        assert served_fingerprint(server.port, client) == first.fingerprint
        _atomic_writer_layout(secret, second, 2)

        assert wait_for_fingerprint(server.port, client, second.fingerprint) == second.fingerprint


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_files_are_checked_at_most_once_per_interval(
    ca: CertificateAuthority, serving_files: ServingFiles
) -> None:
    clock = FakeClock()
    tls = CertificateReloader(str(serving_files.cert), str(serving_files.key), clock=clock)
    rotated = ca.issue()
    rotated.write(serving_files.cert, serving_files.key)

    clock.now += 0.5
    assert tls.maybe_reload() is False
    clock.now += 0.5
    assert tls.maybe_reload() is True
    assert tls.fingerprint == rotated.fingerprint


def test_half_written_pair_keeps_the_old_certificate_and_is_logged_once(
    ca: CertificateAuthority, serving_files: ServingFiles, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    tls = CertificateReloader(
        str(serving_files.cert), str(serving_files.key), on_reload=metrics.certificate_reload
    )
    rotated = ca.issue()
    serving_files.cert.write_bytes(rotated.cert_pem)  # the key is not there yet

    with caplog.at_level(logging.WARNING, logger="webhook.tls"):
        assert tls.reload() is False
        assert tls.reload() is False  # retried, not logged or counted again

    assert tls.fingerprint == serving_files.pair.fingerprint
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # (the INFO line of the first load shows when logging is at INFO)
    assert "still serving the previous certificate" in warnings[0].getMessage()
    failures = registry.get_sample_value(
        "gpupack_webhook_certificate_reloads_total", {"result": "failure"}
    )
    assert failures == 1

    serving_files.key.write_bytes(rotated.key_pem)
    assert tls.reload() is True
    assert tls.fingerprint == rotated.fingerprint
    successes = registry.get_sample_value(
        "gpupack_webhook_certificate_reloads_total", {"result": "success"}
    )
    assert successes == 1


def test_garbage_files_keep_serving_the_old_certificate(
    server: RunningServer,
    ca: CertificateAuthority,
    serving_files: ServingFiles,
    reloader: CertificateReloader,
) -> None:
    serving_files.cert.write_text("-----BEGIN CERTIFICATE-----\ntruncat")

    assert reloader.reload() is False
    assert served_fingerprint(server.port, ca.client_context()) == serving_files.pair.fingerprint


def test_missing_files_fail_with_a_message_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "tls.crt"

    with pytest.raises(CertificateError, match=r"tls\.crt.* does not exist"):
        CertificateReloader(str(missing), str(tmp_path / "tls.key"))


def test_tls_older_than_1_2_is_refused(
    server: RunningServer, ca: CertificateAuthority, reloader: CertificateReloader
) -> None:
    assert reloader.context.minimum_version == MINIMUM_VERSION == ssl.TLSVersion.TLSv1_2
    tls_1_2 = ca.client_context()
    tls_1_2.maximum_version = ssl.TLSVersion.TLSv1_2
    tls_1_1 = ca.client_context()
    tls_1_1.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer TLS 1.1 at all
    with warnings.catch_warnings():  # Python deprecates TLS 1.1: that is the point here
        warnings.simplefilter("ignore", DeprecationWarning)
        tls_1_1.minimum_version = tls_1_1.maximum_version = ssl.TLSVersion.TLSv1_1

    assert served_fingerprint(server.port, tls_1_2)
    with pytest.raises(ssl.SSLError):
        served_fingerprint(server.port, tls_1_1)


# Validity: an expired or not-yet-valid certificate is never loaded over a good one, and
# serving one makes the pod unready.


@pytest.mark.parametrize(
    "algorithm",
    [pytest.param(a, id=a.value) for a in (pem.KeyAlgorithm.ECDSA_P256, pem.KeyAlgorithm.RSA2048)],
)
@pytest.mark.parametrize(
    "issued",
    [
        pytest.param(datetime(2026, 3, 1, 12, 30, 5, tzinfo=UTC), id="utctime"),
        pytest.param(datetime(2051, 1, 2, 3, 4, 5, tzinfo=UTC), id="generalizedtime"),
    ],
)
def test_validity_is_read_from_the_certificate_as_cryptography_reads_it(
    algorithm: pem.KeyAlgorithm, issued: datetime
) -> None:
    ca = pem.new_ca("ca", now=issued, algorithm=algorithm)
    leaf = pem.issue(ca, "leaf", now=issued, names=["a.example"], algorithm=algorithm)
    der = ssl.PEM_cert_to_DER_cert(leaf.cert_pem.decode())
    reference = x509.load_der_x509_certificate(der)  # years from 2050 are GeneralizedTime

    read = validity(der)

    assert read.not_before == reference.not_valid_before_utc
    assert read.not_after == reference.not_valid_after_utc


def test_utctime_years_from_50_are_the_twentieth_century() -> None:
    """RFC 5280, 4.1.2.5.1: a UTCTime year of 50 or more is 19YY (a hand-read 2-digit
    year once made 1950 into 2050, and an expired certificate look valid)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "old")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(datetime(1950, 6, 1, tzinfo=UTC))
        .not_valid_after(datetime(1999, 12, 31, tzinfo=UTC))
        .sign(key, hashes.SHA256())
    )
    der = certificate.public_bytes(serialization.Encoding.DER)
    assert b"\x17\x0d500601" in der  # UTCTime "500601000000Z"

    read = validity(der)

    assert (read.not_before.year, read.not_after.year) == (1950, 1999)
    assert read.problem(datetime(2026, 1, 1, tzinfo=UTC)) is not None


def test_a_rotation_while_the_files_are_read_is_picked_up_at_the_next_check(
    ca: CertificateAuthority, serving_files: ServingFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files' versions are taken before they are read: had they been taken after,
    a rotation in between would leave the old certificate served with the new versions
    recorded, and never reloaded."""
    rotated = ca.issue()
    load = tls_module.server_context

    def rotating_midway(cert_file: str, key_file: str) -> ssl.SSLContext:
        context = load(cert_file, key_file)
        rotated.write(serving_files.cert, serving_files.key)  # the Secret changes now
        return context

    monkeypatch.setattr(tls_module, "server_context", rotating_midway)
    tls = CertificateReloader(str(serving_files.cert), str(serving_files.key), interval=0.1)
    monkeypatch.setattr(tls_module, "server_context", load)

    assert tls.reload()
    assert tls.fingerprint == rotated.fingerprint


@pytest.mark.parametrize(
    "der",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x30\x82\x01", id="truncated"),
        pytest.param(b"\x30\x03\x02\x01\x01", id="not-a-certificate"),
    ],
)
def test_garbage_has_no_validity(der: bytes) -> None:
    with pytest.raises(ValueError, match="not an X.509 certificate|DER"):
        validity(der)


class Wall:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.mark.parametrize(
    ("issued", "reason"),
    [
        pytest.param(datetime.now(UTC) - timedelta(days=30), "expired at", id="expired"),
        pytest.param(datetime.now(UTC) + timedelta(days=2), "not valid before", id="not-yet"),
    ],
)
def test_a_certificate_outside_its_validity_is_refused_at_reload(
    ca: CertificateAuthority,
    serving_files: ServingFiles,
    issued: datetime,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    tls = CertificateReloader(
        str(serving_files.cert),
        str(serving_files.key),
        on_reload=metrics.certificate_reload,
        on_serving=metrics.serving_certificate,
    )
    before = registry.get_sample_value("gpupack_webhook_certificate_expiry_timestamp_seconds")
    ca.issue(issued=issued, valid_for=timedelta(days=1)).write(
        serving_files.cert, serving_files.key
    )

    with caplog.at_level(logging.WARNING, logger="webhook.tls"):
        assert tls.reload() is False

    assert tls.fingerprint == serving_files.pair.fingerprint
    assert tls.problem() is None  # the old one is still good, so the pod stays ready
    assert reason in caplog.records[-1].__dict__["error"]
    assert (
        registry.get_sample_value(
            "gpupack_webhook_certificate_reloads_total", {"result": "failure"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "gpupack_webhook_certificate_reloads_total", {"result": "success"}
        )
        == 0
    )
    after = registry.get_sample_value("gpupack_webhook_certificate_expiry_timestamp_seconds")
    assert after == before


def test_the_expiry_metric_follows_the_certificate_being_served(
    ca: CertificateAuthority, serving_files: ServingFiles
) -> None:
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    tls = CertificateReloader(
        str(serving_files.cert), str(serving_files.key), on_serving=metrics.serving_certificate
    )
    first = x509.load_pem_x509_certificate(serving_files.pair.cert_pem).not_valid_after_utc
    expiry = "gpupack_webhook_certificate_expiry_timestamp_seconds"
    assert registry.get_sample_value(expiry) == first.timestamp()

    renewed = ca.issue(valid_for=timedelta(days=90))
    renewed.write(serving_files.cert, serving_files.key)
    assert tls.reload() is True

    second = x509.load_pem_x509_certificate(renewed.cert_pem).not_valid_after_utc
    assert registry.get_sample_value(expiry) == second.timestamp()


def test_a_certificate_that_expires_while_served_makes_the_pod_unready_until_renewed(
    ca: CertificateAuthority, serving_files: ServingFiles
) -> None:
    wall = Wall()
    tls = CertificateReloader(
        str(serving_files.cert), str(serving_files.key), wall=wall, interval=0.0
    )
    assert tls.problem() is None

    wall.now += timedelta(days=366)
    problem = tls.problem()
    assert problem is not None
    assert "expired at" in problem
    assert "tls.crt" in problem

    ca.issue(issued=wall.now, valid_for=timedelta(days=30)).write(
        serving_files.cert, serving_files.key
    )
    assert tls.problem() is None  # readiness itself picks the renewed files up


def test_an_expired_certificate_at_startup_is_served_but_the_webhook_is_not_ready(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    expired = ca.issue(issued=datetime.now(UTC) - timedelta(days=10), valid_for=timedelta(days=1))
    expired.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    tls = CertificateReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    registry = CollectorRegistry()
    app = create_app(
        audit=AuditLog(stream=io.StringIO()),
        metrics=WebhookMetrics(registry),
        tls_problem=tls.problem,
    )
    client = ssl.create_default_context(cadata=ca.pem.decode())
    client.verify_flags &= ~ssl.VERIFY_X509_STRICT
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE  # a probe, like the kubelet's: it does not verify

    with run_server(app, tls.context) as server:
        status, body = _get(server.port, "/readyz", client)
        health, _ = _get(server.port, "/healthz", client)

    assert status == 503
    assert "expired at" in json.loads(body)["reason"]
    assert health == 200  # alive: restarting would not bring a valid certificate
    assert registry.get_sample_value("gpupack_webhook_ready") == 0


def test_a_ready_replica_says_so_in_its_metrics(serving_files: ServingFiles) -> None:
    tls = CertificateReloader(str(serving_files.cert), str(serving_files.key))
    registry = CollectorRegistry()
    create_app(
        audit=AuditLog(stream=io.StringIO()),
        metrics=WebhookMetrics(registry),
        tls_problem=tls.problem,
    )
    assert registry.get_sample_value("gpupack_webhook_ready") == 1


def _get(port: int, path: str, client: ssl.SSLContext) -> tuple[int, bytes]:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        client.wrap_socket(raw) as conn,
    ):
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body
