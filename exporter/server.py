"""The exporter's HTTP endpoints: `/metrics` (Prometheus text) and `/healthz`.

`/healthz` answers 200 while the exporter works, even when NVML or the kubelet are
down (it keeps serving what it can, and `/metrics` says what is wrong): a restart would
not bring a GPU back. It answers 503 only when the exporter itself is broken (its
sampling thread died or is stuck), which a restart does fix. The body lists each source's state.
"""

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from exporter import exposition
from gpupack.runtime.endpoints import DualStackServer

log = logging.getLogger(__name__)

Health = Callable[[], tuple[bool, Mapping[str, object]]]
NOT_FOUND: Final = b"not found: try /metrics or /healthz\n"


def make_server(
    address: str, port: int, registry: CollectorRegistry, health: Health
) -> ThreadingHTTPServer:
    """A server bound to (address, port); call `serve_forever` (or `start`) yourself."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "gpupack-exporter"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    body, status, kind = exposition.text(registry), 200, CONTENT_TYPE_LATEST
                except Exception as error:  # a scrape must answer, never hang
                    log.exception("scrape failed")
                    body, status, kind = f"scrape failed: {error}\n".encode(), 500, "text/plain"
            elif path == "/healthz":
                ok, detail = health()
                body = json.dumps({"ok": ok, **detail}, sort_keys=True).encode() + b"\n"
                status, kind = (200 if ok else 503), "application/json"
            else:
                body, status, kind = NOT_FOUND, 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds are not news

    return DualStackServer(address, port, Handler)


def start(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    return thread
