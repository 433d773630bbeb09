"""`gpupack-scheduler`: the companion scheduler binary.

Starts the informers (nodes, and every pod that has not finished), waits for them to
sync, campaigns for the Lease, and schedules while it leads. A standby keeps its caches
warm, so it schedules within one retry period of taking over. Exit codes: 0 after
SIGTERM/SIGINT, 1 when leadership was lost or the caches never synced, 2 for bad
arguments or no cluster to talk to (`gpupack.runtime.shell`).
"""

import argparse
import sys
from collections.abc import Sequence
from typing import Final

from prometheus_client import CollectorRegistry, start_http_server

from gpupack import keys
from gpupack.capacity import DEFAULT_IMAGE
from gpupack.runtime import leader, shell
from gpupack.runtime.args import non_negative_seconds
from scheduler.cache import Cache, Dirty
from scheduler.loop import Scheduler
from scheduler.metrics import Metrics
from scheduler.placement import Scorer
from scheduler.score import FragmentationScorer, PackingScorer
from scheduler.settings import Settings

LIVE_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-scheduler",
        description="Place pods admitted by the gpupack webhook on GPUs held by capacity "
        "pods, create capacity when none fits, and release empty capacity.",
    )
    add = parser.add_argument
    add("--scheduler-name", default=keys.SCHEDULER_NAME, help="schedulerName to serve")
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
    shell.add_arguments(parser, metrics_port=9090)
    return parser


def make_scorer(name: str) -> Scorer:
    return FragmentationScorer() if name == "fragmentation" else PackingScorer()


def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
    kube = process.connect(args.kubeconfig, "gpupack-scheduler")
    election = process.election(args, kube, args.namespace)
    dirty = Dirty()
    nodes = process.informer(kube, "/api/v1/nodes", name="nodes", on_change=dirty.node)
    pods = process.informer(
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
        with shell.listening("metrics", args.metrics_port):
            start_http_server(args.metrics_port, args.metrics_address, registry)
    return shell.Service(work=scheduler.run, election=election)


def main(argv: Sequence[str] | None = None) -> int:
    return shell.run(build_parser(), argv, start)


if __name__ == "__main__":
    sys.exit(main())
