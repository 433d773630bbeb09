"""The plain-HTTP endpoints a gpupack binary serves beside its own work: `/metrics`,
`/healthz` (alive: 200 while the process runs and is not stopping) and `/readyz` (200
once its caches have synced, else 503 with the reason), for Prometheus and the
kubelet's probes.

Listeners work on IPv4, IPv6 and dual-stack clusters alike: the default address `::`
is one dual-stack socket (IPv4 clients arrive as mapped addresses), and falls back to
`0.0.0.0` where the kernel has no IPv6. A pod on an IPv6-only cluster has no IPv4
address at all, so a listener on `0.0.0.0` would never be reached there.

The metrics body is whatever `render()` returns (prometheus_client's exposition, in
the components): this module knows HTTP, not Prometheus.
"""

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

ANY: Final = "::"  # every address, IPv4 and IPv6
Render = Callable[[], tuple[bytes, str]]  # (body, content type)


def listen_family(address: str) -> tuple[socket.AddressFamily, str]:
    """The socket family for `address`, and the address to bind: `::` (or empty) is
    dual-stack where IPv6 exists, else `0.0.0.0`."""
    if address in ("", ANY):
        return (
            (socket.AF_INET6, ANY)
            if socket.has_ipv6 and _ipv6_works()
            else (
                socket.AF_INET,
                "0.0.0.0",  # noqa: S104 - every address, by design
            )
        )
    return (socket.AF_INET6 if ":" in address else socket.AF_INET), address.strip("[]")


def _ipv6_works() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


class DualStackServer(ThreadingHTTPServer):
    """A threading HTTP server bound as `listen_family` says (`::`: dual-stack)."""

    daemon_threads = True

    def __init__(self, address: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        family, host = listen_family(address)
        self.address_family = family
        super().__init__((host, port), handler, bind_and_activate=False)
        if family == socket.AF_INET6 and host == ANY:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            self.server_bind()
            self.server_activate()
        except OSError:
            self.server_close()
            raise


class Endpoints:
    """`/metrics`, `/healthz` and `/readyz` on `address:port`, in a daemon thread."""

    def __init__(
        self,
        address: str,
        port: int,
        *,
        render: Render,
        ready: Callable[[], str | None],
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, bytes, str]]] = {
            "/metrics": lambda: (200, *render()),
            "/healthz": lambda: (
                _json(200, {"status": "ok"}) if alive() else _json(503, {"status": "stopping"})
            ),
            "/readyz": lambda: _readiness(ready()),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                status, body, content_type = (
                    route() if route is not None else _json(404, {"error": "not found"})
                )
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # probes every few seconds: not worth a log line each

        self._server = DualStackServer(address, port, Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"endpoints :{self.port}", daemon=True
        )

    def start(self) -> "Endpoints":
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _json(status: int, doc: object) -> tuple[int, bytes, str]:
    return status, json.dumps(doc).encode(), "application/json"


def _readiness(reason: str | None) -> tuple[int, bytes, str]:
    if reason is None:
        return _json(200, {"ready": True})
    return _json(503, {"ready": False, "reason": reason})
