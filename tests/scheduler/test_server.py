"""The extender's HTTP endpoints: kube-scheduler's verbs, the probes, and what any
neighbour that reaches the port can throw at them (bad JSON, huge or missing bodies,
floods of idle connections), answered with a 4xx and never a hang."""

import http.client
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpupack.runtime.httpserver import ClientLimits, Server
from scheduler import wire
from scheduler.server import LIMITS, MAX_BODY, make_server


class Verbs:
    def __init__(self) -> None:
        self.filtered: list[wire.FilterArgs] = []

    def filter(self, args: wire.FilterArgs) -> wire.FilterResult:
        self.filtered.append(args)
        if args.pod["metadata"].get("name") == "explode":
            raise RuntimeError("a bug")
        return wire.chosen(args.nodes[0])

    def bind(self, args: wire.BindArgs) -> wire.BindResult:
        return wire.BindResult(Error="")


@contextmanager
def serving(ready: bool = True, limits: ClientLimits = LIMITS) -> Iterator[tuple[Server, Verbs]]:
    verbs = Verbs()
    server = make_server("127.0.0.1", 0, verbs, lambda: ready, limits).start()
    try:
        yield server, verbs
    finally:
        server.close()


def call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


FILTER = {"Pod": {"metadata": {"name": "p", "namespace": "ml"}}, "NodeNames": ["n1", "n2"]}


def test_a_filter_answers_with_the_verbs_result() -> None:
    with serving() as (server, verbs):
        status, body = call(server.port, "POST", "/filter", json.dumps(FILTER).encode())

    assert status == 200
    assert json.loads(body)["NodeNames"] == ["n1"]
    assert verbs.filtered[0].nodes == ("n1", "n2")


def test_a_verb_that_fails_tells_kube_scheduler_why_in_its_answer() -> None:
    failing = {**FILTER, "Pod": {"metadata": {"name": "explode"}}}
    with serving() as (server, _):
        status, body = call(server.port, "POST", "/filter", json.dumps(failing).encode())

    assert status == 200
    assert "gpupack filter failed: a bug" in json.loads(body)["Error"]


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        pytest.param("/filter", b"{not json", 400, b"/filter:", id="not-json"),
        pytest.param("/filter", b"[" * 100_000, 400, b"/filter:", id="deeply-nested"),
        pytest.param("/filter", b'{"Pod": "\xff"}', 400, b"/filter:", id="not-utf-8"),
        pytest.param("/filter", json.dumps({"Pod": {}}).encode(), 400, b"Pod", id="no-pod"),
        pytest.param(
            "/bind", json.dumps({"PodName": "p"}).encode(), 400, b"PodNamespace", id="bind"
        ),
        pytest.param("/filter", b"", 411, b"Content-Length", id="empty"),
        pytest.param("/nothing", b"{}", 404, b"/filter", id="unknown-verb"),
    ],
)
def test_what_is_not_kube_schedulers_request_gets_a_4xx_naming_it(
    path: str, body: bytes, status: int, says: bytes
) -> None:
    with serving() as (server, _):
        answer = call(server.port, "POST", path, body)
        assert call(server.port, "GET", "/healthz")[0] == 200

    assert answer[0] == status
    assert says in answer[1]


def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    with serving() as (server, _), socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        sock.settimeout(10)
        answer = sock.recv(65536)

    assert answer.startswith(b"HTTP/1.1 413")


def test_probes_answer_through_a_flood_of_idle_connections() -> None:
    with serving(ready=False) as (server, _):
        flood = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(100)]
        try:
            assert call(server.port, "GET", "/healthz")[0] == 200
            assert call(server.port, "GET", "/readyz") == (503, b"caches syncing\n")
            assert server.open_connections <= LIMITS.connections
        finally:
            for sock in flood:
                sock.close()
