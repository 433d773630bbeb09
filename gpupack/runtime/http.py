"""Plain HTTP(S) GETs to in-cluster endpoints that are not the API server: exporters'
`/metrics` (by pod IP) and Prometheus' query API. The recommender's scrapes.

HTTP(S) only, no proxies from the environment (the targets are pod and Service
addresses; a proxy set for the internet must not see them), no redirects, no `file:`
URLs. A fetch has one deadline for the whole body (a server that trickles fails too) and
a size cap. Every failure is one `FetchError` whose `reason` is short and readable
(`connection refused`, `HTTP 500 Internal Server Error`, `timed out after 5s`); for an
HTTP error status it also carries the beginning of the body, which Prometheus uses to
explain itself.
"""

import http.client
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Final

MAX_BODY: Final = 64 << 20  # bytes; a node's exporter serves well under 1 MiB
CHUNK: Final = 1 << 16


class FetchError(Exception):
    """A failed GET: the reason, and for an HTTP error status the status and the first
    `CHUNK` bytes of its body."""

    def __init__(self, reason: str, status: int | None = None, body: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.body = body


def opener() -> urllib.request.OpenerDirector:
    """HTTP(S) only: no proxies from the environment, no redirects, no file: URLs."""
    director = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.UnknownHandler(),  # any other scheme: URLError("unknown url type")
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        director.add_handler(handler)
    return director


def reason(error: BaseException, timeout: float) -> str:
    """A short cause: `connection refused`, `HTTP 500 Internal Server Error`."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        if not isinstance(error.reason, BaseException):
            return str(error.reason)
        error = error.reason
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError):
        return f"timed out after {timeout:g}s"
    if isinstance(error, http.client.HTTPException | ConnectionResetError):
        return f"bad HTTP response: {str(error) or type(error).__name__}"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def get(
    director: urllib.request.OpenerDirector,
    url: str,
    *,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    max_body: int = MAX_BODY,
) -> bytes:
    """The body of GET `url`, within `timeout` seconds in all. Raises FetchError."""
    request = urllib.request.Request(url, headers=dict(headers or {}))  # noqa: S310 (HTTP(S) only)
    deadline = time.monotonic() + timeout
    try:
        with director.open(request, timeout=timeout) as response:
            chunks: list[bytes] = []
            size = 0
            while chunk := response.read1(CHUNK):
                size += len(chunk)
                if size > max_body:
                    raise FetchError(f"response larger than {max_body} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError
                chunks.append(chunk)
            return b"".join(chunks)
    except urllib.error.HTTPError as error:
        with error:
            try:
                body = error.read(CHUNK)
            except (OSError, http.client.HTTPException):
                body = b""
        raise FetchError(reason(error, timeout), error.code, body) from None
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise FetchError(reason(error, timeout)) from None
