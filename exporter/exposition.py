"""The Prometheus text format (0.0.4) for the exporter's own families, written directly.

prometheus_client's `generate_latest` validates and escapes every label name of every
sample; at 8 GPUs x 64 processes that is most of a scrape (`benchmarks/exporter`). Our
families are gauges and counters whose names and label names are fixed identifiers, so
this writer sorts the label names once per run of samples that share them and escapes
only values that need it.
Its output parses to the same samples as `generate_latest`'s (a test holds it to that);
any other kind of family falls back to `generate_latest`.
"""

from collections.abc import Iterable
from typing import Final

from prometheus_client import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_SIMPLE: Final = frozenset({"gauge", "counter"})


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def text(registry: Collector) -> bytes:
    """`/metrics` for `registry`, as `generate_latest(registry)` would say it."""
    families = list(registry.collect())
    if any(family.type not in _SIMPLE for family in families):
        return generate_latest(registry)
    out: list[str] = []
    for family in families:
        name = family.name + "_total" if family.type == "counter" else family.name
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
        out.extend(_samples(family.samples))
    return "".join(out).encode()


def _samples(samples: Iterable[Sample]) -> Iterable[str]:
    names: frozenset[str] = frozenset()
    order: tuple[str, ...] = ()  # sorted once for a run of samples with the same names
    for sample in samples:
        labels = sample.labels
        if labels.keys() != names:  # not merely their count: {gpu, pod} then {gpu, node}
            names = frozenset(labels)
            order = tuple(sorted(names))
        value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]
        if labels:
            pairs = ",".join([f'{key}="{_escape(labels[key])}"' for key in order])
            yield f"{sample.name}{{{pairs}}} {value}\n"
        else:
            yield f"{sample.name} {value}\n"
