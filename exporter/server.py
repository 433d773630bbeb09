"""The exporter's HTTP endpoints: `/metrics` (Prometheus text) and `/healthz`.

`/healthz` answers 200 while the exporter works, even when NVML or the kubelet are
down (it keeps serving what it can, and `/metrics` says what is wrong): a restart would
not bring a GPU back. It answers 503 only when the exporter itself is broken (its
sampling thread died or is stuck), which a restart does fix. The body lists each source's state.
"""

import json
import logging
from collections.abc import Callable, Mapping
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from exporter import exposition
from gpupack.runtime.endpoints import PROBE_LIMITS, listening_socket
from gpupack.runtime.httpserver import HttpRequest, Response, Server

log = logging.getLogger(__name__)

Health = Callable[[], tuple[bool, Mapping[str, object]]]
LIMITS: Final = PROBE_LIMITS  # GETs only; every node's port is reachable from the cluster


def make_server(address: str, port: int, registry: CollectorRegistry, health: Health) -> Server:
    """A server bound to (address, port); call its `start` yourself."""

    def metrics(_: HttpRequest) -> Response:
        try:
            return Response(200, exposition.text(registry), CONTENT_TYPE_LATEST)
        except Exception as error:  # a scrape must answer, never hang
            log.exception("scrape failed")
            return Response(500, f"scrape failed: {error}\n".encode())

    def healthz(_: HttpRequest) -> Response:
        ok, detail = health()
        body = json.dumps({"ok": ok, **detail}, sort_keys=True).encode() + b"\n"
        return Response(200 if ok else 503, body, "application/json")

    return Server(
        listening_socket(address, port),
        {("GET", "/metrics"): metrics, ("GET", "/healthz"): healthz},
        limits=LIMITS,
        name="exporter",
    )
