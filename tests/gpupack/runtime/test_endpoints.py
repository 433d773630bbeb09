"""/metrics, /healthz and /readyz, on one dual-stack listener: reachable over IPv4 and
IPv6 alike, as probes on IPv4-only, IPv6-only and dual-stack clusters need."""

import http.client
import json
import socket

import pytest

from gpupack.runtime.endpoints import ANY, Endpoints, listen_family


def get(host: str, port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(host, port, timeout=5)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


IPV6 = listen_family(ANY)[0] == socket.AF_INET6


def test_probes_and_metrics_answer_as_the_process_becomes_ready() -> None:
    state = {"reason": "caches not synced"}
    endpoints = Endpoints(
        ANY, 0, render=lambda: (b"up 1\n", "text/plain"), ready=lambda: state["reason"]
    ).start()
    try:
        assert get("127.0.0.1", endpoints.port, "/healthz")[0] == 200
        status, body = get("127.0.0.1", endpoints.port, "/readyz")
        assert status == 503
        assert json.loads(body) == {"ready": False, "reason": "caches not synced"}
        state["reason"] = None  # type: ignore[assignment]
        assert get("127.0.0.1", endpoints.port, "/readyz")[0] == 200
        assert get("127.0.0.1", endpoints.port, "/metrics") == (200, b"up 1\n")
        assert get("127.0.0.1", endpoints.port, "/nothing")[0] == 404
    finally:
        endpoints.close()


@pytest.mark.skipif(not IPV6, reason="this machine's kernel has no IPv6")
def test_the_default_address_serves_ipv6_and_ipv4_on_one_port() -> None:
    endpoints = Endpoints(ANY, 0, render=lambda: (b"", "text/plain"), ready=lambda: None).start()
    try:
        assert get("::1", endpoints.port, "/healthz")[0] == 200
        assert get("127.0.0.1", endpoints.port, "/healthz")[0] == 200
    finally:
        endpoints.close()


def test_a_stopping_process_is_not_alive() -> None:
    endpoints = Endpoints(
        "127.0.0.1", 0, render=lambda: (b"", "text/plain"), ready=lambda: None, alive=lambda: False
    ).start()
    try:
        assert get("127.0.0.1", endpoints.port, "/healthz")[0] == 503
    finally:
        endpoints.close()


@pytest.mark.parametrize(
    ("address", "family", "host"),
    [
        pytest.param("0.0.0.0", socket.AF_INET, "0.0.0.0", id="ipv4-any"),
        pytest.param("10.0.0.5", socket.AF_INET, "10.0.0.5", id="ipv4"),
        pytest.param("[fd00::5]", socket.AF_INET6, "fd00::5", id="ipv6-bracketed"),
        pytest.param("fd00::5", socket.AF_INET6, "fd00::5", id="ipv6"),
    ],
)
def test_an_explicit_address_picks_its_family(
    address: str, family: socket.AddressFamily, host: str
) -> None:
    assert listen_family(address) == (family, host)


def test_probes_and_scrapes_answer_through_a_flood_of_idle_connections() -> None:
    endpoints = Endpoints(
        "127.0.0.1", 0, render=lambda: (b"up 1\n", "text/plain"), ready=lambda: None
    ).start()
    flood = [socket.create_connection(("127.0.0.1", endpoints.port)) for _ in range(150)]
    try:
        assert get("127.0.0.1", endpoints.port, "/healthz")[0] == 200
        assert get("127.0.0.1", endpoints.port, "/metrics") == (200, b"up 1\n")
    finally:
        for sock in flood:
            sock.close()
        endpoints.close()


def test_endless_headers_are_refused() -> None:
    endpoints = Endpoints(
        "127.0.0.1", 0, render=lambda: (b"", "text/plain"), ready=lambda: None
    ).start()
    try:
        with socket.create_connection(("127.0.0.1", endpoints.port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Long: " + b"a" * 100_000)
            assert sock.recv(65536).startswith(b"HTTP/1.1 431")
        assert get("127.0.0.1", endpoints.port, "/healthz")[0] == 200
    finally:
        endpoints.close()
