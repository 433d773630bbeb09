"""A thin raw client for the Kubernetes API: plain dicts in and out, one error type.

Only what the webhook needs: list, watch (a stream of events, one JSON object per line)
and create. It rides on the `kubernetes` package's configuration loading (kubeconfig,
in-cluster service account, token refresh) and its HTTP layer, but never on the
generated model classes (slow, and lossy for objects we only pass through).

Errors, the watch protocol and the retry helper are the shared ones in `gpupack.api`.
"""

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client import rest as k8s_rest
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader

from gpupack.api import ApiError, WatchStream, status_error, watch_events
from gpupack.kube import JSON

log = logging.getLogger(__name__)

CONNECT_TIMEOUT: Final = 5.0
REQUEST_TIMEOUT: Final = 10.0
USER_AGENT: Final = "gpupack-webhook"
WATCH_READ_MARGIN: Final = 30.0  # seconds past the server-side timeoutSeconds
SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeClient(Protocol):
    """The API calls the webhook makes. Paths are absolute (`/api/v1/pods`)."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON: ...

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream: ...

    def create(self, path: str, body: JSON) -> JSON: ...

    def close(self) -> None: ...  # release connections; the client is not used afterwards


class _HttpWatch:
    """A watch over an open streaming HTTP response; `close` interrupts a blocked read."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[JSON]:
        try:
            yield from watch_events(self._response.stream(amt=None, decode_content=True))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if not self._closed.is_set():
                raise ApiError(0, "ConnectionError", f"watch stream broke: {exc}") from exc
        finally:
            self._response.close()  # a half-read stream must not go back to the pool
            self._response.release_conn()

    def close(self) -> None:
        self._closed.set()
        # ValueError/RuntimeError: already released or closed, so nothing is blocked on it.
        with contextlib.suppress(ValueError, RuntimeError, OSError):
            self._response.shutdown()


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
            raise status_error(raw.status, str(raw.reason or ""), data)
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
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=configuration, persist_config=False
            )
        except (ConfigException, OSError) as error:  # missing, unreadable or no context
            raise ValueError(f"kubeconfig {path}: {error}") from error
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
