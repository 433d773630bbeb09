"""HTTPS for the webhook: a TLS server context whose certificate follows its files.

The API server only talks to webhooks over TLS, and the serving certificate is rotated
(cert-manager, `certs/`, or a re-install) without restarting the pods. Kubernetes updates
a mounted Secret by swapping a symlink, so a change is seen by comparing `stat()` of the
resolved paths (inode, size, mtime).

How: uvicorn gets one "front" context whose `sni_callback` runs during every handshake
(OpenSSL calls it with or without SNI). At most once per `interval` it checks the files;
when they changed it loads a fresh context and from then on hands each new connection to
it (`SSLObject.context = ...`). Open connections keep the certificate they started with.
A failed load (a half-written pair, a key that does not match yet) keeps serving the old
certificate, is logged once, and is retried at the next check.

A certificate outside its validity period is refused like a broken pair: the API server
would fail every call with `x509: certificate has expired or is not yet valid`, so
loading it would only hide the problem. `problem()` (the readiness check) says when the
certificate being served is expired or not yet valid, so an expired webhook pod leaves
the Service's endpoints instead of answering probes while every admission fails. Its
expiry is a metric, for the alert that fires weeks before.
"""

import hashlib
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from cryptography import x509

MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2
# TLS 1.2 suites: forward-secret AEAD only (TLS 1.3 suites are not affected by this).
CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"
CHECK_INTERVAL_SECONDS: Final = 1.0

log = logging.getLogger("webhook.tls")


class CertificateError(Exception):
    """The certificate or key could not be loaded; the message names the file and why."""


@dataclass(frozen=True, slots=True)
class FileVersion:
    path: str  # the resolved path: a symlink swap changes it
    inode: int
    size: int
    mtime_ns: int


def file_version(path: str) -> FileVersion:
    """What identifies one version of a file; raises OSError when it cannot be read."""
    st = os.stat(path)
    return FileVersion(os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)


