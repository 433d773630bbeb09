"""The one bounded HTTP server: what a hostile neighbour on the network can do to it
(idle and trickling connections, endless headers, huge bodies, malformed requests) and
that probes are still answered, with a 4xx for the bad input and never a 5xx."""

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpupack.runtime.endpoints import listening_socket
from gpupack.runtime.httpserver import ClientLimits, HttpRequest, Response, Server, text

FAST = ClientLimits(request_seconds=0.5, idle_seconds=0.5, header_bytes=2048, body_bytes=4096)


def echo(request: HttpRequest) -> Response:
    return Response(200, request.body, "application/octet-stream")


def boom(request: HttpRequest) -> Response:
    raise RuntimeError("a bug")


@contextmanager
def serving(limits: ClientLimits = FAST) -> Iterator[Server]:
    server = Server(
        listening_socket("127.0.0.1", 0),
        {
            ("GET", "/healthz"): lambda _: text(200, "ok"),
            ("POST", "/echo"): echo,
            ("GET", "/boom"): boom,
        },
        limits=limits,
        name="test",
    ).start()
    try:
        yield server
    finally:
        server.close()


def get(port: int, path: str = "/healthz") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def raw(port: int, data: bytes, timeout: float = 5) -> bytes:
    """Send `data`, then read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    with serving() as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        try:
            for body in (b"one", b"two" * 100, b""):
                connection.request("POST", "/echo", body=body)
                answer = connection.getresponse()
                assert (answer.status, answer.read()) == (200, body)
        finally:
            connection.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 5000 + b"\r\n\r\n", 431, id="headers"
        ),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 70 + b"\r\n", 431, id="header-count"
        ),
        pytest.param(
            b"POST /echo HTTP/1.1\r\nContent-Length: 999999\r\n\r\n", 413, id="declared-body"
        ),
        pytest.param(
            b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, id="chunked"
        ),
        pytest.param(b"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, id="bad-length"),
        pytest.param(
            b"POST /echo HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            400,
            id="two-lengths",
        ),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, id="tls-hello"),
        pytest.param(b"GET http://x/healthz HTTP/1.1\r\n\r\n", 400, id="absolute-target"),
        pytest.param(b"GET /healthz HTTP/2.0\r\n\r\n", 400, id="version"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nno colon\r\n\r\n", 400, id="header-line"),
        pytest.param(b"DELETE /healthz HTTP/1.1\r\n\r\n", 405, id="method"),
        pytest.param(b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", 404, id="path"),
    ],
)
def test_bad_requests_get_a_4xx_naming_what_was_wrong(request_bytes: bytes, status: int) -> None:
    with serving() as server:
        answer = raw(server.port, request_bytes)

        assert status_of(answer) == status
        assert answer.split(b"\r\n\r\n", 1)[1].strip()  # a reason a person can read
        assert get(server.port) == 200


def test_a_handler_that_raises_gets_a_500_and_the_server_goes_on() -> None:
    with serving() as server:
        assert get(server.port, "/boom") == 500
        assert get(server.port) == 200


def test_a_trickled_request_is_cut_off_at_the_request_deadline() -> None:
    with serving() as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        started = time.monotonic()
        answer = b""
        try:
            for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                sock.sendall(bytes([byte]))  # a byte well within each idle timeout
                time.sleep(0.05)
        except OSError:
            pass  # the server closed the connection
        sock.settimeout(5)
        answer = sock.recv(65536)
        assert status_of(answer) == 408
        assert time.monotonic() - started < 5 * FAST.request_seconds
        assert get(server.port) == 200


def test_idle_connections_are_closed() -> None:
    with serving() as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(5)
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the server
        assert time.monotonic() - started < 5 * FAST.idle_seconds


def test_a_flood_of_idle_connections_neither_holds_threads_nor_locks_probes_out() -> None:
    limits = ClientLimits(request_seconds=5, idle_seconds=60, connections=8)
    with serving(limits) as server:
        before = threading.active_count()  # other tests' threads may still be winding down
        # Each newcomer evicts the oldest, often a connection whose thread has not reached
        # recv yet: a descriptor closed under it and reused hung it (20 threads for 8).
        flood = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(120)]
        try:
            for _ in range(20):  # probes keep coming while the flood holds its sockets
                assert get(server.port) == 200
            assert server.open_connections <= limits.connections
            assert threading.active_count() - before <= limits.connections
        finally:
            for sock in flood:
                sock.close()


def test_when_every_connection_is_in_a_request_a_newcomer_is_told_to_come_back() -> None:
    limits = ClientLimits(request_seconds=5, idle_seconds=60, connections=2)
    with serving(limits) as server:
        busy = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        try:
            for sock in busy:
                sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # a request begun, never finished
            deadline = time.monotonic() + 5
            while server.open_connections < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)

            assert status_of(raw(server.port, b"GET /healthz HTTP/1.1\r\n\r\n")) == 503
        finally:
            for sock in busy:
                sock.close()


def test_an_answer_nobody_reads_does_not_hold_the_server() -> None:
    limits = ClientLimits(request_seconds=0.5, idle_seconds=5, body_bytes=8 * 2**20)
    with serving(limits) as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = b"x" * (8 * 2**20)
        sock.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(2)  # the echo does not fit the socket buffers; nobody reads it

        assert get(server.port) == 200
        deadline = time.monotonic() + 5
        while server.open_connections > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_connections == 0


@pytest.mark.parametrize(
    "limits",
    [
        {"request_seconds": float("inf")},
        {"idle_seconds": float("nan")},
        {"request_seconds": 0},
        {"connections": 0},
        {"body_bytes": -1},
    ],
)
def test_limits_refuse_values_that_bound_nothing(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="ClientLimits"):
        ClientLimits(**limits)  # type: ignore[arg-type]
