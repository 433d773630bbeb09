"""The exporter's HTTP endpoints, on every GPU node and reachable from the whole
cluster: scrapes and health answer, whatever a neighbour does to the port."""

import socket

from prometheus_client import CollectorRegistry, Gauge

from exporter import server
from tests.gpupack.runtime.test_endpoints import get as endpoints_get


def get(port: int, path: str) -> tuple[int, bytes]:
    return endpoints_get("127.0.0.1", port, path)


def test_scrapes_and_health_answer_through_a_flood_of_idle_and_oversized_requests() -> None:
    registry = CollectorRegistry()
    Gauge("gpupack_up", "up", registry=registry).set(1)
    http = server.make_server("127.0.0.1", 0, registry, lambda: (True, {"up": {}})).start()
    flood = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(150)]
    try:
        with socket.create_connection(("127.0.0.1", http.port), timeout=10) as big:
            big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n")
            assert big.recv(65536).startswith(b"HTTP/1.1 431")

        status, body = get(http.port, "/metrics")
        assert status == 200
        assert b"gpupack_up 1.0" in body
        assert get(http.port, "/healthz")[0] == 200
        assert get(http.port, "/other")[0] == 404
        assert http.open_connections <= server.LIMITS.connections
    finally:
        for sock in flood:
            sock.close()
        http.close()
