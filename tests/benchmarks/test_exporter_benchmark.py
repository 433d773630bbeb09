"""The exporter scrape benchmark on a tiny node: what it reports and what it scrapes (no timing)."""

import json
from collections import Counter
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from benchmarks.exporter import run
from doubles.nvml import fake_uuid

GPUS = 2
PROCESSES = 12  # per GPU: process 9 of each GPU is idle in FakeReader.typical
CONTAINERS = 5  # per pod: pods of 5, 5 and 2 containers on each GPU
PODS_PER_GPU = 3


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Sample]]:
    out = tmp_path_factory.mktemp("exporter-benchmark")
    report_path, exposition_path = out / "report.json", out / "metrics.txt"

    code = run.main(
        [
            *("--gpus", str(GPUS), "--processes", str(PROCESSES)),
            *("--containers", str(CONTAINERS), "--scrapes", "3", "--warmup", "1"),
            *("--interval", "2", "--json", str(report_path)),
            *("--exposition", str(exposition_path)),
        ]
    )

    assert code == 0
    report = json.loads(report_path.read_text())
    families = text_string_to_metric_families(exposition_path.read_text())
    return report, [sample for family in families for sample in family.samples]


def expected_series() -> set[tuple[str, str, str, str]]:
    """(namespace, pod, container, gpu) of every GPU process on the benchmark's node."""
    return {
        (
            run.NAMESPACE,
            run.pod_name(gpu, n // CONTAINERS),
            run.container_name(n % CONTAINERS),
            fake_uuid(gpu),
        )
        for gpu in range(GPUS)
        for n in range(PROCESSES)
    }


def labelled(samples: list[Sample], name: str) -> list[tuple[str, ...]]:
    return [
        (s.labels["namespace"], s.labels["pod"], s.labels["container"], s.labels["gpu"])
        for s in samples
        if s.name == name
    ]


def test_report_names_the_layout_the_figures_and_the_memory(
    ran: tuple[dict[str, Any], list[Sample]],
) -> None:
    report, samples = ran

    assert report["layout"] == {
        "gpus": GPUS,
        "processes_per_gpu": PROCESSES,
        "processes": GPUS * PROCESSES,
        "containers_per_pod": CONTAINERS,
        "pods": GPUS * PODS_PER_GPU,
        "capacity_pods": GPUS,
    }
    assert report["series"] == len(samples)
    assert report["scrapes"] == 3
    assert report["target_ms"] == run.TARGET_MS
    for part in ("gpupack", "agent_scrape", "baseline_gauges", "sample_once"):
        assert set(report[part]) >= {"p50_ms", "p99_ms", "mean_ms", "max_ms"}
    assert isinstance(report["ratio_p50"], float)
    assert set(report["within_target"]) == {"p50", "p99"}
    memory = report["memory_mib"]
    assert set(memory) == {
        "rss_after_imports",
        "vmrss_before_baseline",
        "vmrss_after_run",
        "vmhwm_after_run",
    }
    assert all(value > 0 for value in memory.values())
    assert memory["vmhwm_after_run"] >= memory["vmrss_after_run"]


def test_every_process_is_one_container_series_of_compute_and_memory(
    ran: tuple[dict[str, Any], list[Sample]],
) -> None:
    _, samples = ran

    compute = labelled(samples, "gpupack_pod_gpu_compute_ratio")
    memory = labelled(samples, "gpupack_pod_gpu_memory_used_bytes")

    assert len(compute) == len(memory) == GPUS * PROCESSES
    assert set(compute) == set(memory) == expected_series()


def test_idle_processes_report_zero_compute_not_a_missing_series(
    ran: tuple[dict[str, Any], list[Sample]],
) -> None:
    _, samples = ran

    idle = {
        (run.pod_name(gpu, 9 // CONTAINERS), run.container_name(9 % CONTAINERS), fake_uuid(gpu))
        for gpu in range(GPUS)
    }
    values = {
        (s.labels["pod"], s.labels["container"], s.labels["gpu"]): s.value
        for s in samples
        if s.name == "gpupack_pod_gpu_compute_ratio"
    }

    assert {key: values[key] for key in idle} == dict.fromkeys(idle, 0.0)


def test_every_pod_has_its_allocation_and_every_gpu_its_capacity_pod(
    ran: tuple[dict[str, Any], list[Sample]],
) -> None:
    _, samples = ran
    names = Counter(s.name for s in samples)

    holders = {
        (s.labels["gpu"], s.labels["pod"]) for s in samples if s.name == "gpupack_gpu_capacity_pod"
    }

    assert names["gpupack_pod_gpu_compute_allocated_ratio"] == GPUS * PODS_PER_GPU
    assert names["gpupack_pod_gpu_memory_allocated_bytes"] == GPUS * PODS_PER_GPU
    assert names["gpupack_pod_gpu_managed"] == GPUS * PODS_PER_GPU
    assert holders == {(fake_uuid(gpu), f"gpupack-capacity-{gpu}") for gpu in range(GPUS)}
    assert names["gpupack_gpu_unattributed_compute_ratio"] == 0


def test_baseline_exposes_the_same_series_as_the_scrape() -> None:
    exposition = (
        b"# HELP gpupack_gpu_xid_errors XID errors\n"
        b"# TYPE gpupack_gpu_xid_errors counter\n"
        b'gpupack_gpu_xid_errors_total{gpu="GPU-1"} 2.0\n'
        b"# HELP gpupack_exporter_nvml_up 1 when NVML answers\n"
        b"# TYPE gpupack_exporter_nvml_up gauge\n"
        b"gpupack_exporter_nvml_up 1.0\n"
    )

    baseline = generate_latest(run.gauge_registry(exposition))

    assert run.samples_of(baseline) == run.samples_of(exposition) == 2
    assert b'gpupack_gpu_xid_errors_total{gpu="GPU-1"} 2.0' in baseline
