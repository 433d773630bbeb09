"""`gpupack-scheduler`: the companion scheduler binary.

Starts the informers (nodes, and every pod that has not finished), waits for them to
sync, campaigns for the Lease, and schedules while it leads. A standby keeps its caches
warm, so it schedules within one retry period of taking over. Exit codes: 0 after
SIGTERM/SIGINT, 1 when leadership was lost or the caches never synced, 2 for bad
arguments or no cluster to talk to.
"""

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Final

from prometheus_client import CollectorRegistry, start_http_server

from gpupack import keys
from gpupack.args import non_negative_seconds
from gpupack.capacity import DEFAULT_IMAGE
from gpupack.informer import Informer
from gpupack.logs import configure_logging
from scheduler import leader
from scheduler.cache import Cache, Dirty
from scheduler.kube import connect
from scheduler.leader import Elector
from scheduler.loop import Scheduler
from scheduler.metrics import Metrics
from scheduler.placement import Scorer
from scheduler.score import FragmentationScorer, PackingScorer
from scheduler.settings import Settings

log = logging.getLogger("scheduler.cli")

EXIT_LOST: Final = 1
EXIT_CONFIG: Final = 2
SYNC_TIMEOUT: Final = 120.0
LIVE_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-scheduler",
        description="Place pods admitted by the gpupack webhook on GPUs held by capacity "
        "pods, create capacity when none fits, and release empty capacity.",
    )
    add = parser.add_argument
    add("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    add("--scheduler-name", default=keys.SCHEDULER_NAME, help="schedulerName to serve")
    add(
        "--namespace",
        default=keys.SYSTEM_NAMESPACE,
        help="namespace of capacity pods and the Lease (default: %(default)s)",
    )
    add(
        "--grace-period",
        type=non_negative_seconds,
        default=300.0,
        metavar="SECONDS",
        help="how long a capacity pod may hold an empty GPU before it is deleted "
        "(default: %(default)s)",
    )
    add(
        "--orphan-grace",
        type=non_negative_seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long a pod may sit on a GPU whose capacity pod is gone before it is "
        "evicted (default: %(default)s)",
    )
    add("--capacity-image", default=DEFAULT_IMAGE, help="image of capacity pods")
    add(
        "--scorer",
        choices=("fragmentation", "packing"),
        default="fragmentation",
        help="how GPUs are ranked: best fit in compute, or fragmentation-aware with the "
        "cluster's own pod mix (default: %(default)s; see docs/scheduler.md)",
    )
    add("--workers", type=int, default=8, help="threads for API writes (default: %(default)s)")
    leader.add_arguments(parser, "gpupack-scheduler")
    add("--metrics-address", default="0.0.0.0", help="metrics listen address")  # noqa: S104
    add(
        "--metrics-port",
        type=int,
        default=9090,
        help="Prometheus metrics port, 0 to disable (default: %(default)s)",
    )
    add("--log-level", default=os.environ.get("GPUPACK_LOG_LEVEL", "info"))
    return parser


def make_scorer(name: str) -> Scorer:
    return FragmentationScorer() if name == "fragmentation" else PackingScorer()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        timing = leader.timing_of(args)
        kube = connect(args.kubeconfig)
    except ValueError as error:
        parser.print_usage(sys.stderr)
        print(f"gpupack-scheduler: error: {error}", file=sys.stderr)
        return EXIT_CONFIG

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    dirty = Dirty()
    nodes = Informer(kube, "/api/v1/nodes", name="nodes", on_change=dirty.node)
    pods = Informer(
        kube, "/api/v1/pods", {"fieldSelector": LIVE_PODS}, name="pods", on_change=dirty.pod
    )
    cache = Cache(nodes, pods, dirty, args.scheduler_name, args.namespace)
    settings = Settings(
        identity=args.identity,
        scheduler_name=args.scheduler_name,
        namespace=args.namespace,
        grace_period=args.grace_period,
        orphan_grace=args.orphan_grace,
        capacity_image=args.capacity_image,
        workers=max(1, args.workers),
    )
    registry = CollectorRegistry()
    holder: list[Scheduler] = []
    metrics = Metrics(registry, lambda: holder[0].usage)
    scheduler = Scheduler(kube, cache, make_scorer(args.scorer), settings, metrics)
    holder.append(scheduler)
    if args.metrics_port:
        start_http_server(args.metrics_port, args.metrics_address, registry)

    nodes.start()
    pods.start()
    try:
        for informer in (nodes, pods):
            if not informer.wait_synced(SYNC_TIMEOUT):
                log.error("the %s cache did not sync in %.0fs", informer.name, SYNC_TIMEOUT)
                return EXIT_LOST
        log.info("caches synced", extra={"identity": args.identity})
        if not args.leader_elect:
            scheduler.run(stop)
            return 0
        elector = Elector(kube, args.namespace, args.lease_name, args.identity, timing)
        clean = elector.run(scheduler.run, stop)
        return 0 if clean else EXIT_LOST
    finally:
        nodes.stop()
        pods.stop()
        kube.close()


if __name__ == "__main__":
    sys.exit(main())
