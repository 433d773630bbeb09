"""`gpupack-webhook serve`: the process shell around the HTTP app.

Parses the options, sets up JSON logs on stderr, loads the TLS certificate (reloaded when
its files change), connects to the cluster when there is one, starts the metrics port,
and runs uvicorn with one worker until SIGTERM, then drains and stops the watches.
Configuration errors (unreadable certificate, bad kubeconfig, busy port) are one clear
log line and exit status 2, not a traceback.
"""

import argparse
import asyncio
import gc
import logging
import math
import signal
import socket
import ssl
import time
from types import FrameType
from typing import Final

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp

from gpupack import keys, seal
from gpupack.runtime import config
from gpupack.runtime.args import non_negative_seconds, positive_int, positive_seconds
from gpupack.runtime.endpoints import ANY, Endpoints, listen_family, listening_socket
from gpupack.runtime.logs import configure_logging
from gpupack.runtime.shell import add_log_arguments, settle_heap
from webhook.app import NO_CLUSTER, ClusterPort, create_app
from webhook.audit import AuditLog
from webhook.guard import ConnectionLimits, Drain, GuardedProtocol
from webhook.metrics import WebhookMetrics, start_metrics_server
from webhook.mutate import process_key
from webhook.tls import CertificateError, CertificateReloader

EXIT_CONFIG: Final = 2
GRACEFUL_SHUTDOWN_SECONDS: Final = 20
LIMIT_CONCURRENCY: Final = 1000

DEFAULT_LIMITS: Final = ConnectionLimits()

