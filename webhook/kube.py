"""A thin raw client for the Kubernetes API: plain dicts in and out, one error type.

Only what the webhook needs: list, watch (a stream of events, one JSON object per line)
and create. It rides on the `kubernetes` package's configuration loading (kubeconfig,
in-cluster service account, token refresh) and its HTTP layer, but never on the
generated model classes (slow, and lossy for objects we only pass through).

Every failure becomes `ApiError(status, reason, message)`: the HTTP status and the
Status object's reason (`AlreadyExists`, `Gone`, `Forbidden`, ...), or status 0 with
reason `ConnectionError` when the server could not be reached. `retry` is the one
helper for bounded exponential backoff on API calls.
"""

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client import rest as k8s_rest
from kubernetes.config.incluster_config import InClusterConfigLoader

from gpupack.kube import JSON

log = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT: Final = 5.0
REQUEST_TIMEOUT: Final = 10.0
USER_AGENT: Final = "gpupack-webhook"
WATCH_READ_MARGIN: Final = 30.0  # seconds past the server-side timeoutSeconds
RETRYABLE_STATUSES: Final = frozenset({0, 429, 500, 502, 503, 504})
SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApiError(Exception):
    """A failed API call: HTTP status (0 when the server was not reached), reason, message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def gone(self) -> bool:
        """410: the resourceVersion (or continue token) is too old; list again."""
        return self.status == 410

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_STATUSES


class WatchStream(Protocol):
    """Watch events (`{"type": ..., "object": ...}`) until the server ends the stream.

    `close` may be called from another thread and makes a blocked iteration end promptly.
    """

    def __iter__(self) -> Iterator[JSON]: ...

    def close(self) -> None: ...


class KubeClient(Protocol):
    """The API calls the webhook makes. Paths are absolute (`/api/v1/pods`)."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON: ...

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream: ...

    def create(self, path: str, body: JSON) -> JSON: ...

    def close(self) -> None: ...  # release connections; the client is not used afterwards


@dataclass(frozen=True, slots=True)
class Backoff:
    """Bounded exponential backoff: base, 2*base, 4*base, ... capped at `cap` seconds."""

    base: float = 0.2
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        """The pause before retry number `attempt` (1 for the first retry)."""
        return float(min(self.cap, self.base * 2 ** max(0, min(attempt - 1, 30))))


def retry(
    call: Callable[[], T],
    *,
    attempts: int = 3,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
    retryable: Callable[[ApiError], bool] = lambda error: error.retryable,
) -> T:
    """Call, retrying ApiErrors that `retryable` accepts, at most `attempts` calls in all.

    Conflicts (409) and client errors are not retryable by default: they fail fast.
    """
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except ApiError as error:
            if attempt == attempts or not retryable(error):
                raise
            pause = (backoff or Backoff()).delay(attempt)
            log.info("retrying in %.2fs after %s", pause, error)
            sleep(pause)
    raise AssertionError("unreachable: attempts must be at least 1")


def _status_error(status: int, reason: str, body: bytes) -> ApiError:
    """An ApiError from a non-2xx response, preferring the Status object's reason."""
    message = body.decode("utf-8", errors="replace")[:2000]
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        reason = str(doc.get("reason") or reason)
        message = str(doc.get("message") or message)
    return ApiError(status, reason or "Unknown", message)


