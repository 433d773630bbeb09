"""The process shell of every long-running gpupack binary (scheduler, recommender,
exporter): parse, log, connect, wire, start the caches, wait for them, lead or serve,
stop cleanly. Each binary writes only its wiring (`start`); the sequence, the signals
and the exit codes live here once, so the binaries cannot drift apart.

    def main(argv=None) -> int:
        return shell.run(build_parser(), argv, start)

    def start(args, process: shell.Process) -> shell.Service:
        kube = process.connect(args.kubeconfig, "gpupack-scheduler")
        pods = process.informer(kube, "/api/v1/pods", name="pods")
        ...
        return shell.Service(work=loop.run, election=process.election(args, kube, namespace))

Exit codes, the same for every binary:
- 0 after SIGTERM or SIGINT (the work is told to stop, and a leader releases its Lease);
- 1 when leadership was lost, a cache never synced, or the work failed (the pod restarts);
- 2 for bad arguments, no usable cluster configuration, or a port that cannot be opened
  (`start` raised ValueError or OSError): one line naming what was wrong, no traceback.
"""

import argparse
import contextlib
import functools
import gc
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpupack import keys
from gpupack.runtime import config, leader
from gpupack.runtime.api import ListWatch
from gpupack.runtime.endpoints import ANY, Endpoints, Render
from gpupack.runtime.informer import Indexer, Informer
from gpupack.runtime.logs import LOG_FORMATS, configure_logging
from gpupack.runtime.transport import Transport, connect

log = logging.getLogger(__name__)

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
SYNC_TIMEOUT: Final = 120.0
STOP_TIMEOUT: Final = 30.0
LOG_LEVELS: Final = ("debug", "info", "warning", "error")

Work = Callable[[threading.Event], None]


@contextlib.contextmanager
def listening(what: str, port: int) -> Iterator[None]:
    """Open a listener inside: an OSError (a busy port, a bad address) becomes one naming
    `what` and the port, which `run` reports as a usage error (exit 2)."""
    try:
        yield
    except OSError as error:
        raise OSError(f"cannot serve {what} on port {port}: {error}") from None


