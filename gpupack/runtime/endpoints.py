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
the components): this module knows HTTP, not Prometheus. Every connection is bounded
(time, size, count) by `gpupack.runtime.httpserver`.
"""

import json
import socket
from collections.abc import Callable
from typing import Final

from gpupack.runtime.httpserver import ClientLimits, HttpRequest, Response, Server

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


PROBE_LIMITS: Final = ClientLimits(body_bytes=64 * 1024, idle_seconds=90.0)  # GETs only


class Endpoints:
    """`/metrics`, `/healthz` and `/readyz` on `address:port`, in a daemon thread, on the
    one bounded server (`gpupack.runtime.httpserver`)."""

    def __init__(
        self,
        address: str,
        port: int,
        *,
        render: Render,
        ready: Callable[[], str | None],
        alive: Callable[[], bool] = lambda: True,
        limits: ClientLimits = PROBE_LIMITS,
    ) -> None:
        def metrics(_: HttpRequest) -> Response:
            body, content_type = render()
            return Response(200, body, content_type)

        def healthz(_: HttpRequest) -> Response:
            return _json(200, {"status": "ok"}) if alive() else _json(503, {"status": "stopping"})

        self._server = Server(
            listening_socket(address, port),
            {
                ("GET", "/metrics"): metrics,
                ("GET", "/healthz"): healthz,
                ("GET", "/readyz"): lambda _: _readiness(ready()),
            },
            limits=limits,
            name="endpoints",
        )
        self.port = self._server.port

    def start(self) -> "Endpoints":
        self._server.start()
        return self

    def close(self) -> None:
        self._server.close()


def _json(status: int, doc: object) -> Response:
    return Response(status, json.dumps(doc).encode(), "application/json")


def _readiness(reason: str | None) -> Response:
    if reason is None:
        return _json(200, {"ready": True})
    return _json(503, {"ready": False, "reason": reason})
