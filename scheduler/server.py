"""The extender's HTTP endpoints, for the kube-scheduler in the same pod and the kubelet.

- `POST /filter`, `POST /bind`: kube-scheduler's extender verbs (`scheduler.wire`). A
  request that is not what kube-scheduler sends gets 400 naming the field; the verbs
  themselves answer 200 with their result, as the protocol wants.
- `GET /healthz`: 200 while the process serves. `GET /readyz`: 200 once the caches have
  synced (before that, a filter would not know the GPUs).

Prometheus metrics are served on their own port (`--metrics-port`), on the pod's IP.

It listens on loopback by default: only the kube-scheduler container beside it, in the
pod's own network namespace, can reach the verbs, so no other workload can reserve a
GPU or bind a pod through it. HTTP/1.1 keep-alive, so kube-scheduler reuses connections.
Every connection is bounded in time, size and number (`gpupack.runtime.httpserver`,
`LIMITS`): a body of at most 8 MiB, at most 16 connections.
"""

import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

import orjson

from gpupack.runtime.endpoints import listening_socket
from gpupack.runtime.httpserver import ClientLimits, HttpRequest, Response, Server, text
from scheduler import wire

log = logging.getLogger(__name__)

MAX_BODY: Final = 8 * 2**20  # a pod and 100,000 node names fit well within this
# Only the kube-scheduler beside it (and the kubelet's probes) should ever connect; a few
# bodies of MAX_BODY at once is all the memory a flood can take.
LIMITS: Final = ClientLimits(body_bytes=MAX_BODY, connections=16, idle_seconds=120.0)


class Verbs(Protocol):
    """What the server calls; `scheduler.extender.Extender` is the real one."""

    def filter(self, args: wire.FilterArgs) -> wire.FilterResult: ...

    def bind(self, args: wire.BindArgs) -> wire.BindResult: ...


def make_server(
    address: str,
    port: int,
    verbs: Verbs,
    ready: Callable[[], bool],
    limits: ClientLimits = LIMITS,
) -> Server:
    """A server bound to (address, port); call its `start` yourself."""

    def verb(path: str, call: Callable[[Any], Any]) -> Callable[[HttpRequest], Response]:
        def answer(request: HttpRequest) -> Response:
            if not request.body:
                return text(411, f"{path}: a body with a Content-Length is required")
            try:
                result = call(orjson.loads(request.body))
            except ValueError as error:  # not JSON (orjson: bad UTF-8, too deep too) or wire
                return text(400, f"{path}: {str(error)[:500]}")
            except Exception as error:  # kube-scheduler retries the pod; say why
                log.exception("%s failed", path)
                result = {"Error": f"gpupack {path[1:]} failed: {error}"}
            return Response(200, orjson.dumps(result), "application/json")

        return answer

    def readyz(_: HttpRequest) -> Response:
        return text(200, "ok") if ready() else text(503, "caches syncing")

    return Server(
        listening_socket(address, port),
        {
            ("POST", "/filter"): verb("/filter", lambda b: verbs.filter(wire.filter_args(b))),
            ("POST", "/bind"): verb("/bind", lambda b: verbs.bind(wire.bind_args(b))),
            ("GET", "/healthz"): lambda _: text(200, "ok"),
            ("GET", "/readyz"): readyz,
        },
        limits=limits,
        name="extender",
    )