class _HttpWatch:
    """A watch over an open streaming HTTP response; `close` interrupts a blocked read."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[JSON]:
        buffer = b""
        try:
            for chunk in self._response.stream(amt=None, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _event(line)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if not self._closed.is_set():
                raise ApiError(0, "ConnectionError", f"watch stream broke: {exc}") from exc
        finally:
            self._response.close()  # a half-read stream must not go back to the pool
            self._response.release_conn()
        if buffer.strip() and not self._closed.is_set():
            yield _event(buffer)

    def close(self) -> None:
        self._closed.set()
        # ValueError/RuntimeError: already released or closed, so nothing is blocked on it.
        with contextlib.suppress(ValueError, RuntimeError, OSError):
            self._response.shutdown()


def _event(line: bytes) -> JSON:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise ApiError(0, "BadWatchEvent", f"not JSON: {line[:200]!r}") from exc
    if not isinstance(event, dict):
        raise ApiError(0, "BadWatchEvent", f"not an object: {line[:200]!r}")
    return event


class HttpClient:
    """`KubeClient` over urllib3, configured by the `kubernetes` package (raw JSON, no models).

    The kubeconfig or service-account loaders fill a `kubernetes.client.Configuration`
    (host, CA, client certificate, proxy, token with its refresh hook); the `kubernetes`
    REST layer turns that into a urllib3 pool manager. Requests go straight to that pool,
    so this adapter depends only on those long-stable pieces, not on the generated
    ApiClient's calling conventions (which changed with the generator upgrades).
    """

    def __init__(self, configuration: Any, *, request_timeout: float = REQUEST_TIMEOUT) -> None:
        self._configuration = configuration  # kubernetes.client.Configuration
        self._http: urllib3.PoolManager = k8s_rest.RESTClientObject(configuration).pool_manager
        self._timeout = request_timeout

    def _headers(self, with_body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if with_body:
            headers["Content-Type"] = "application/json"
        auth = self._configuration.auth_settings().get("BearerToken")  # refreshes the token
        if auth and auth.get("value"):
            headers[str(auth["key"])] = str(auth["value"])
        return headers

    def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None = None,
        body: JSON | None = None,
        read_timeout: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        url = f"{self._configuration.host}{path}"
        if params:
            url += "?" + urlencode(params)
        timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT, read=read_timeout or self._timeout)
        try:
            raw = self._http.request(
                method,
                url,
                headers=self._headers(body is not None),
                body=None if body is None else json.dumps(body).encode(),
                timeout=timeout,
                retries=False,  # retrying is the caller's choice (`retry`)
                preload_content=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc
        if not 200 <= raw.status <= 299:
            try:
                data = raw.read()
            except (urllib3.exceptions.HTTPError, OSError):
                data = b""
            finally:
                raw.release_conn()
            raise _status_error(raw.status, str(raw.reason or ""), data)
        return raw

    def _json(self, raw: urllib3.BaseHTTPResponse, what: str) -> JSON:
        try:
            data = raw.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "ConnectionError", f"{what}: {exc}") from exc
        finally:
            raw.release_conn()
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise ApiError(raw.status, "BadResponse", f"{what}: not JSON") from exc
        if not isinstance(doc, dict):
            raise ApiError(raw.status, "BadResponse", f"{what}: not a JSON object")
        return doc

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        return self._json(self._request("GET", path, params), f"GET {path}")

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream:
        server_timeout = float(params.get("timeoutSeconds", "300"))
        query = {**params, "watch": "true"}
        raw = self._request("GET", path, query, read_timeout=server_timeout + WATCH_READ_MARGIN)
        return _HttpWatch(raw)

    def create(self, path: str, body: JSON) -> JSON:
        return self._json(self._request("POST", path, body=body), f"POST {path}")

    def close(self) -> None:
        self._http.clear()


def _kubeconfig_paths(environ: Mapping[str, str], home: Path) -> str | None:
    """$KUBECONFIG when any of its files exists, else ~/.kube/config when it exists."""
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return os.pathsep.join(listed) if any(Path(p).is_file() for p in listed) else None
    default = home / ".kube" / "config"
    return str(default) if default.is_file() else None


def load_client(
    kubeconfig: str | None,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    service_account: Path = SERVICE_ACCOUNT,
    request_timeout: float = REQUEST_TIMEOUT,
) -> KubeClient | None:
    """A client for the cluster, or None when there is no way to reach one.

    Order: the explicit kubeconfig path (an error if it cannot be loaded); $KUBECONFIG or
    ~/.kube/config when present; the in-cluster service account when
    KUBERNETES_SERVICE_HOST is set (its token is re-read as it rotates); otherwise None.
    """
    env = os.environ if environ is None else environ
    configuration = k8s_client.Configuration()
    path = kubeconfig or _kubeconfig_paths(env, home or Path.home())
    if path:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration, persist_config=False
        )
        log.info("using kubeconfig %s", path)
    elif env.get("KUBERNETES_SERVICE_HOST"):
        InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(service_account / "token"),
            cert_filename=str(service_account / "ca.crt"),
            environ=env,
        ).load_and_set(configuration)
        log.info("using the in-cluster service account")
    else:
        return None
    return HttpClient(configuration, request_timeout=request_timeout)
