"""The one transport (`gpupack.runtime.transport`) against a local HTTP stub: the bearer
token, the watch framing, closing a blocked watch, Status errors kept whole."""

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpupack.objects import JSON
from gpupack.runtime.api import ApiError
from gpupack.runtime.transport import Transport, connect
from tests.apistub import TOKEN, WAIT, ApiStub, write_kubeconfig


@pytest.fixture
def client(server: str, tmp_path: Path) -> Iterator[Transport]:
    loaded = connect(str(write_kubeconfig(tmp_path / "config", server)), user_agent="t", environ={})
    yield loaded
    loaded.close()


def test_list_returns_the_raw_json_with_the_bearer_token(client: Transport, stub: ApiStub) -> None:
    listed = client.list("/api/v1/namespaces", {"labelSelector": "a=b"})

    assert listed["metadata"]["resourceVersion"] == "7"
    assert listed["items"] == stub.namespaces
    method, path, authorization = stub.requests[-1]
    assert (method, authorization) == ("GET", f"Bearer {TOKEN}")
    assert "labelSelector=a%3Db" in path


def test_watch_streams_one_event_per_line(client: Transport, stub: ApiStub) -> None:
    stub.watch_events = [
        {"type": "ADDED", "object": {"metadata": {"name": f"p{i}", "resourceVersion": str(i)}}}
        for i in range(3)
    ]
    stub.release_watches.set()

    events = list(client.watch("/api/v1/pods", {"timeoutSeconds": "5"}))

    assert [e["object"]["metadata"]["name"] for e in events] == ["p0", "p1", "p2"]
    assert "watch=true" in stub.requests[-1][1]


def test_closing_a_watch_interrupts_a_blocked_read(client: Transport, stub: ApiStub) -> None:
    stub.watch_events = [{"type": "ADDED", "object": {"metadata": {"name": "p0"}}}]
    stream = client.watch("/api/v1/pods", {"timeoutSeconds": "60"})
    seen: list[JSON] = []
    first = threading.Event()

    def consume() -> None:
        for event in stream:
            seen.append(event)
            first.set()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    assert first.wait(WAIT)

    stream.close()
    reader.join(WAIT)

    assert not reader.is_alive()
    assert len(seen) == 1


def test_create_and_already_exists(client: Transport, stub: ApiStub) -> None:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {}}

    created = client.create("/api/v1/namespaces/gpupack-system/pods", body)
    with pytest.raises(ApiError) as again:
        client.create("/api/v1/namespaces/gpupack-system/pods", body)

    assert created["metadata"]["name"] == "x"
    assert again.value.status == 409
    assert again.value.already_exists
    assert "already exists" in again.value.message


def test_status_errors_keep_reason_and_message(client: Transport) -> None:
    with pytest.raises(ApiError) as error:
        client.list("/api/v1/forbidden", {})

    assert (error.value.status, error.value.reason) == (403, "Forbidden")
    assert error.value.message == "pods is forbidden"
    assert not error.value.retryable


def test_an_unreachable_server_is_a_connection_error(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loaded = connect(
        str(write_kubeconfig(tmp_path / "c", f"http://127.0.0.1:{port}")), user_agent="t"
    )

    with pytest.raises(ApiError) as error:
        loaded.list("/api/v1/pods", {})
    loaded.close()

    assert error.value.status == 0
    assert error.value.reason == "ConnectionError"
    assert error.value.retryable


def test_answers_set_the_api_servers_clock(client: Transport, stub: ApiStub) -> None:
    stub.clock_offset = 3600.0  # the API server's clock, an hour from this machine's

    client.list("/api/v1/namespaces", {})

    assert abs(client.server_clock.now() - (time.time() + 3600)) < 2


class _SlowList(BaseHTTPRequestHandler):
    """An API server that takes 50 ms to answer a list, and notes each connection."""

    protocol_version = "HTTP/1.1"
    connections: ClassVar[set[tuple[str, int]]] = set()

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.connections.add(self.client_address)
        time.sleep(0.05)
        body = b'{"kind": "List", "metadata": {"resourceVersion": "7"}, "items": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_burst_of_writers_on_a_small_host_keeps_its_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixteen threads at once, on a host of two CPUs (where the `kubernetes` package
    keeps ten connections): each reuses one connection for its requests, rather than
    six of them being dropped after each request and dialled again (a TLS handshake
    each, against a real API server)."""
    monkeypatch.setattr("multiprocessing.cpu_count", lambda: 2)
    _SlowList.connections.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _SlowList)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    server = f"http://127.0.0.1:{httpd.server_address[1]}"
    client = connect(str(write_kubeconfig(tmp_path / "c", server)), user_agent="t", environ={})
    rounds = threading.Barrier(16)

    def writer() -> None:
        for _ in range(5):  # bursts: all sixteen at once, then all idle
            rounds.wait(WAIT)
            client.list("/api/v1/namespaces", {})

    threads = [threading.Thread(target=writer) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    client.close()
    httpd.shutdown()
    httpd.server_close()

    assert len(_SlowList.connections) <= 16, f"{len(_SlowList.connections)} connections"
