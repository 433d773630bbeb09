"""The webhook's per-request metrics: plain counts, exported as Prometheus families."""

import pytest
from prometheus_client import CollectorRegistry

from webhook.decision import Outcome, Reason
from webhook.metrics import DURATION_BUCKETS, ErrorKind, WebhookMetrics


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_the_duration_histogram_counts_each_admission_at_or_below_its_bucket() -> None:
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    for seconds in (0.001, 0.0011, 0.3, 9.0):  # on a bound, just above one, high, past all
        metrics.admission(Outcome.MUTATED, Reason.MUTATED, seconds)

    def bucket(le: str) -> float | None:
        return sample(registry, "gpupack_webhook_admission_duration_seconds_bucket", le=le)

    assert [bucket(le) for le in ("0.0005", "0.001", "0.0025", "0.5", "2.5", "+Inf")] == [
        0,
        1,
        2,
        3,
        3,
        4,
    ]
    assert sample(registry, "gpupack_webhook_admission_duration_seconds_count") == 4
    assert sample(registry, "gpupack_webhook_admission_duration_seconds_sum") == pytest.approx(
        9.3021
    )
    assert len(DURATION_BUCKETS) + 1 == sum(
        1
        for family in registry.collect()
        for s in family.samples
        if s.name == "gpupack_webhook_admission_duration_seconds_bucket"
    )


def test_counts_are_labelled_as_they_were_recorded() -> None:
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    metrics.admission(Outcome.SKIPPED, Reason.NO_GPU, 0.001)
    metrics.admission(Outcome.SKIPPED, Reason.NO_GPU, 0.001)
    metrics.capacity("needed")
    metrics.plan_lookup(hit=True)
    metrics.error(ErrorKind.AUDIT)
    metrics.recommendation_applied()

    admissions = "gpupack_webhook_admissions_total"
    assert sample(registry, admissions, outcome="skipped", reason="no-gpu") == 2
    assert sample(registry, admissions, outcome="mutated", reason="mutated") is None
    assert sample(registry, "gpupack_webhook_capacity_checks_total", action="needed") == 1
    assert sample(registry, "gpupack_webhook_plan_cache_lookups_total", result="hit") == 1
    assert sample(registry, "gpupack_webhook_plan_cache_lookups_total", result="miss") == 0
    assert sample(registry, "gpupack_webhook_errors_total", kind="audit") == 1
    assert sample(registry, "gpupack_webhook_errors_total", kind="internal") == 0
    assert sample(registry, "gpupack_webhook_recommendations_applied_total") == 1
