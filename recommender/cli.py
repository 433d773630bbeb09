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
import sys
from collections.abc import Sequence
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpupack import keys
from gpupack.policy import API_VERSION as POLICY_API
from gpupack.policy import PLURAL as POLICY_PLURAL
from gpupack.recommendation import list_path
from gpupack.runtime import leader, shell
from gpupack.runtime.args import conventions, positive_number, positive_seconds
from gpupack.runtime.informer import Informer
from recommender.controller import Recommender, Settings
from recommender.metrics import RecommenderMetrics
from recommender.usage import (
    ExporterScraper,
    PrometheusSource,
    UsageSource,
    exporter_targets,
)

log = logging.getLogger("recommender.cli")

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
    add(
        "--interval",
        type=positive_seconds,
        default=60.0,
        metavar="DURATION",
        help="how often usage is collected (default: %(default)s)",
    )
    add(
        "--checkpoint-interval",
        type=positive_seconds,
        default=300.0,
        metavar="DURATION",
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
        metavar="DURATION",
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
        metavar="DURATION",
        help="at most one restart per workload per this long (default: %(default)s)",
    )
    leader.add_arguments(parser, "gpupack-recommender")
    shell.add_arguments(parser, metrics_port=9092)
    return conventions(parser)


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


def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
    kube = process.connect(args.kubeconfig, "gpupack-recommender")
    election = process.election(args, kube, args.namespace)
    exporters = None
    if not args.prometheus_url and not args.exporter_url:
        exporters = process.informer(
            kube,
            f"/api/v1/namespaces/{args.namespace}/pods",
            {"labelSelector": args.exporter_selector},
            name="exporters",
        )
    source = make_source(args, exporters)
    process.defer(source.close)
    pods = process.informer(
        kube,
        "/api/v1/pods",
        {"fieldSelector": f"spec.schedulerName={keys.SCHEDULER_NAME}"},
        name="pods",
    )
    policies = process.informer(
        kube, f"/apis/{POLICY_API}/namespaces/{args.namespace}/{POLICY_PLURAL}", name="policies"
    )
    recommendations = process.informer(kube, list_path(), name="recommendations")
    settings = Settings(
        namespace=args.namespace,
        interval=args.interval,
        checkpoint_interval=args.checkpoint_interval,
        rollout_drift=args.rollout_drift,
        rollout_cooldown=args.rollout_cooldown,
        identity=args.identity,
    )
    registry = CollectorRegistry()
    holder: list[Recommender] = []

    def state() -> tuple[bool, int, int]:
        return holder[0].state() if holder else (False, 0, 0)

    metrics = RecommenderMetrics(registry, state)
    # Its histories' and rollouts' times are read by the next leader: the API server's clock.
    recommender = Recommender(
        kube,
        pods,
        policies,
        recommendations,
        source,
        settings,
        metrics,
        clock=kube.server_clock.now,
    )
    holder.append(recommender)
    process.serve_endpoints(
        args.metrics_address,
        args.metrics_port,
        lambda: (generate_latest(registry), CONTENT_TYPE_LATEST),
    )
    log.info("collecting usage from %s", source.describe())
    return shell.Service(work=recommender.run, election=election)


def main(argv: Sequence[str] | None = None) -> int:
    return shell.run(build_parser(), argv, start)


if __name__ == "__main__":
    sys.exit(main())
