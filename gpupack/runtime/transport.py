"""The one transport to the Kubernetes API: plain dicts in and out, one error type.

Every verb a gpupack binary uses: list and watch (for informers), get, create
(including subresources such as `pods/NAME/binding` and `pods/NAME/eviction`), patch
(JSON merge, strategic merge or JSONPatch, with a resourceVersion in the body as the
precondition), update (PUT, with its resourceVersion) and delete. Paths are absolute
(`/api/v1/namespaces/ns/pods`). Components do not depend on this class: each declares the
verbs it uses as a small Protocol (mirroring its RBAC), so tests pass an in-memory fake
and the type checker proves the real transport offers them.

Requests go straight to the urllib3 pool that the `kubernetes` package builds from a
`Configuration` (`gpupack.runtime.config`), never through its generated model classes
(slow, and lossy for objects we only pass through). Every failure is
`gpupack.runtime.api.ApiError`; retrying is the caller's choice (`api.retry`), so this
layer never retries on its own.
"""

import contextlib
import json
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import orjson
import urllib3
from kubernetes.client import rest as k8s_rest

from gpupack.objects import JSON
from gpupack.runtime import config
from gpupack.runtime.api import ApiError, WatchStream, status_error, watch_events
from gpupack.runtime.serverclock import ServerClock

CONNECT_TIMEOUT: Final = 5.0
REQUEST_TIMEOUT: Final = 10.0
WATCH_READ_MARGIN: Final = 30.0  # seconds past the server-side timeoutSeconds
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"

Body = JSON | list[JSON]  # a JSONPatch is a list of operations


class _Watch:
    """A watch over an open streaming response; `close` interrupts a blocked read."""

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


class Transport:
    """Every verb, over the `kubernetes` package's configuration and urllib3 pool."""

    def __init__(
        self,
        configuration: Any,
        *,
        user_agent: str = "gpupack",
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self._configuration = configuration  # kubernetes.client.Configuration
        self._pool: urllib3.PoolManager = k8s_rest.RESTClientObject(configuration).pool_manager
        self._user_agent = user_agent
        self._timeout = request_timeout
        # The API server's time, from its answers: for the times other replicas read.
        self.server_clock = ServerClock()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self._user_agent}
        if content_type is not None:
            headers["Content-Type"] = content_type
        auth = self._configuration.auth_settings().get("BearerToken")  # refreshes the token
        if auth and auth.get("value"):
            headers[str(auth["key"])] = str(auth["value"])
        return headers

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Body | None = None,
        content_type: str = "application/json",
        read_timeout: float | None = None,
        total_timeout: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        url = self._configuration.host + path + ("?" + urlencode(params) if params else "")
        sent = time.monotonic()
        try:
            response = self._pool.request(
                method,
                url,
                headers=self._headers(None if body is None else content_type),
                body=None if body is None else json.dumps(body).encode(),
                timeout=urllib3.Timeout(
                    total=total_timeout,
                    connect=CONNECT_TIMEOUT,
                    read=read_timeout or self._timeout,
                ),
                retries=False,  # retrying is the caller's choice (`api.retry`)
                preload_content=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc
        self.server_clock.observe(response.headers.get("Date"), sent, time.monotonic())
        if 200 <= response.status <= 299:
            return response
        try:
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError):
            data = b""
        finally:
            response.release_conn()
        raise status_error(response.status, str(response.reason or ""), data, response.headers)

    def _read(self, method: str, path: str, **kw: Any) -> tuple[int, bytes]:
        """The status and the whole body of a successful call."""
        response = self._send(method, path, **kw)
        try:
            return response.status, response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc
        finally:
            response.release_conn()

    def _call(self, method: str, path: str, **kw: Any) -> JSON:
        status, data = self._read(method, path, **kw)
        try:
            doc = orjson.loads(data)
        except ValueError as exc:
            raise ApiError(status, "BadResponse", f"{method} {path}: not JSON") from exc
        if not isinstance(doc, dict):
            raise ApiError(status, "BadResponse", f"{method} {path}: not an object")
        return doc

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        return self._call("GET", path, params=params)

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream:
        timeout = float(params.get("timeoutSeconds", "300")) + WATCH_READ_MARGIN
        return _Watch(
            self._send("GET", path, params={**params, "watch": "true"}, read_timeout=timeout)
        )

    def get(self, path: str, *, timeout: float | None = None) -> JSON:
        """GET one object; `timeout` bounds the whole call (connecting included)."""
        return self._call("GET", path, total_timeout=timeout)

    def create(self, path: str, body: JSON) -> JSON:
        return self._call("POST", path, body=body)

    def patch(self, path: str, body: Body, content_type: str = MERGE_PATCH) -> JSON:
        return self._call("PATCH", path, body=body, content_type=content_type)

    def update(self, path: str, body: JSON) -> JSON:
        return self._call("PUT", path, body=body)

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self._call("DELETE", path, body=body)

    def text(self, path: str, params: Mapping[str, str] | None = None) -> str:
        """A plain-text answer, such as a container's log (`.../pods/NAME/log`)."""
        _, data = self._read("GET", path, params=params)
        return data.decode("utf-8", errors="replace")

    def close(self) -> None:
        """Release the pooled connections; the transport is not used afterwards."""
        self._pool.clear()


def connect(
    kubeconfig: str | None,
    *,
    user_agent: str,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    service_account: Path = config.SERVICE_ACCOUNT,
    request_timeout: float = REQUEST_TIMEOUT,
) -> Transport:
    """A transport to the cluster `config.load` finds. Raises `config.ConfigError`
    naming the file or what is missing."""
    loaded = config.require(
        config.load(kubeconfig, environ=environ, home=home, service_account=service_account)
    )
    return Transport(loaded.configuration, user_agent=user_agent, request_timeout=request_timeout)
