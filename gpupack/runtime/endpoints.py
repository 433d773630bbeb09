"""The plain-HTTP endpoints a gpupack binary serves beside its own work: `/metrics`,
`/healthz` (alive: 200 while the process runs and is not stopping) and `/readyz` (200
once its caches have synced, else 503 with the reason), for Prometheus and the
kubelet's probes.

Listeners work on IPv4, IPv6 and dual-stack clusters alike: the default address `::`
is one dual-stack socket (IPv4 clients arrive as mapped addresses), and falls back to
`0.0.0.0` where the kernel has no IPv6. A pod on an IPv6-only cluster has no IPv4
address at all, so a listener on `0.0.0.0` would never be reached there.
`listening_socket` makes every such socket, the webhook's HTTPS one included: asyncio's
`create_server(host="::")` sets `IPV6_V6ONLY` and so refused every IPv4 client (the
kubelet's probes and the API server on an IPv4 cluster), which a socket made here and
handed to the server cannot do.

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


def listening_socket(address: str, port: int, backlog: int = 128) -> socket.socket:
    """A TCP socket bound to `address:port` and listening, as `listen_family` says: `::`
    accepts IPv4 and IPv6 clients whatever the host's `net.ipv6.bindv6only`. OSError
    (the port is taken, the address is not this host's) with the socket closed."""
    family, host = listen_family(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # Dual-stack only for the wildcard; a specific IPv6 address is IPv6 alone.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(host != ANY))
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


class DualStackServer(ThreadingHTTPServer):
    """A threading HTTP server on `listening_socket(address, port)` (`::`: dual-stack)."""

    daemon_threads = True

    def __init__(self, address: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        sock = listening_socket(address, port)
        self.address_family = sock.family
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()  # the one socketserver made, unbound: ours replaces it
        self.socket = sock
        self.server_address = sock.getsockname()
        self.server_name, self.server_port = (
            str(self.server_address[0]),
            int(self.server_address[1]),
        )


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
