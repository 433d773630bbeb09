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
"""

import hashlib
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

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


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or newer) serving the given PEM certificate and key.

    Raises CertificateError naming the file when either cannot be read or they don't match.
    """
    for flag, path in (("certificate", cert_file), ("private key", key_file)):
        if not os.access(path, os.R_OK):
            reason = "does not exist" if not os.path.exists(path) else "is not readable"
            raise CertificateError(f"TLS {flag} file {path!r} {reason}")
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


def fingerprint(cert_file: str) -> str:
    """SHA-256 of the leaf certificate (the first PEM block), as `openssl x509 -fingerprint`
    prints it without colons; empty when the file has no PEM certificate."""
    with open(cert_file, encoding="ascii", errors="replace") as f:
        text = f.read()
    end_marker = "-----END CERTIFICATE-----"
    start = text.find("-----BEGIN CERTIFICATE-----")
    end = text.find(end_marker, start)
    if start < 0 or end < 0:
        return ""
    der = ssl.PEM_cert_to_DER_cert(text[start : end + len(end_marker)])
    return hashlib.sha256(der).hexdigest()


class CertificateReloader:
    """Owns the server's TLS context; give `context` to uvicorn.

    `on_reload(succeeded)` is called once per reload attempt with a new outcome (for
    metrics). `clock` is monotonic seconds. Construction loads the files and raises
    CertificateError when that fails: a server without a certificate must not start.
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        interval: float = CHECK_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        on_reload: Callable[[bool], None] | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._interval = interval
        self._clock = clock
        self._on_reload = on_reload
        self.context = server_context(cert_file, key_file)
        try:
            self._versions = self._file_versions()
        except OSError as exc:
            raise CertificateError(f"cannot read the TLS files: {exc}") from None
        self.context.sni_callback = self._on_handshake
        self._current = self.context
        self._next_check = clock() + interval
        self._last_failure: tuple[tuple[FileVersion, FileVersion] | None, str] | None = None
        self.fingerprint = fingerprint(cert_file)
        log.info(
            "serving TLS certificate", extra={"certFile": cert_file, "sha256": self.fingerprint}
        )

    @property
    def loaded(self) -> bool:
        return True  # construction fails without a certificate; a failed reload keeps the old

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
            new = server_context(self.cert_file, self.key_file)
            new_fingerprint = fingerprint(self.cert_file)
        except (CertificateError, OSError, ValueError) as exc:
            self._failed(versions, str(exc))
            return False
        self._current, self._versions, self._last_failure = new, versions, None
        self.fingerprint = new_fingerprint
        log.info(
            "reloaded TLS certificate",
            extra={"certFile": self.cert_file, "sha256": new_fingerprint},
        )
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
