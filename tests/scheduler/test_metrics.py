"""Gauges the alerts read: how long the oldest pod has waited, escaped pods."""

from prometheus_client import CollectorRegistry

from scheduler.metrics import Metrics, Usage
from scheduler.reporting import created


def gauges(usage: Usage, wall: float = 2_000_000_000.0) -> CollectorRegistry:
    registry = CollectorRegistry()
    Metrics(registry, lambda: usage, wall=lambda: wall)
    return registry


def test_the_oldest_pending_pod_age_is_measured_from_its_creation() -> None:
    pod = {"metadata": {"creationTimestamp": "2033-05-18T03:23:20Z"}}  # 2_000_000_000 - 600
    waiting = Usage(0, 0, 0, 0, 1, leader=True, oldest_pending=created(pod))
    registry = gauges(waiting)
    age = registry.get_sample_value("gpupack_scheduler_oldest_pending_pod_age_seconds")
    assert age == 600


def test_nothing_waiting_is_age_zero_and_escapes_are_counted() -> None:
    registry = gauges(Usage(0, 0, 0, 0, 0, leader=True, escaped=3))
    assert registry.get_sample_value("gpupack_scheduler_oldest_pending_pod_age_seconds") == 0
    assert registry.get_sample_value("gpupack_scheduler_escaped_pods") == 3
