"""The webhook's Prometheus metrics, and the plain-HTTP endpoint that serves them.

`WebhookMetrics` owns every metric family, registered on a registry the caller passes in
(never the global one), so a test or a benchmark gets a fresh set.

The families `POST /mutate` records on every request (admissions, their duration,
capacity plans, plan-cache lookups, recommendations applied, errors) are plain counts
the event loop adds to, and `_HotPath` builds fresh families from them at every scrape:
a `prometheus_client` counter or histogram takes a lock and walks its buckets in Python
for each observation, several per request on the path whose throughput is the point.
Only the event loop's thread records them; a scrape (on the metrics server's thread)
copies each table in one step under the GIL, and a histogram's count is the sum of its
buckets, so its samples always agree with each other. The rare ones (certificate
reloads, expiry, readiness) stay `prometheus_client` metrics.
"""

from bisect import bisect_left
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupack.runtime.endpoints import Endpoints
from webhook.decision import Outcome, Reason
from webhook.tls import Validity

# From well under a millisecond (the pure decision) up to the capacity timeout.
DURATION_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class ErrorKind(StrEnum):
    """A closed set of error kinds: the `kind` label of `gpupack_webhook_errors_total`."""

    BAD_REQUEST = "bad_request"  # not a usable AdmissionReview: HTTP 400
    BODY_TOO_LARGE = "body_too_large"  # HTTP 413
    INTERNAL = "internal"  # a bug in the decision: the pod was admitted unchanged
    CAPACITY = "capacity"  # the capacity plan failed or timed out: admitted, plan unknown
    AUDIT = "audit"  # the audit line could not be built or written
    # The cached Namespace said the pod was not opted in although the API server sent it:
    # the cache is behind; the Namespace was read live (or the selectors trusted).
    NAMESPACE_CACHE = "namespace_cache"


