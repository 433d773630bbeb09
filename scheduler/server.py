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
"""

import json
import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Protocol

from scheduler import wire

log = logging.getLogger(__name__)

MAX_BODY: Final = 32 * 2**20  # a pod and 100,000 node names fit well within this


class Verbs(Protocol):
    """What the server calls; `scheduler.extender.Extender` is the real one."""

    def filter(self, args: wire.FilterArgs) -> wire.FilterResult: ...

    def bind(self, args: wire.BindArgs) -> wire.BindResult: ...


def make_server(
    address: str,
    port: int,
    verbs: Verbs,
    ready: Callable[[], bool],
) -> ThreadingHTTPServer:
    """A server bound to (address, port); call `serve_forever` yourself."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "gpupack-scheduler"
        protocol_version = "HTTP/1.1"
        # Headers and body go out as two writes; with Nagle's algorithm the body would
        # wait for the client's delayed ACK (tens of ms) on every keep-alive call.
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in ("/filter", "/bind"):
                self._send(404, b"not found: the verbs are /filter and /bind\n", "text/plain")
                return
            try:
                length = int(self.headers.get("Content-Length") or "")
            except ValueError:
                self._send(411, b"a Content-Length is required\n", "text/plain")
                return
            if not 0 < length <= MAX_BODY:
                self._send(413, f"the body must be 1 to {MAX_BODY} bytes\n".encode(), "text/plain")
                return
            try:
                body = json.loads(self.rfile.read(length))
                result: Any = (
                    verbs.filter(wire.filter_args(body))
                    if path == "/filter"
                    else verbs.bind(wire.bind_args(body))
                )
            except (ValueError, UnicodeDecodeError) as error:  # JSON or wire errors
                self._send(400, f"{path}: {error}\n".encode(), "text/plain")
                return
            except Exception as error:  # kube-scheduler retries the pod; say why
                log.exception("%s failed", path)
                result = {"Error": f"gpupack {path[1:]} failed: {error}"}
            self._send(200, json.dumps(result).encode(), "application/json")

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif path == "/readyz":
                ok = ready()
                self._send(200 if ok else 503, b"ok\n" if ok else b"caches syncing\n", "text/plain")
            else:
                self._send(404, b"not found: try /healthz or /readyz\n", "text/plain")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per pod would drown the log; the verbs log what matters

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    return server
