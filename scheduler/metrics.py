"""The scheduler's Prometheus metrics, on a registry the caller owns.

Counters and the latency histogram are updated as things happen; the GPU gauges are
read from the cache on every scrape by a collector, so they are never stale.
"""

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True, slots=True)
class Usage:
    gpus_held: int  # running capacity pods with a GPU
    gpus_coming: int  # capacity pods not running yet
    gpus_in_use: int  # held GPUs with at least one pod
    compute_allocated: int  # millis booked on held GPUs
    pending_pods: int
    leader: bool
    reservations: int = 0  # GPU shares held between filter and bind
    unhealthy: int = 0  # held GPUs the exporter reports unhealthy
    overcommitted: int = 0  # pods running on a GPU whose books cannot hold their share
    escaped: int = 0  # opted-in pods holding a whole GPU that gpupack never rewrote
    mps_daemons: int = 0  # running capacity pods of MPS pools
    mps_daemons_ready: int = 0  # of which the MPS daemon answers its probe
    oldest_pending: float | None = None  # creation time (Unix seconds) of the oldest one


class _UsageCollector(Collector):
    def __init__(self, read: Callable[[], Usage], wall: Callable[[], float]) -> None:
        self._read = read
        self._wall = wall

    def collect(self) -> Iterator[GaugeMetricFamily]:
        usage = self._read()
        yield GaugeMetricFamily(
            "gpupack_scheduler_gpus_held", "GPUs held by running capacity pods", usage.gpus_held
        )
        yield GaugeMetricFamily(
            "gpupack_scheduler_gpus_coming",
            "Capacity pods that do not hold a usable GPU yet",
            usage.gpus_coming,
        )
        yield GaugeMetricFamily(
            "gpupack_scheduler_gpus_in_use",
            "Held GPUs with at least one fractional pod",
            usage.gpus_in_use,
        )
        ratio = usage.compute_allocated / (1000 * usage.gpus_held) if usage.gpus_held else 0.0
        yield GaugeMetricFamily(
            "gpupack_scheduler_allocated_compute_ratio",
            "Compute booked on held GPUs over their capacity",
            ratio,
        )
        yield GaugeMetricFamily(
            "gpupack_scheduler_pending_pods", "Pods waiting for a GPU", usage.pending_pods
        )
        oldest = usage.oldest_pending
        yield GaugeMetricFamily(
            "gpupack_scheduler_oldest_pending_pod_age_seconds",
            "How long the oldest pod waiting for a GPU has existed (0 when none waits)",
            0.0 if oldest is None else max(0.0, self._wall() - oldest),
        )
        yield GaugeMetricFamily(
            "gpupack_scheduler_leader",
            "1 where the kube-scheduler beside this extender leads",
            float(usage.leader),
        )
        yield GaugeMetricFamily(
            "gpupack_scheduler_reservations",
            "GPU shares held for pods between filter and bind",
            usage.reservations,
        )
        yield GaugeMetricFamily(
            "gpupack_scheduler_unhealthy_gpus",
            "Held GPUs the exporter reports unhealthy (they receive no new pods)",
            usage.unhealthy,
        )
        yield GaugeMetricFamily(
            "gpupack_scheduler_overcommitted_pods",
            "Pods running on a GPU whose books cannot hold their share (not booked there; "
            "the GPU takes no new pods until they fit)",
            usage.overcommitted,
        )
        yield GaugeMetricFamily(
            "gpupack_scheduler_escaped_pods",
            "Pods in an opted-in scope that ask for one GPU but were never rewritten (the "
            "webhook was not reached or failed), so each holds a whole GPU",
            usage.escaped,
        )
        daemons = GaugeMetricFamily(
            "gpupack_scheduler_mps_daemons",
            "MPS control daemons of real-time-mps GPUs (one per running capacity pod of an "
            "MPS pool) by state: ready, or not_ready (not answering: its GPU takes no new pods)",
            labels=["state"],
        )
        daemons.add_metric(["ready"], usage.mps_daemons_ready)
        daemons.add_metric(["not_ready"], usage.mps_daemons - usage.mps_daemons_ready)
        yield daemons


class Metrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        usage: Callable[[], Usage],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.filters = Counter(
            "gpupack_scheduler_filters",
            "Filter calls from kube-scheduler by result (placed: a GPU reserved; "
            "unschedulable: no GPU with room; refused: the pod is not gpupack's to place)",
            ["result"],
            registry=registry,
        )
        self.attempts = Counter(
            "gpupack_scheduler_attempts",
            "Bind calls from kube-scheduler by result (scheduled, error)",
            ["result"],
            registry=registry,
        )
        self.latency = Histogram(
            "gpupack_scheduler_scheduling_duration_seconds",
            "From the GPU reserved at filter to the Binding written",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.reservations_expired = Counter(
            "gpupack_scheduler_reservations_expired",
            "GPU shares released because no bind came within the reservation timeout",
            registry=registry,
        )
        self.capacity_created = Counter(
            "gpupack_scheduler_capacity_pods_created",
            "Capacity pods created because a pod fit nowhere",
            registry=registry,
        )
        self.capacity_deleted = Counter(
            "gpupack_scheduler_capacity_pods_deleted",
            "Capacity pods deleted, by reason (empty: after the grace period; "
            "released-for-pool: its GPU was the one another pool's waiting pod needed; "
            "consolidated: consolidation emptied it)",
            ["reason"],
            registry=registry,
        )
        self.requeued = Counter(
            "gpupack_scheduler_pods_requeued",
            "Refused pods kube-scheduler was asked to try again because a GPU with room "
            "for them appeared",
            registry=registry,
        )
        self.evicted = Counter(
            "gpupack_scheduler_orphans_evicted",
            "Pods evicted because the capacity pod holding their GPU vanished",
            registry=registry,
        )
        self.drains = Counter(
            "gpupack_scheduler_consolidation_drains",
            "GPUs consolidation began to empty (started), or gave back to placement with "
            "pods still on them (timed-out); those emptied are "
            'capacity_pods_deleted_total{reason="consolidated"}',
            ["result"],
            registry=registry,
        )
        self.consolidation_evictions = Counter(
            "gpupack_scheduler_consolidation_evictions",
            "Pods consolidation evicted to empty a GPU, by result (refused: a "
            "PodDisruptionBudget said no)",
            ["result"],
            registry=registry,
        )
        self.node_labels = Counter(
            "gpupack_scheduler_node_labels_written",
            "gpupack.io/node labels written on GPU nodes, by result (labelled, failed): the "
            "name capacity pods exclude a node by where Karpenter runs",
            ["result"],
            registry=registry,
        )
        # Every label value known in advance starts at 0, so a rate or an increase over
        # them answers 0 rather than nothing before the first event.
        for result in ("placed", "unschedulable", "refused"):
            self.filters.labels(result=result)
        for result in ("scheduled", "error"):
            self.attempts.labels(result=result)
        for reason in ("empty", "released-for-pool", "consolidated"):
            self.capacity_deleted.labels(reason=reason)
        for result in ("started", "timed-out"):
            self.drains.labels(result=result)
        for result in ("evicted", "refused", "failed"):
            self.consolidation_evictions.labels(result=result)
        for result in ("labelled", "failed"):
            self.node_labels.labels(result=result)
        registry.register(_UsageCollector(usage, wall))