def readable(cert_file: str, key_file: str) -> None:
    """CertificateError naming the file when the certificate or key cannot be read."""
    for flag, path in (("certificate", cert_file), ("private key", key_file)):
        if not os.access(path, os.R_OK):
            reason = "does not exist" if not os.path.exists(path) else "is not readable"
            raise CertificateError(f"TLS {flag} file {path!r} {reason}")


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or newer) serving the given PEM certificate and key.

    Raises CertificateError naming the file when either cannot be read or they don't match.
    """
    readable(cert_file, key_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MINIMUM_VERSION
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.set_ciphers(CIPHERS)
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise CertificateError(
            f"cannot load the TLS certificate {cert_file!r} with the private key {key_file!r}: "
            f"{exc}"
        ) from None
    return ctx


def leaf_der(cert_file: str) -> bytes:
    """The DER form of the leaf certificate (the first PEM block); empty when the file has
    no PEM certificate."""
    with open(cert_file, encoding="ascii", errors="replace") as f:
        text = f.read()
    end_marker = "-----END CERTIFICATE-----"
    start = text.find("-----BEGIN CERTIFICATE-----")
    end = text.find(end_marker, start)
    if start < 0 or end < 0:
        return b""
    return ssl.PEM_cert_to_DER_cert(text[start : end + len(end_marker)])


def fingerprint(der: bytes) -> str:
    """SHA-256 of a DER certificate, as `openssl x509 -fingerprint` prints it without colons."""
    return hashlib.sha256(der).hexdigest() if der else ""


@dataclass(frozen=True, slots=True)
class Validity:
    not_before: datetime
    not_after: datetime

    def problem(self, now: datetime) -> str | None:
        """Why a certificate with this validity must not be served at `now`, or None."""
        if now < self.not_before:
            return f"the certificate is not valid before {self.not_before:%Y-%m-%dT%H:%M:%SZ}"
        if now >= self.not_after:
            return f"the certificate expired at {self.not_after:%Y-%m-%dT%H:%M:%SZ}"
        return None


def validity(der: bytes) -> Validity:
    """notBefore and notAfter of a DER X.509 certificate (RFC 5280, 4.1), as
    `cryptography` reads them (UTCTime years 50 to 99 are 1950 to 1999). ValueError when
    it is not a certificate."""
    try:
        certificate = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise ValueError(f"not an X.509 certificate: {exc}") from None
    return Validity(certificate.not_valid_before_utc, certificate.not_valid_after_utc)


class CertificateReloader:
    """Owns the server's TLS context; give `context` to uvicorn.

    `on_reload(succeeded)` is called once per reload attempt with a new outcome, and
    `on_serving(validity)` whenever a certificate starts being served (for metrics).
    `clock` is monotonic seconds, `wall` the current UTC time. Construction loads the
    files and raises CertificateError when that fails: a server without a certificate
    must not start. A certificate outside its validity is served at startup (there is
    nothing else), but `problem()` reports it, so the pod is not ready.
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        interval: float = CHECK_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_reload: Callable[[bool], None] | None = None,
        on_serving: Callable[[Validity], None] | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._interval = interval
        self._clock = clock
        self._wall = wall
        self._on_reload = on_reload
        self._on_serving = on_serving
        readable(cert_file, key_file)
        try:  # before the files are read: a rotation meanwhile is seen at the next check
            self._versions = self._file_versions()
        except OSError as exc:
            raise CertificateError(f"cannot read the TLS files: {exc}") from None
        self.context, der, self.validity = self._load()
        self.context.sni_callback = self._on_handshake
        self._current = self.context
        self._next_check = clock() + interval
        self._last_failure: tuple[tuple[FileVersion, FileVersion] | None, str] | None = None
        self.fingerprint = fingerprint(der)
        self._serving()
        problem = self.validity.problem(wall())
        if problem is not None:
            log.error(
                "serving a TLS certificate the API server refuses; not ready until a valid "
                "one is in the files",
                extra={"certFile": cert_file, "error": problem},
            )

    def _load(self) -> tuple[ssl.SSLContext, bytes, Validity]:
        context = server_context(self.cert_file, self.key_file)
        try:
            der = leaf_der(self.cert_file)
            return context, der, validity(der)
        except (OSError, ValueError) as exc:
            raise CertificateError(
                f"cannot read the validity of the TLS certificate {self.cert_file!r}: {exc}"
            ) from None

    def _serving(self) -> None:
        log.info(
            "serving TLS certificate",
            extra={
                "certFile": self.cert_file,
                "sha256": self.fingerprint,
                "notAfter": f"{self.validity.not_after:%Y-%m-%dT%H:%M:%SZ}",
            },
        )
        if self._on_serving is not None:
            self._on_serving(self.validity)

    def problem(self, *, check_files: bool = True) -> str | None:
        """Why the served certificate is unusable (expired, not yet valid), or None. Checks
        the files first, so a renewed certificate makes the pod ready again at once
        (`check_files` False: only from the server's own thread, e.g. not a scrape)."""
        if check_files:
            try:
                self.maybe_reload()
            except Exception:
                log.exception("certificate reload check failed")
        problem = self.validity.problem(self._wall())
        return None if problem is None else f"TLS certificate {self.cert_file!r}: {problem}"

    def _file_versions(self) -> tuple[FileVersion, FileVersion]:
        return file_version(self.cert_file), file_version(self.key_file)

    def _on_handshake(
        self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext
    ) -> None:
        try:
            self.maybe_reload()
        except Exception:  # never fail a handshake over a reload; serve what we have
            log.exception("certificate reload check failed")
        current = self._current
        if current is not ctx:
            conn.context = current

    def maybe_reload(self) -> bool:
        """Check the files if `interval` has passed since the last check; see `reload`."""
        now = self._clock()
        if now < self._next_check:
            return False
        self._next_check = now + self._interval
        return self.reload()

    def reload(self) -> bool:
        """Load the files if they changed; True when a new certificate is now served."""
        try:
            versions = self._file_versions()
        except OSError as exc:
            self._failed(None, f"cannot read the TLS files: {exc}")
            return False
        if versions == self._versions:
            return False
        try:
            new, der, new_validity = self._load()
        except CertificateError as exc:
            self._failed(versions, str(exc))
            return False
        problem = new_validity.problem(self._wall())
        if problem is not None:
            self._failed(versions, f"TLS certificate {self.cert_file!r} refused: {problem}")
            return False
        self._current, self._versions, self._last_failure = new, versions, None
        self.fingerprint, self.validity = fingerprint(der), new_validity
        self._serving()
        if self._on_reload is not None:
            self._on_reload(True)
        return True

    def _failed(self, versions: tuple[FileVersion, FileVersion] | None, message: str) -> None:
        failure = (versions, message)
        if failure == self._last_failure:
            return  # already logged and counted; retried at the next check
        self._last_failure = failure
        log.warning(
            "TLS certificate reload failed; still serving the previous certificate",
            extra={"error": message},
        )
        if self._on_reload is not None:
            self._on_reload(False)