def add_arguments(parser: argparse.ArgumentParser, *, metrics_port: int | None = None) -> None:
    """`--kubeconfig`, `--namespace` and `--log-level`, and with a `metrics_port`,
    `--metrics-address` and `--metrics-port`: as every binary spells them."""
    parser.add_argument(
        "--kubeconfig", metavar="PATH", help=f"kubeconfig file (order: {config.ORDER})"
    )
    parser.add_argument(
        "--namespace",
        default=keys.SYSTEM_NAMESPACE,
        help="gpupack's namespace, the chart's release namespace: capacity pods, Leases, "
        "GPUPolicy objects and exporters live there (default: %(default)s)",
    )
    if metrics_port is not None:
        parser.add_argument(
            "--metrics-address",
            default=ANY,
            help="listen address of /metrics, /healthz and /readyz (default: %(default)s, "
            "every IPv4 and IPv6 address)",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=metrics_port,
            help="port of /metrics, /healthz and /readyz, 0 to disable (default: %(default)s)",
        )
    add_log_arguments(parser)


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """`--log-level` and `--log-format`, as every binary that logs spells them."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        type=str.lower,
        default="info",
        help="level of the logs on stderr (default: %(default)s)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="json",
        help="json: one object per line, for log pipelines; text: for a terminal "
        "(default: %(default)s)",
    )


@dataclass(frozen=True, slots=True)
class Service:
    """What a binary runs once its caches are synced: `work(stop)` until `stop` is set,
    under leader election when `election` is given (`work` then runs only while this
    replica leads, and `stop` is set when it stops leading). No work: just serve until
    a signal (the exporter's threads were started by `start`)."""

    work: Work | None = None
    election: leader.Elector | None = None


class Process:
    """What `start` wires into: the connection, the caches, and what to undo at exit."""

    def __init__(self, prog: str, sync_timeout: float = SYNC_TIMEOUT) -> None:
        self.prog = prog
        self.stop = threading.Event()
        self._sync_timeout = sync_timeout
        self._informers: list[tuple[Informer, bool]] = []
        self._cleanups: list[Callable[[], object]] = []
        self.synced = threading.Event()

    def connect(self, kubeconfig: str | None, user_agent: str) -> Transport:
        """The transport (closed at exit). ConfigError (a ValueError) when there is none."""
        kube = connect(kubeconfig, user_agent=user_agent)
        self.defer(kube.close)
        return kube

    def informer(
        self,
        client: ListWatch,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        name: str,
        indexers: Mapping[str, Indexer] | None = None,
        on_change: Callable[[str], None] | None = None,
        wait: bool = True,
        optional: bool = False,
    ) -> Informer:
        """A cache started after `start` returns and stopped at exit. With `wait`, the
        service starts only once it has synced (exit 1 if it does not in time); with
        `optional`, an API the cluster does not serve is an empty cache (`Informer`)."""
        informer = Informer(
            client,
            path,
            params,
            name=name,
            indexers=indexers,
            on_change=on_change,
            optional=optional,
        )
        return self.add(informer, wait=wait)

    def add(self, informer: Informer, *, wait: bool = True) -> Informer:
        """An informer built elsewhere, started and stopped like those of `informer`."""
        self._informers.append((informer, wait))
        return informer

    def election(
        self, args: argparse.Namespace, client: leader.LeaseClient, namespace: str
    ) -> leader.Elector | None:
        """The Elector `leader.add_arguments`' options ask for, None with
        --no-leader-elect. ValueError when the timings are inconsistent."""
        timing = leader.timing_of(args)
        if not args.leader_elect:
            return None
        return leader.Elector(client, namespace, args.lease_name, args.identity, timing)

    def defer(self, cleanup: Callable[[], object]) -> None:
        """Call `cleanup` at exit (last deferred, first called)."""
        self._cleanups.append(cleanup)

    def start_informers(self) -> bool:
        """Start every cache; False when one that is waited for did not sync in time."""
        for informer, _ in self._informers:
            informer.start()
        self.defer(self._stop_informers)
        for informer, wait in self._informers:
            if wait and not informer.wait_synced(self._sync_timeout):
                log.error(
                    "the %s cache did not sync in %.0fs: %s",
                    informer.name,
                    self._sync_timeout,
                    informer.error or "no answer",
                )
                return False
        self.synced.set()
        return True

    def unready(self) -> str | None:
        """Why this process should not get traffic yet (`/readyz`), or None."""
        if self.stop.is_set():
            return "stopping"
        if not self.synced.is_set():
            return "caches not synced"
        return None

    def serve_endpoints(self, address: str, port: int, render: Render) -> Endpoints | None:
        """`/metrics` (from `render`), `/healthz` and `/readyz` on `port` (0: none), from
        `start`; closed at exit. An address or port that cannot be opened is exit 2."""
        if not port:
            return None
        with listening("/metrics, /healthz and /readyz", port):
            endpoints = Endpoints(
                address,
                port,
                render=render,
                ready=self.unready,
                alive=lambda: not self.stop.is_set(),
            )
        self.defer(endpoints.close)
        return endpoints.start()

    def _stop_informers(self) -> None:
        for informer, _ in self._informers:
            informer.stop()

    def close(self) -> None:
        while self._cleanups:
            cleanup = self._cleanups.pop()
            try:
                cleanup()
            except Exception:
                log.exception("%s: cleanup failed", self.prog)


def _idle(stop: threading.Event) -> None:
    stop.wait()


def _guarded(work: Work | None, stop: threading.Event, failed: threading.Event) -> Work:
    """`work` that, when it raises, logs why, marks the run failed and stops the process
    (a leader must not go on renewing its Lease with nothing running)."""

    def run(stopping: threading.Event) -> None:
        try:
            (work or _idle)(stopping)
        except Exception:
            log.exception("the work failed")
            failed.set()
            stop.set()

    return run


def _serve(work: Work, stop: threading.Event) -> None:
    """`work(stopping)` in a thread until `stop`, then tell it to stop and wait for it."""
    stopping = threading.Event()
    worker = threading.Thread(target=work, args=(stopping,), name="work", daemon=True)
    worker.start()
    while not stop.wait(1.0):  # a timed wait keeps signal handlers running promptly
        pass
    stopping.set()
    worker.join(timeout=STOP_TIMEOUT)


def settle_heap() -> None:
    """Take what start-up made (modules, parsers, clients, the first cache lists) out of
    the cyclic garbage collector's way (`gc.freeze`), so that its full collections scan
    only what the process made since: a full collection inside a scrape was most of the
    exporter's p99 (`benchmarks/exporter/run.py` measures it). Frozen objects are still
    freed by reference counting; only cycles among them would stay."""
    gc.collect()
    gc.freeze()


def run(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    start: Callable[[argparse.Namespace, Process], Service],
    *,
    sync_timeout: float = SYNC_TIMEOUT,
) -> int:
    """Parse, configure logging, `start`, then run the service; the exit code."""
    args = parser.parse_args(argv)
    configure_logging(args.log_level, fmt=args.log_format)
    process = Process(parser.prog, sync_timeout)
    try:
        try:
            service = start(args, process)
        except (ValueError, OSError) as error:
            parser.print_usage(sys.stderr)
            print(f"{parser.prog}: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(signum, lambda *_: process.stop.set())
            process.defer(functools.partial(signal.signal, signum, previous))
        if not process.start_informers():
            return EXIT_FAILED
        settle_heap()
        failed = threading.Event()
        work = _guarded(service.work, process.stop, failed)
        if service.election is None:
            log.info("%s started", parser.prog)
            _serve(work, process.stop)
            return EXIT_FAILED if failed.is_set() else EXIT_OK
        log.info("caches synced; campaigning", extra={"identity": service.election.identity})
        clean = service.election.run(work, process.stop)
        return EXIT_OK if clean and not failed.is_set() else EXIT_FAILED
    finally:
        process.close()