class _HotPath(Collector):
    """The per-request families, as plain counts (see the module docstring)."""

    def __init__(self) -> None:
        self.admissions: dict[tuple[str, str], int] = {}  # (outcome, reason) -> count
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)  # per bucket, +Inf last
        self.seconds = 0.0
        self.capacity: dict[str, int] = {}  # action -> count
        self.plans = {"hit": 0, "miss": 0}
        self.errors = dict.fromkeys((kind.value for kind in ErrorKind), 0)
        self.recommendations = 0
        self.devices = {"guarded": 0, "unchanged": 0}  # POST /devices reviews by result
        self.guarded_containers = 0
        self.work_seconds = 0.0
        self.work_cpu_seconds = 0.0

    def collect(self) -> Iterator[Metric]:
        admissions = CounterMetricFamily(
            "gpupack_webhook_admissions",
            "Admission reviews answered, by outcome (mutated, skipped, denied) and reason.",
            labels=["outcome", "reason"],
        )
        for (outcome, reason), count in list(self.admissions.items()):
            admissions.add_metric([outcome, reason], count)
        yield admissions
        counts, seconds = list(self.buckets), self.seconds
        cumulative, running = [], 0
        for bound, count in zip((*map(str, DURATION_BUCKETS), "+Inf"), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        yield HistogramMetricFamily(
            "gpupack_webhook_admission_duration_seconds",
            "Time to answer one admission review, capacity check included.",
            buckets=cumulative,
            sum_value=seconds,
        )
        yield _counters(
            "gpupack_webhook_capacity_checks",
            "Capacity plans for admitted fractional pods, by outcome (sufficient: the pool's "
            "GPUs hold the pod; needed: gpupack-scheduler will create capacity).",
            "action",
            self.capacity,
        )
        yield _counters(
            "gpupack_webhook_errors",
            "Requests that went wrong, by kind; bad input never gets a 5xx.",
            "kind",
            self.errors,
        )
        yield CounterMetricFamily(
            "gpupack_webhook_recommendations_applied",
            "Admitted pods whose allocation came (at least in part) from their workload's "
            "GPURecommendation.",
            value=self.recommendations,
        )
        yield CounterMetricFamily(
            "gpupack_webhook_admission_work_seconds",
            "Wall-clock time admissions took from their body read to their answer (the "
            "admission's own work, which yields the event loop only to read a Namespace "
            "its cache has behind).",
            value=self.work_seconds,
        )
        yield CounterMetricFamily(
            "gpupack_webhook_admission_work_cpu_seconds",
            "CPU time the event loop's thread spent over the same spans; the difference "
            "from gpupack_webhook_admission_work_seconds_total is time spent waiting for "
            "the GIL (the watch threads hold it) or for a core.",
            value=self.work_cpu_seconds,
        )
        yield _counters(
            "gpupack_webhook_device_env_reviews",
            "Pods POST /devices reviewed, by result (guarded: containers given "
            "NVIDIA_VISIBLE_DEVICES=void; unchanged: every container was given a GPU or "
            "names its devices).",
            "result",
            self.devices,
        )
        yield CounterMetricFamily(
            "gpupack_webhook_device_env_containers",
            "Containers given NVIDIA_VISIBLE_DEVICES=void because the kubelet gives them no "
            "GPU and their image's environment would otherwise choose one.",
            value=self.guarded_containers,
        )
        yield _counters(
            "gpupack_webhook_plan_cache_lookups",
            "Decisions planned afresh (miss) or taken from the plan of an earlier pod of the "
            "same template and context (hit).",
            "result",
            self.plans,
        )


def _counters(name: str, documentation: str, label: str, counts: dict[str, int]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, count in list(counts.items()):
        family.add_metric([value], count)
    return family


class WebhookMetrics:
    """Every metric the webhook exports, on the given registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._hot = _HotPath()
        registry.register(self._hot)
        self._certificate_reloads = Counter(
            "gpupack_webhook_certificate_reloads",
            "Serving certificate reloads after its files changed, by result.",
            ["result"],
            registry=registry,
        )
        self._certificate_expiry = Gauge(
            "gpupack_webhook_certificate_expiry_timestamp_seconds",
            "When the serving certificate in use expires (notAfter), in Unix seconds.",
            registry=registry,
        )
        self._ready = Gauge(
            "gpupack_webhook_ready",
            "1 while this replica is ready to admit pods (what /readyz answers), else 0.",
            registry=registry,
        )
        for result in ("success", "failure"):
            self._certificate_reloads.labels(result)

    def admission(self, outcome: Outcome, reason: Reason, seconds: float) -> None:
        hot = self._hot
        key = (outcome.value, reason.value)
        hot.admissions[key] = hot.admissions.get(key, 0) + 1
        hot.buckets[bisect_left(DURATION_BUCKETS, seconds)] += 1  # le: upper bounds count
        hot.seconds += seconds

    def work(self, seconds: float, cpu_seconds: float) -> None:
        """One admission's own work: wall-clock and the loop thread's CPU time."""
        hot = self._hot
        hot.work_seconds += seconds
        hot.work_cpu_seconds += cpu_seconds

    def plan_lookup(self, hit: bool) -> None:
        self._hot.plans["hit" if hit else "miss"] += 1

    def recommendation_applied(self) -> None:
        self._hot.recommendations += 1

    def device_env(self, containers: int) -> None:
        """One POST /devices review that guarded `containers` containers."""
        hot = self._hot
        hot.devices["guarded" if containers else "unchanged"] += 1
        hot.guarded_containers += containers

    def capacity(self, action: str) -> None:
        capacity = self._hot.capacity
        capacity[action] = capacity.get(action, 0) + 1

    def error(self, kind: ErrorKind) -> None:
        self._hot.errors[kind.value] += 1

    def readiness(self, ready: Callable[[], bool]) -> None:
        """Read `ready` at every scrape for `gpupack_webhook_ready`."""
        self._ready.set_function(lambda: float(ready()))

    def serving_certificate(self, validity: Validity) -> None:
        self._certificate_expiry.set(validity.not_after.timestamp())

    def certificate_reload(self, succeeded: bool) -> None:
        self._certificate_reloads.labels("success" if succeeded else "failure").inc()


def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> Endpoints:
    """Serve `registry` at http://host:port/metrics (port 0: any free port), on the same
    dual-stack listener as every other binary's endpoints. The kubelet probes the HTTPS
    port, not this one, so its `/readyz` only says the process is up."""
    return Endpoints(
        host,
        port,
        render=lambda: (generate_latest(registry), CONTENT_TYPE_LATEST),
        ready=lambda: None,
    ).start()
