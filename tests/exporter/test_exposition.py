"""Our text writer says exactly what prometheus_client's would, faster."""

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from exporter import exposition
from exporter.collector import ExporterCollector, Scrape
from exporter.health import HealthSnapshot
from exporter.readings import Readings
from tests.exporter.test_collector import (
    CONTAINER_A,
    GPU0,
    HOLDER,
    TRAINER,
    WHOLE,
    reading,
)


class Fixed(Collector):
    def __init__(self, *families: Metric) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def registry_of(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def test_a_real_scrape_is_byte_for_byte_what_prometheus_client_writes() -> None:
    from exporter.cgroup import HOST, OwnerKind, ProcessOwner
    from exporter.readings import ProcessUsage

    readings = Readings(
        gpus=(
            reading(
                GPU0,
                0,
                ProcessUsage(pid=1, memory=3 << 30, compute=0.1 + 0.2),
                ProcessUsage(pid=2, memory=None, compute=1e-7),
                ProcessUsage(pid=3, memory=12345678901234, compute=0.0),
            ),
        ),
        nvml_up=True,
        sample_age=0.25,
        window=15.0,
    )
    owners = {
        1: ProcessOwner(OwnerKind.POD, TRAINER.uid, CONTAINER_A),
        2: HOST,
        3: ProcessOwner(OwnerKind.POD, WHOLE.uid, "x"),
    }
    scrape = Scrape(
        readings,
        owners,
        {p.uid: p for p in (TRAINER, HOLDER, WHOLE)},
        HealthSnapshot({"nvml": True}, {"nvml": 2}, {}),
    )
    registry = registry_of(ExporterCollector(lambda: scrape))
    assert exposition.text(registry) == generate_latest(registry)


def test_label_values_that_need_escaping_are_escaped_like_prometheus_client() -> None:
    gauge = GaugeMetricFamily("g", "help with \\ and\nnewline", labels=["b", "a"])
    gauge.add_metric(['quote " here', "back\\slash\nnew"], 1.5)
    gauge.add_metric(["plain", "ünïcödé"], float("inf"))
    counter = CounterMetricFamily("c", "a counter", labels=["x"])
    counter.add_metric(["1"], 3)
    registry = registry_of(Fixed(gauge, counter, GaugeMetricFamily("empty", "no samples")))
    assert exposition.text(registry) == generate_latest(registry)


def test_other_kinds_of_family_fall_back_to_prometheus_client() -> None:
    histogram = HistogramMetricFamily(
        "h", "a histogram", buckets=[("1", 2), ("+Inf", 3)], sum_value=4
    )
    registry = registry_of(Fixed(histogram))
    assert exposition.text(registry) == generate_latest(registry)


def test_samples_whose_label_names_differ_but_not_in_number_are_written_alike() -> None:
    """The writer once re-sorted label names only when their count changed, so such a
    family failed the whole scrape with a 500."""
    family = Metric("gpupack_mixed", "labels that change between samples", "gauge")
    family.add_sample("gpupack_mixed", {"gpu": "0", "pod": "a"}, 1)
    family.add_sample("gpupack_mixed", {"gpu": "0", "node": "n"}, 2)
    family.add_sample("gpupack_mixed", {"node": "n", "uuid": "x"}, 3)
    registry = registry_of(Fixed(family))

    assert exposition.text(registry) == generate_latest(registry)
