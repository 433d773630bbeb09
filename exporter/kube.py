"""The exporter's transport to the Kubernetes API: plain dicts in and out.

The verbs a node agent needs: list and watch (the node's pods) and a JSON merge patch
(the GPU annotations on capacity pods, with a UID precondition). Configuration comes
from the `kubernetes` package (in-cluster service account with token refresh, or a
kubeconfig); requests go straight to its urllib3 pool, never through the generated
model classes. Errors and the watch protocol are `gpupack.api`'s. The scheduler has the
same kind of adapter with more verbs; components never import each other (DESIGN.md).
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
USER_AGENT: Final = "gpupack-exporter"
WATCH_READ_MARGIN: Final = 30.0
SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH: Final = "application/merge-patch+json"


class Kube(Protocol):
    """The API calls the exporter makes. Paths are absolute (`/api/v1/pods`)."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON: ...

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream: ...

    def patch(self, path: str, body: JSON) -> JSON: ...

    def close(self) -> None: ...


class _Watch:
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
            self._response.close()
            self._response.release_conn()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(ValueError, RuntimeError, OSError):
            self._response.shutdown()


class HttpKube:
    """`Kube` over the `kubernetes` package's configuration and urllib3 pool."""

    def __init__(self, configuration: Any, *, request_timeout: float = REQUEST_TIMEOUT) -> None:
        self._configuration = configuration
        self._pool: urllib3.PoolManager = k8s_rest.RESTClientObject(configuration).pool_manager
        self._timeout = request_timeout

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: JSON | None = None,
        content_type: str = "application/json",
        read_timeout: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if body is not None:
            headers["Content-Type"] = content_type
        auth = self._configuration.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers[str(auth["key"])] = str(auth["value"])
        url = self._configuration.host + path + ("?" + urlencode(params) if params else "")
        try:
            response = self._pool.request(
                method,
                url,
                headers=headers,
                body=None if body is None else json.dumps(body).encode(),
                timeout=urllib3.Timeout(
                    connect=CONNECT_TIMEOUT, read=read_timeout or self._timeout
                ),
                retries=False,
                preload_content=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc
        if 200 <= response.status <= 299:
            return response
        try:
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError):
            data = b""
        finally:
            response.release_conn()
        raise status_error(response.status, str(response.reason or ""), data)

    def _call(self, method: str, path: str, **kw: Any) -> JSON:
        response = self._send(method, path, **kw)
        try:
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc
        finally:
            response.release_conn()
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise ApiError(response.status, "BadResponse", f"{method} {path}: not JSON") from exc
        if not isinstance(doc, dict):
            raise ApiError(response.status, "BadResponse", f"{method} {path}: not an object")
        return doc

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        return self._call("GET", path, params=params)

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream:
        timeout = float(params.get("timeoutSeconds", "300")) + WATCH_READ_MARGIN
        return _Watch(
            self._send("GET", path, params={**params, "watch": "true"}, read_timeout=timeout)
        )

    def patch(self, path: str, body: JSON) -> JSON:
        return self._call("PATCH", path, body=body, content_type=MERGE_PATCH)

    def close(self) -> None:
        self._pool.clear()


def connect(
    kubeconfig: str | None,
    *,
    environ: Mapping[str, str] | None = None,
    service_account: Path = SERVICE_ACCOUNT,
) -> HttpKube:
    """A client from `kubeconfig`, $KUBECONFIG or ~/.kube/config, else the in-cluster
    service account. Raises ValueError naming what is missing when none is available."""
    env = os.environ if environ is None else environ
    configuration = k8s_client.Configuration()
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    default = Path.home() / ".kube" / "config"
    path = kubeconfig or (os.pathsep.join(listed) if listed else None)
    if path is None and not env.get("KUBERNETES_SERVICE_HOST") and default.is_file():
        path = str(default)
    if path:
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=configuration, persist_config=False
            )
        except (ConfigException, OSError) as error:  # missing, unreadable or no context
            raise ValueError(f"kubeconfig {path}: {error}") from error
    elif env.get("KUBERNETES_SERVICE_HOST"):
        InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(service_account / "token"),
            cert_filename=str(service_account / "ca.crt"),
            environ=env,
        ).load_and_set(configuration)
    else:
        raise ValueError(
            "no cluster to talk to: pass --kubeconfig, set KUBECONFIG, or run in a pod "
            "(KUBERNETES_SERVICE_HOST)"
        )
    return HttpKube(configuration)
