"""The recommender's Prometheus metrics, on a registry the caller owns."""

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

TICK_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _StateCollector(Collector):
    def __init__(self, read: Callable[[], tuple[bool, int, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        leader, workloads, invalid = self._read()
        yield GaugeMetricFamily(
            "gpupack_recommender_leader", "1 while this replica leads", 1.0 if leader else 0.0
        )
        yield GaugeMetricFamily(
            "gpupack_recommender_workloads", "Workloads with a usage history", float(workloads)
        )
        yield GaugeMetricFamily(
            "gpupack_recommender_invalid_policies",
            "GPUPolicy objects that do not parse (their built-in or the auto-detected policy "
            "applies)",
            float(invalid),
        )


class RecommenderMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        state: Callable[[], tuple[bool, int, int]] = lambda: (False, 0, 0),
    ) -> None:
        self.samples = Counter(
            "gpupack_recommender_samples_total",
            "Per-pod usage samples added to workload histories",
            registry=registry,
        )
        self.unmatched = Counter(
            "gpupack_recommender_unmatched_samples_total",
            "Usage samples of pods gpupack does not manage (or does not know yet)",
            registry=registry,
        )
        self.collect_errors = Counter(
            "gpupack_recommender_usage_errors_total",
            "Usage targets (exporters, Prometheus queries) that failed",
            registry=registry,
        )
        self.writes = Counter(
            "gpupack_recommender_writes_total",
            "GPURecommendation writes, by result",
            ["result"],
            registry=registry,
        )
        self.changes = Counter(
            "gpupack_recommender_changes_total",
            "Recommendations whose compute, memory or policy changed",
            registry=registry,
        )
        self.rollouts = Counter(
            "gpupack_recommender_rollouts_total",
            "Workloads restarted onto their recommendation (updateMode Auto), by result",
            ["result"],
            registry=registry,
        )
        self.tick_seconds = Histogram(
            "gpupack_recommender_tick_duration_seconds",
            "One collection and update round",
            buckets=TICK_BUCKETS,
            registry=registry,
        )
        registry.register(_StateCollector(state))
