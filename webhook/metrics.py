"""The webhook's Prometheus metrics, and the plain-HTTP endpoint that serves them.

`WebhookMetrics` owns every metric family, registered on a registry the caller passes in
(never the global one), so a test or a benchmark gets a fresh set. Recording methods are
cheap: the admission counter's label children are cached after first use, since the hot
path of `POST /mutate` records one admission per request.
"""

from collections.abc import Callable
from enum import StrEnum
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

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


class WebhookMetrics:
    """Every metric the webhook exports, on the given registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._admissions = Counter(
            "gpupack_webhook_admissions",
            "Admission reviews answered, by outcome (mutated, skipped, denied) and reason.",
            ["outcome", "reason"],
            registry=registry,
        )
        self._duration = Histogram(
            "gpupack_webhook_admission_duration_seconds",
            "Time to answer one admission review, capacity check included.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._capacity_checks = Counter(
            "gpupack_webhook_capacity_checks",
            "Capacity plans for admitted fractional pods, by outcome (sufficient: the pool's "
            "GPUs hold the pod; needed: gpupack-scheduler will create capacity).",
            ["action"],
            registry=registry,
        )
        self._errors = Counter(
            "gpupack_webhook_errors",
            "Requests that went wrong, by kind; bad input never gets a 5xx.",
            ["kind"],
            registry=registry,
        )
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
        self._recommendations_applied = Counter(
            "gpupack_webhook_recommendations_applied",
            "Admitted pods whose allocation came (at least in part) from their workload's "
            "GPURecommendation.",
            registry=registry,
        )
        self._plans = Counter(
            "gpupack_webhook_plan_cache_lookups",
            "Decisions planned afresh (miss) or taken from the plan of an earlier pod of the "
            "same template and context (hit).",
            ["result"],
            registry=registry,
        )
        self._plan_children = {
            hit: self._plans.labels("hit" if hit else "miss") for hit in (True, False)
        }
        self._admission_children: dict[tuple[str, str], Counter] = {}
        self._capacity_children: dict[str, Counter] = {}
        self._error_children = {kind: self._errors.labels(kind.value) for kind in ErrorKind}
        for result in ("success", "failure"):
            self._certificate_reloads.labels(result)

    def admission(self, outcome: Outcome, reason: Reason, seconds: float) -> None:
        key = (outcome.value, reason.value)
        child = self._admission_children.get(key)
        if child is None:
            child = self._admission_children[key] = self._admissions.labels(*key)
        child.inc()
        self._duration.observe(seconds)

    def plan_lookup(self, hit: bool) -> None:
        self._plan_children[hit].inc()

    def recommendation_applied(self) -> None:
        self._recommendations_applied.inc()

    def capacity(self, action: str) -> None:
        child = self._capacity_children.get(action)
        if child is None:
            child = self._capacity_children[action] = self._capacity_checks.labels(action)
        child.inc()

    def error(self, kind: ErrorKind) -> None:
        self._error_children[kind].inc()

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
