"""Hostile clients against the real `gpupack-webhook serve` process: what anything in
the cluster network can send is bounded in time and memory, and the webhook goes on
answering admissions. (Memory is the process's resident set, read from /proc.)"""

import json
import resource
import signal
import time
from pathlib import Path

import httpx
import yaml

from doubles.pods import review, vllm_pod
from gpupack.quantity import parse_quantity

from .hostile import (
    Served,
    closed_by_server,
    endless_headers,
    idle_connections,
    read_response,
    serve,
    tcp_closed_by_server,
)

VALUES = Path(__file__).parents[2] / "charts" / "gpupack" / "values.yaml"


def chart_memory_limit_mib() -> float:
    limit = yaml.safe_load(VALUES.read_text())["webhook"]["resources"]["limits"]["memory"]
    return float(parse_quantity(limit)) / 2**20


def admits(served: Served) -> bool:
    with httpx.Client(verify=served.client, timeout=10) as client:
        response = client.post(
            f"https://127.0.0.1:{served.port}/mutate", json=review(vllm_pod(), uid="ok")
        )
    return response.status_code == 200 and response.json()["response"]["uid"] == "ok"


def test_endless_headers_are_refused_early_and_cost_no_memory(tmp_path: Path) -> None:
    with serve(tmp_path) as served:
        before = served.rss_mib()

        # 4,000 headers of 64 KB: 256 MB the parser would otherwise keep.
        answer = endless_headers(served, 4_000, 64 * 1024)
        many = endless_headers(served, 500, 10)

        assert answer.startswith(("HTTP/1.1 431", "closed")), answer
        assert many.startswith("HTTP/1.1 431"), many
        assert served.rss_mib() - before < 16
        assert admits(served)


def test_a_trickled_request_is_cut_off(tmp_path: Path) -> None:
    with serve(tmp_path, "--request-timeout", "1", "--idle-timeout", "30") as served:
        with served.connect() as slow:
            slow.sendall(b"POST /mutate HTTP/1.1\r\nhost: webhook\r\n")
            for _ in range(3):  # a header byte now and then keeps no connection open
                time.sleep(0.4)
                slow.sendall(b"x")
            slow.settimeout(10)
            assert slow.recv(4096).startswith(b"HTTP/1.1 408")
            assert slow.recv(4096) == b""  # the TLS session ended
            assert tcp_closed_by_server(slow, within=5), "the TCP connection stayed open"

        with served.connect() as body:
            body.sendall(b"POST /mutate HTTP/1.1\r\nhost: w\r\ncontent-length: 100\r\n\r\n{")
            assert closed_by_server(body, within=10)
        assert admits(served)


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    with (
        serve(tmp_path, "--idle-timeout", "1", "--keep-alive-timeout", "2") as served,
        served.connect() as never,  # handshaken, never sends a byte
        served.connect() as kept,
    ):
        kept.sendall(b"GET /healthz HTTP/1.1\r\nhost: w\r\n\r\n")
        kept.settimeout(10)
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")

        assert closed_by_server(never, within=10)
        assert closed_by_server(kept, within=10)
        assert tcp_closed_by_server(never, within=5)
        assert tcp_closed_by_server(kept, within=5)


def test_floods_of_idle_tls_connections_neither_grow_it_nor_lock_the_api_server_out(
    tmp_path: Path,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
    rounds, per_round = 3, 2_000
    with serve(tmp_path) as served:
        settled: list[float] = []
        peak = 0.0
        for _ in range(rounds):
            flood = idle_connections(served, per_round)
            peak = max(peak, served.rss_mib())
            # The webhook keeps at most --max-connections open; the API server's
            # request still gets through, displacing the longest idle.
            assert admits(served)
            for conn in flood:
                conn.close()
            time.sleep(2)  # the heap is trimmed a second after the connections close
            settled.append(served.rss_mib())

        assert peak < chart_memory_limit_mib(), f"peak {peak:.0f} MiB"
        growth = settled[-1] - settled[0]
        assert growth < 8, f"resident MiB after each round: {json.dumps(settled)}"


def test_a_stopping_webhook_serves_on_and_tells_clients_to_reconnect(tmp_path: Path) -> None:
    request = b"GET /healthz HTTP/1.1\r\nhost: w\r\n\r\n"
    with serve(tmp_path, "--shutdown-delay", "3") as served, served.connect() as kept:
        kept.sendall(request)
        kept.settimeout(10)
        assert b"connection: close" not in read_response(kept).lower()

        served.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        # A connection the client already has: answered, then closed by the server.
        kept.sendall(request)
        answer = read_response(kept).lower()
        assert answer.startswith(b"http/1.1 200")
        assert b"connection: close" in answer
        assert closed_by_server(kept, within=10)
        # The API server may not have seen the endpoint go: new connections still work.
        assert admits(served)

        assert served.process.wait(timeout=30) == 0
