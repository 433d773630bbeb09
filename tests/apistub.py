"""A tiny local HTTP server that speaks just enough of the Kubernetes API for the
transport's tests and the webhook Cluster's: lists, a chunked watch stream (events split
across chunks), create with AlreadyExists, and Status errors. Not an imitation of the API
server for integration tests (those run the real one): it checks the wire protocol."""

import json
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpupack import keys
from gpupack.objects import JSON

WAIT = 10.0  # a deadline for background threads, never a measured duration
TOKEN = "test-token"


def status(code: int, reason: str, message: str) -> JSON:
    return {
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class ApiStub:
    """State of the local API server: stored pods, requests seen, watch control."""

    def __init__(self) -> None:
        self.pods: dict[str, JSON] = {"gpupack-system": {}}
        self.namespaces = [{"metadata": {"name": "ml", "labels": {keys.OPTIMIZE: "enabled"}}}]
        self.requests: list[tuple[str, str, str | None]] = []
        self.watch_events: list[JSON] = []
        self.release_watches = threading.Event()
        self.clock_offset = 0.0  # seconds the stub's Date headers are from this machine's


def handler_for(stub: ApiStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def date_time_string(self, timestamp: float | None = None) -> str:
            return formatdate(time.time() + stub.clock_offset, usegmt=True)

        def _send(self, code: int, doc: JSON) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            stub.requests.append(("GET", self.path, self.headers.get("Authorization")))
            if url.path == "/api/v1/forbidden":
                self._send(403, status(403, "Forbidden", "pods is forbidden"))
            elif query.get("watch") == ["true"]:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in stub.watch_events:
                    line = json.dumps(event).encode() + b"\n"
                    self._chunk(line[:10])  # events may be split across chunks
                    self._chunk(line[10:])
                stub.release_watches.wait(WAIT)
                self._chunk(b"")
            elif url.path.startswith("/api/v1/namespaces/") and url.path.count("/") == 4:
                name = url.path.rsplit("/", 1)[1]
                found = [n for n in stub.namespaces if n["metadata"]["name"] == name]
                if found:
                    self._send(200, found[0])
                else:
                    self._send(404, status(404, "NotFound", f'namespaces "{name}" not found'))
            else:
                items = stub.namespaces if url.path == "/api/v1/namespaces" else []
                self._send(
                    200, {"kind": "List", "metadata": {"resourceVersion": "7"}, "items": items}
                )

        def do_POST(self) -> None:
            stub.requests.append(("POST", self.path, self.headers.get("Authorization")))
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            name = body["metadata"]["name"]
            stored = stub.pods["gpupack-system"]
            if name in stored:
                self._send(409, status(409, "AlreadyExists", f'pods "{name}" already exists'))
                return
            stored[name] = body
            self._send(201, body)

    return Handler


@pytest.fixture
def stub() -> ApiStub:
    return ApiStub()


@pytest.fixture
def server(stub: ApiStub) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(stub))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    stub.release_watches.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(WAIT)


def write_kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(json.dumps(config))
    return path