log = logging.getLogger("webhook.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default=ANY,
        help="address to listen on for HTTPS and metrics (default: %(default)s, every IPv4 "
        "and IPv6 address; 0.0.0.0 where the node has no IPv6)",
    )
    parser.add_argument(
        "--port", type=int, default=8443, help="HTTPS port for /mutate (default: %(default)s)"
    )
    parser.add_argument(
        "--tls-cert-file",
        required=True,
        metavar="PATH",
        help="PEM serving certificate (chain); reloaded when the file changes",
    )
    parser.add_argument(
        "--tls-private-key-file",
        required=True,
        metavar="PATH",
        help="PEM private key of the serving certificate; reloaded with it",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        default=9090,
        help="plain-HTTP port for Prometheus /metrics; 0 disables it (default: %(default)s)",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        default=None,
        help=f"kubeconfig for namespace lookups and capacity pods (order: {config.ORDER}; "
        "with none of them the webhook runs without a cluster: no namespace opt-in lookups, "
        "no capacity pods)",
    )
    parser.add_argument(
        "--namespace",
        default=keys.SYSTEM_NAMESPACE,
        help="gpupack's own namespace: its GPUPolicy objects and capacity pods (the chart "
        "passes the release namespace; default: %(default)s)",
    )
    parser.add_argument(
        "--decision-key-file",
        metavar="PATH",
        default=None,
        help="secret key the webhook seals its decisions with (gpupack.io/seal); the "
        "scheduler places only pods sealed with the same key. Without it a random key is "
        "used, and the scheduler refuses every pod this process admits",
    )
    parser.add_argument(
        "--audit-file",
        metavar="PATH",
        default=None,
        help="also append the JSON audit lines to this file (they always go to stdout)",
    )
    parser.add_argument(
        "--capacity-timeout",
        type=positive_seconds,
        default=None,
        metavar="DURATION",
        help="deprecated and ignored: the capacity plan in the audit line reads only watch "
        "caches and is made at once, without a wait to bound",
    )
    parser.add_argument(
        "--mps",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="share GPUs through CUDA MPS for real-time-mps pods; off where the node agents "
        "do not serve the MPS CSI driver: such pods then keep their whole GPU "
        "(default: on)",
    )
    parser.add_argument(
        "--memory-enforcement",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold shared pods to their GPU memory share with the memory shim (and the "
        "driver's own limit where nodes have it) unless their policy or pod says otherwise; "
        "off where the node agents do not serve the CSI driver cuda.gpupack.io "
        "(default: on)",
    )
    limits = DEFAULT_LIMITS
    parser.add_argument(
        "--max-connections",
        type=positive_int,
        default=limits.connections,
        metavar="N",
        help="open connections kept; one more closes the longest idle one (default: %(default)s)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=positive_seconds,
        default=limits.idle_seconds,
        metavar="DURATION",
        help="a new connection that sends nothing this long is closed (after an answer: "
        "--keep-alive-timeout) (default: %(default)s)",
    )
    parser.add_argument(
        "--request-timeout",
        type=positive_seconds,
        default=limits.request_seconds,
        metavar="DURATION",
        help="a request must arrive whole within this long of its first byte, else 408 "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=positive_seconds,
        default=limits.keep_alive_seconds,
        metavar="DURATION",
        help="a connection idle this long after an answer is closed; keep it above the "
        "API server's own idle timeout (90 s) so the client closes first "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-delay",
        type=non_negative_seconds,
        default=0.0,
        metavar="DURATION",
        help="after SIGTERM, keep serving this long, closing each connection after its "
        "answer, so the API server moves to other replicas before this one stops; then "
        "drain and exit (the chart passes webhook.shutdownDelaySeconds; "
        "default: %(default)s)",
    )
    add_log_arguments(parser)
    parser.set_defaults(run=run)


def build_uvicorn_config(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
    limits: ConnectionLimits = DEFAULT_LIMITS,
    drain: Drain | None = None,
) -> uvicorn.Config:
    """One worker, uvloop when installed, httptools under `limits` (`webhook.guard`), no
    access log, our TLS context.

    The benchmark's baseline uses this too, so both run with the same settings.
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="auto",
        http=GuardedProtocol.with_limits(limits, drain or Drain()),
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        # After an answer a connection may idle this long (`webhook.guard`).
        timeout_keep_alive=math.ceil(limits.keep_alive_seconds),
        # What one client can hold is bounded by `limits`; this is a backstop: past
        # LIMIT_CONCURRENCY requests in progress new ones get a 503.
        limit_concurrency=LIMIT_CONCURRENCY,
        ssl_context_factory=lambda _config, _default: ssl_context,
    )


def read_key(path: str | None) -> bytes:
    """The decision key from `path`; without one, a random key (logged as a warning)."""
    if path is None:
        log.warning(
            "no --decision-key-file: decisions are sealed with a random key the scheduler "
            "does not have, so it will not place the pods this webhook admits"
        )
        return process_key()
    with open(path, "rb") as file:
        return seal.load_key(file.read(), path)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which on SIGTERM first drains for `delay` seconds: it goes on
    serving (new connections included: the API server may not have seen the endpoint
    go yet) and answers with `Connection: close`, so clients move to other replicas;
    then it stops as uvicorn does. SIGINT, or a second SIGTERM, stops at once."""

    def __init__(self, config: uvicorn.Config, drain: Drain, delay: float) -> None:
        super().__init__(config)
        self._drain = drain
        self._delay = delay
        self._stop_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._delay > 0 and self._stop_at is None:
            self._captured_signals.append(sig)  # re-raised after the shutdown, as uvicorn does
            self._drain.active = True
            self._stop_at = time.monotonic() + self._delay
            log.info("SIGTERM: draining for %gs before stopping", self._delay)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._stop_at is not None and time.monotonic() >= self._stop_at:
            self.should_exit = True
        return await super().on_tick(counter)


class Terminated(BaseException):  # like KeyboardInterrupt: not caught by `except Exception`
    """SIGTERM: raised by our handler, which uvicorn calls after its graceful shutdown."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def connect_cluster(args: argparse.Namespace) -> ClusterPort | None:
    # Lazy: importing the kubernetes client is slow, and `explain` never needs it.
    from webhook.cluster import connect  # noqa: PLC0415

    cluster: ClusterPort | None = connect(args.kubeconfig, system_namespace=args.namespace)
    return cluster


async def serve(
    server: uvicorn.Server, cluster: ClusterPort | None, sockets: list[socket.socket]
) -> None:
    """Run until uvicorn exits, serving on `sockets` (`listening_socket`: uvicorn's own
    listener on `::` would refuse IPv4). The cluster is started from inside the event
    loop, so its watches may use the loop as well as threads; it is stopped after the
    server drained."""
    if cluster is not None:
        cluster.start()
    settle_heap()
    try:
        await server.serve(sockets=sockets)
    finally:
        if cluster is not None:
            cluster.stop()


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, fmt=args.log_format)
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    try:
        tls = CertificateReloader(
            args.tls_cert_file,
            args.tls_private_key_file,
            on_reload=metrics.certificate_reload,
            on_serving=metrics.serving_certificate,
        )
        audit = AuditLog(path=args.audit_file)
        key = read_key(args.decision_key_file)
    except (CertificateError, OSError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_CONFIG
    previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    metrics_server: Endpoints | None = None
    try:
        try:
            cluster = connect_cluster(args)
        except Exception as exc:
            log.error("cannot connect to the cluster: %s: %s", type(exc).__name__, exc)
            return EXIT_CONFIG
        if cluster is None:
            log.warning(NO_CLUSTER.detail)
        if args.capacity_timeout is not None:
            log.warning("--capacity-timeout is deprecated and ignored: nothing waits on the plan")
        app = create_app(
            audit=audit,
            metrics=metrics,
            cluster=cluster,
            tls_problem=tls.problem,
            key=key,
            mps=args.mps,
            memory_enforcement=args.memory_enforcement,
        )
        limits = ConnectionLimits(
            request_seconds=args.request_timeout,
            idle_seconds=args.idle_timeout,
            keep_alive_seconds=args.keep_alive_timeout,
            connections=args.max_connections,
        )
        drain = Drain()
        config = build_uvicorn_config(
            app,
            host=listen_family(args.host)[1],
            port=args.port,
            ssl_context=tls.context,
            limits=limits,
            drain=drain,
        )
        try:
            listener = listening_socket(args.host, args.port)
        except OSError as exc:
            log.error("cannot serve HTTPS on %s port %d: %s", args.host, args.port, exc)
            return EXIT_CONFIG
        if args.metrics_port:
            try:
                metrics_server = start_metrics_server(registry, args.host, args.metrics_port)
            except OSError as exc:
                listener.close()
                log.error("cannot serve metrics on port %d: %s", args.metrics_port, exc)
                return EXIT_CONFIG
        server = DrainingServer(config, drain, args.shutdown_delay)
        # Everything long-lived exists now (the kubernetes client's modules included): keep
        # it out of the garbage collector's full scans, which otherwise cost about 10 % of
        # the throughput of POST /mutate (see benchmarks/webhook).
        gc.freeze()
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            runner.run(serve(server, cluster, [listener]))
        return 0
    except SystemExit as exc:  # uvicorn's startup failure (e.g. the port is taken), logged
        return exc.code if isinstance(exc.code, int) else 1
    except Terminated:
        log.info("stopped on SIGTERM")
        return 0
    finally:
        if metrics_server is not None:
            metrics_server.close()
        audit.close()
        signal.signal(signal.SIGTERM, previous_sigterm)
