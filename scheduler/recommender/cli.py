"""`gpupack-recommender`: rightsizing recommendations from measured GPU usage.

Starts the informers (gpupack's fractional pods, the GPUPolicy objects, the
GPURecommendation objects, and the exporter pods when it scrapes them), waits for them
to sync, campaigns for its own Lease, and while it leads collects usage every
`--interval` seconds and publishes one GPURecommendation per workload. Usage comes from
the exporters directly (found by label in the release namespace, or `--exporter-url`),
or from Prometheus with `--prometheus-url`. Exit codes: 0 after SIGTERM/SIGINT (the
histories are checkpointed first), 1 when leadership was lost or the caches never
synced, 2 for bad arguments or no cluster to talk to.
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
from gpupack.args import positive_number, positive_seconds
from gpupack.informer import Informer
from gpupack.logs import configure_logging
from gpupack.policy import API_VERSION as POLICY_API
from gpupack.policy import PLURAL as POLICY_PLURAL
from gpupack.recommendation import list_path
from scheduler import leader
from scheduler.kube import connect
from scheduler.leader import Elector
from scheduler.recommender.controller import Recommender, Settings
from scheduler.recommender.metrics import RecommenderMetrics
from scheduler.recommender.usage import (
    ExporterScraper,
    PrometheusSource,
    UsageSource,
    exporter_targets,
)

log = logging.getLogger("scheduler.recommender.cli")

EXIT_LOST: Final = 1
EXIT_CONFIG: Final = 2
SYNC_TIMEOUT: Final = 120.0
DEFAULT_EXPORTER_SELECTOR: Final = (
    "app.kubernetes.io/name=gpupack,app.kubernetes.io/component=exporter"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-recommender",
        description="Record the GPU usage of gpupack's pods per workload and publish a "
        "GPURecommendation (compute and memory, per the workload's policy) that the webhook "
        "applies to the workload's new pods.",
    )
    add = parser.add_argument
    add("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    add(
        "--namespace",
        default=keys.SYSTEM_NAMESPACE,
        help="namespace of the GPUPolicy objects, the exporters and the Lease "
        "(default: %(default)s)",
    )
    add(
        "--interval",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how often usage is collected (default: %(default)s)",
    )
    add(
        "--checkpoint-interval",
        type=positive_seconds,
        default=300.0,
        metavar="SECONDS",
        help="longest a growing history goes unsaved in its GPURecommendation; a crash loses "
        "at most this much, a clean shutdown nothing (default: %(default)s)",
    )
    usage = parser.add_argument_group("usage source (default: scrape the exporters)")
    usage.add_argument(
        "--exporter-selector",
        default=DEFAULT_EXPORTER_SELECTOR,
        help="label selector of the exporter pods in --namespace (default: %(default)s)",
    )
    usage.add_argument(
        "--exporter-port", type=int, default=9400, help="exporter port (default: %(default)s)"
    )
    usage.add_argument(
        "--exporter-url",
        action="append",
        default=[],
        metavar="URL",
        help="scrape this /metrics URL instead of discovering exporter pods (repeatable)",
    )
    usage.add_argument(
        "--prometheus-url",
        metavar="URL",
        help="query this Prometheus (e.g. http://prometheus-operated.monitoring:9090) "
        "instead of scraping the exporters",
    )
    usage.add_argument(
        "--prometheus-bearer-token-file",
        metavar="PATH",
        help="bearer token for --prometheus-url, read on every query",
    )
    usage.add_argument(
        "--scrape-timeout",
        type=positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="timeout of one exporter scrape or Prometheus query (default: %(default)s)",
    )
    rollout = parser.add_argument_group("rollouts (policies with updateMode: Auto)")
    rollout.add_argument(
        "--rollout-drift",
        type=positive_number,
        default=0.5,
        metavar="RATIO",
        help="restart a workload when its pods' allocation and the recommendation are more "
        "than 1+RATIO times apart (default: %(default)s)",
    )
    rollout.add_argument(
        "--rollout-cooldown",
        type=positive_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="at most one restart per workload per this long (default: %(default)s)",
    )
    leader.add_arguments(parser, "gpupack-recommender")
    add("--metrics-address", default="0.0.0.0", help="metrics listen address")  # noqa: S104
    add(
        "--metrics-port",
        type=int,
        default=9092,
        help="Prometheus metrics port, 0 to disable (default: %(default)s)",
    )
    add(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=os.environ.get("GPUPACK_LOG_LEVEL", "info"),
    )
    return parser


def make_source(args: argparse.Namespace, exporters: Informer | None) -> UsageSource:
    if args.prometheus_url:
        return PrometheusSource(
            args.prometheus_url,
            window_seconds=max(1, round(args.interval)),
            timeout=args.scrape_timeout,
            bearer_token_file=args.prometheus_bearer_token_file,
        )
    if args.exporter_url:
        urls = list(args.exporter_url)
        return ExporterScraper(lambda: urls, timeout=args.scrape_timeout)
    assert exporters is not None
    port = args.exporter_port
    return ExporterScraper(
        lambda: exporter_targets(exporters.items(), port), timeout=args.scrape_timeout
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        timing = leader.timing_of(args)
        kube = connect(args.kubeconfig)
        exporters = None
        if not args.prometheus_url and not args.exporter_url:
            exporters = Informer(
                kube,
                f"/api/v1/namespaces/{args.namespace}/pods",
                {"labelSelector": args.exporter_selector},
                name="exporters",
            )
        source = make_source(args, exporters)
    except ValueError as error:
        parser.print_usage(sys.stderr)
        print(f"gpupack-recommender: error: {error}", file=sys.stderr)
        return EXIT_CONFIG

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    pods = Informer(
        kube,
        "/api/v1/pods",
        {"fieldSelector": f"spec.schedulerName={keys.SCHEDULER_NAME}"},
        name="pods",
    )
    policies = Informer(
        kube, f"/apis/{POLICY_API}/namespaces/{args.namespace}/{POLICY_PLURAL}", name="policies"
    )
    recommendations = Informer(kube, list_path(), name="recommendations")
    informers = [i for i in (pods, policies, recommendations, exporters) if i is not None]
    settings = Settings(
        namespace=args.namespace,
        interval=args.interval,
        checkpoint_interval=args.checkpoint_interval,
        rollout_drift=args.rollout_drift,
        rollout_cooldown=args.rollout_cooldown,
    )
    registry = CollectorRegistry()
    holder: list[Recommender] = []

    def state() -> tuple[bool, int, int]:
        return holder[0].state() if holder else (False, 0, 0)

    metrics = RecommenderMetrics(registry, state)
    recommender = Recommender(kube, pods, policies, recommendations, source, settings, metrics)
    holder.append(recommender)
    if args.metrics_port:
        try:
            start_http_server(args.metrics_port, args.metrics_address, registry)
        except OSError as error:
            log.error("cannot serve metrics on port %d: %s", args.metrics_port, error)
            return EXIT_CONFIG
    log.info("collecting usage from %s", source.describe())
    for informer in informers:
        informer.start()
    try:
        for informer in informers:
            if not informer.wait_synced(SYNC_TIMEOUT):
                log.error(
                    "the %s cache did not sync in %.0fs: %s",
                    informer.name,
                    SYNC_TIMEOUT,
                    informer.error or "no answer",
                )
                return EXIT_LOST
        log.info("caches synced", extra={"identity": args.identity})
        if not args.leader_elect:
            lost = threading.Event()
            worker = threading.Thread(target=recommender.run, args=(lost,), daemon=True)
            worker.start()
            while not stop.wait(1.0):
                pass
            lost.set()
            worker.join(timeout=30)
            return 0
        elector = Elector(kube, args.namespace, args.lease_name, args.identity, timing)
        clean = elector.run(recommender.run, stop)
        return 0 if clean else EXIT_LOST
    finally:
        for informer in informers:
            informer.stop()
        source.close()
        kube.close()


if __name__ == "__main__":
    sys.exit(main())
