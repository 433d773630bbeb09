"""The collector: readings and the pod map in, Prometheus text out (parsed back with the
Prometheus text parser, as a scraper reads it)."""

from dataclasses import replace
from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cgroup import GONE, HOST, OwnerKind, ProcessOwner
from exporter.collector import ExporterCollector, Scrape, families
from exporter.health import HealthSnapshot
from exporter.pods import PodInfo
from exporter.readings import (
    Device,
    DeviceStatus,
    GpuReading,
    ProcessKind,
    ProcessUsage,
    Readings,
)

GPU0 = "GPU-0a1b2c3d-0000-4000-8000-000000000000"
GPU1 = "GPU-0a1b2c3d-0000-4000-8000-000000000001"
GIB = 1 << 30
CONTAINER_A = "a" * 64
CONTAINER_B = "b" * 64

Sample = tuple[str, dict[str, str], float]


def pod(
    uid: str,
    name: str,
    *,
    namespace: str = "ml",
    containers: dict[str, str] | None = None,
    compute: int | None = None,
    memory: int | None = None,
    gpu: str | None = None,
    capacity: bool = False,
    phase: str = "Running",
) -> PodInfo:
    return PodInfo(
        uid=uid,
        namespace=namespace,
        name=name,
        containers=MappingProxyType(containers or {}),
        managed=compute is not None,
        compute=compute,
        memory=memory,
        gpu_uuid=gpu,
        capacity=capacity,
        phase=phase,
    )


def device(uuid: str, index: int, *, mig: bool = False) -> Device:
    return Device(
        index=index, uuid=uuid, name="NVIDIA H100 80GB HBM3", memory_total=80 * GIB, mig=mig
    )


def reading(uuid: str, index: int, *processes: ProcessUsage, mig: bool = False) -> GpuReading:
    return GpuReading(
        device=device(uuid, index, mig=mig),
        status=DeviceStatus(utilization=0.5, memory_used=20 * GIB, temperature=41.0, power=310.5),
        healthy=True,
        processes=processes,
    )


def scrape_text(scrape: Scrape) -> list[Sample]:
    registry = CollectorRegistry()
    registry.register(ExporterCollector(lambda: scrape))
    text = generate_latest(registry).decode()
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


ORDER = (
    "namespace",
    "pod",
    "container",
    "gpu",
    "shim",
    "source",
    "index",
    "model",
    "mig",
    "enforcement",
)


def values(samples: list[Sample], name: str) -> dict[tuple[str, ...], float]:
    """Samples of `name` keyed by their label values in ORDER (the parser sorts labels)."""
    assert all(key in ORDER for _, labels, _ in samples for key in labels)
    return {
        tuple(labels[key] for key in ORDER if key in labels): value
        for n, labels, value in samples
        if n == name
    }


TRAINER = pod(
    "uid-trainer",
    "trainer-0",
    containers={CONTAINER_A: "main", CONTAINER_B: "sidecar"},
    compute=300,
    memory=12 * GIB,
    gpu=GPU0,
)
HOLDER = pod("uid-cap", "gpupack-cap-1", namespace="gpupack-system", capacity=True, gpu=GPU0)
WHOLE = pod("uid-whole", "whole-gpu", containers={CONTAINER_B: "app"})  # not ours


def test_pod_usage_stands_beside_its_allocation() -> None:
    readings = Readings(
        gpus=(
            reading(
                GPU0,
                0,
                ProcessUsage(pid=100, memory=6 * GIB, compute=0.25),
                ProcessUsage(pid=101, memory=2 * GIB, compute=0.05),
                ProcessUsage(pid=102, memory=1 * GIB, compute=0.10),
            ),
        ),
        nvml_up=True,
        sample_age=0.4,
        window=15.0,
    )
    owners = {
        100: ProcessOwner(OwnerKind.POD, "uid-trainer", CONTAINER_A),
        101: ProcessOwner(OwnerKind.POD, "uid-trainer", CONTAINER_A),
        102: ProcessOwner(OwnerKind.POD, "uid-trainer", CONTAINER_B),
    }
    samples = scrape_text(Scrape(readings, owners, {p.uid: p for p in (TRAINER, HOLDER)}))

    assert values(samples, "gpupack_pod_gpu_compute_ratio") == {
        ("ml", "trainer-0", "main", GPU0): pytest.approx(0.30),
        ("ml", "trainer-0", "sidecar", GPU0): pytest.approx(0.10),
    }
    assert values(samples, "gpupack_pod_gpu_memory_used_bytes") == {
        ("ml", "trainer-0", "main", GPU0): 8 * GIB,
        ("ml", "trainer-0", "sidecar", GPU0): 1 * GIB,
    }
    assert values(samples, "gpupack_pod_gpu_compute_allocated_ratio") == {
        ("ml", "trainer-0", GPU0): 0.3
    }
    # Its three processes used 0.40 of the GPU on a share of 0.3: past its share.
    assert values(samples, "gpupack_pod_gpu_compute_share_ratio") == {
        ("ml", "trainer-0", GPU0): pytest.approx(0.40 / 0.3)
    }
    assert values(samples, "gpupack_pod_gpu_memory_allocated_bytes") == {
        ("ml", "trainer-0", GPU0): 12 * GIB
    }
    assert values(samples, "gpupack_gpu_capacity_pod") == {
        ("gpupack-system", "gpupack-cap-1", GPU0): 1.0
    }
    assert values(samples, "gpupack_exporter_window_seconds") == {(): 15.0}


def test_processes_outside_pods_are_reported_by_source_not_charged_to_a_pod() -> None:
    mps_host = pod(
        "uid-mps", "mps-daemon", namespace="kube-system", containers={CONTAINER_A: "mps"}
    )
    readings = Readings(
        gpus=(
            reading(
                GPU1,
                1,
                ProcessUsage(pid=7, memory=GIB, compute=0.2),  # a host process
                ProcessUsage(pid=8, memory=2 * GIB, compute=0.6),  # the MPS server
                ProcessUsage(pid=9, memory=GIB, compute=0.1),  # exited before attribution
                ProcessUsage(pid=10, memory=GIB, compute=0.1),  # its pod is not known yet
                ProcessUsage(pid=11, memory=3 * GIB, compute=0.4),  # a whole-GPU pod
            ),
        ),
        nvml_up=True,
    )
    owners = {
        7: HOST,
        8: ProcessOwner(OwnerKind.MPS_SERVER, "uid-mps", CONTAINER_A),
        9: GONE,
        10: ProcessOwner(OwnerKind.POD, "uid-unseen", CONTAINER_A),
        11: ProcessOwner(OwnerKind.POD, "uid-whole", CONTAINER_B),
    }
    pods = {p.uid: p for p in (mps_host, WHOLE)}
    samples = scrape_text(Scrape(readings, owners, pods))

    assert values(samples, "gpupack_gpu_unattributed_compute_ratio") == {
        (GPU1, "host"): pytest.approx(0.2),
        (GPU1, "mps-server"): pytest.approx(0.6),
        (GPU1, "unknown"): pytest.approx(0.2),
    }
    assert values(samples, "gpupack_gpu_unattributed_memory_used_bytes")[(GPU1, "unknown")] == (
        2 * GIB
    )
    # The pod that hosts the MPS daemon is not charged for its clients' kernels.
    usage = values(samples, "gpupack_pod_gpu_compute_ratio")
    assert usage == {("ml", "whole-gpu", "app", GPU1): pytest.approx(0.4)}
    # A pod gpupack does not manage is reported by name, and as not managed.
    assert values(samples, "gpupack_pod_gpu_managed") == {("ml", "whole-gpu"): 0.0}
    assert values(samples, "gpupack_pod_gpu_compute_allocated_ratio") == {}


def test_mig_reports_memory_and_no_compute() -> None:
    readings = Readings(
        gpus=(reading(GPU0, 0, ProcessUsage(pid=5, memory=GIB, compute=None), mig=True),),
        nvml_up=True,
    )
    samples = scrape_text(
        Scrape(
            readings,
            {5: ProcessOwner(OwnerKind.POD, "uid-trainer", CONTAINER_A)},
            {"uid-trainer": TRAINER},
        )
    )
    assert values(samples, "gpupack_pod_gpu_memory_used_bytes") == {
        ("ml", "trainer-0", "main", GPU0): GIB
    }
    assert values(samples, "gpupack_pod_gpu_compute_ratio") == {}
    assert values(samples, "gpupack_gpu_info") == {
        (GPU0, "0", "NVIDIA H100 80GB HBM3", "true"): 1.0
    }


def test_a_pod_that_is_gone_leaves_no_series() -> None:
    first = Readings(gpus=(reading(GPU0, 0, ProcessUsage(pid=100, memory=GIB, compute=0.3)),))
    owners = {100: ProcessOwner(OwnerKind.POD, "uid-trainer", CONTAINER_A)}
    state = {"scrape": Scrape(first, owners, {"uid-trainer": TRAINER})}
    registry = CollectorRegistry()
    registry.register(ExporterCollector(lambda: state["scrape"]))
    assert b'pod="trainer-0"' in generate_latest(registry)

    state["scrape"] = Scrape(Readings(gpus=(reading(GPU0, 0),)), {}, {})
    assert b'pod="trainer-0"' not in generate_latest(registry)


def test_finished_pods_have_no_allocation_series() -> None:
    done = pod("uid-done", "done", compute=500, gpu=GPU0, phase="Succeeded")
    samples = scrape_text(Scrape(Readings(gpus=(reading(GPU0, 0),)), {}, {done.uid: done}))
    assert values(samples, "gpupack_pod_gpu_compute_allocated_ratio") == {}


@pytest.mark.parametrize(
    ("readings", "health", "expected"),
    [
        pytest.param(
            Readings(nvml_up=False),
            HealthSnapshot({"nvml": False, "api": True}, {"nvml": 3}, {"nvml": "no driver"}),
            {
                "gpupack_exporter_nvml_up": 0.0,
                "gpupack_exporter_api_up": 1.0,
                "gpupack_exporter_pod_resources_up": 0.0,
                "gpupack_exporter_last_sample_age_seconds": -1.0,
            },
            id="nvml-down-before-any-sample",
        ),
        pytest.param(
            Readings(nvml_up=True, sample_age=0.7),
            HealthSnapshot({"nvml": True, "pod-resources": True, "api": True}, {}, {}),
            {
                "gpupack_exporter_nvml_up": 1.0,
                "gpupack_exporter_pod_resources_up": 1.0,
                "gpupack_exporter_last_sample_age_seconds": 0.7,
            },
            id="all-up",
        ),
    ],
)
def test_health_metrics_say_what_is_wrong(
    readings: Readings, health: HealthSnapshot, expected: dict[str, float]
) -> None:
    samples = scrape_text(Scrape(readings, health=health))
    for name, value in expected.items():
        assert values(samples, name) == {(): value}, name
    errors = values(samples, "gpupack_exporter_errors_total")
    assert set(errors) == {("api",), ("nvml",), ("pod-resources",)}
    assert errors[("nvml",)] == health.errors.get("nvml", 0)


def test_a_lost_gpu_is_unhealthy_and_keeps_its_identity() -> None:
    lost = GpuReading(device=device(GPU1, 1), status=None, healthy=False, xid_errors=2, last_xid=79)
    samples = scrape_text(Scrape(Readings(gpus=(reading(GPU0, 0), lost), nvml_up=True)))
    assert values(samples, "gpupack_gpu_healthy") == {(GPU0,): 1.0, (GPU1,): 0.0}
    assert values(samples, "gpupack_gpu_last_xid_code") == {(GPU1,): 79.0}
    assert values(samples, "gpupack_gpu_xid_errors_total")[(GPU1,)] == 2.0
    assert set(values(samples, "gpupack_gpu_utilization_ratio")) == {(GPU0,)}
    assert values(samples, "gpupack_gpu_memory_total_bytes")[(GPU1,)] == 80 * GIB


def test_describe_names_every_family_without_sampling() -> None:
    def fail() -> Scrape:
        raise AssertionError("describe must not scrape")

    described = {family.name for family in ExporterCollector(fail).describe()}
    produced = {family.name for family in families(Scrape(Readings()))}
    assert described == produced
    assert all(name.startswith("gpupack_") for name in described)


def test_graphics_processes_count_like_compute_ones() -> None:
    readings = Readings(
        gpus=(
            reading(
                GPU0, 0, ProcessUsage(pid=3, memory=GIB, compute=0.1, kind=ProcessKind.GRAPHICS)
            ),
        )
    )
    samples = scrape_text(
        Scrape(
            readings,
            {3: ProcessOwner(OwnerKind.POD, "uid-whole", CONTAINER_B)},
            {"uid-whole": WHOLE},
        )
    )
    assert values(samples, "gpupack_pod_gpu_memory_used_bytes") == {
        ("ml", "whole-gpu", "app", GPU0): GIB
    }


def test_a_lost_gpu_is_not_nvml_down() -> None:
    lost = GpuReading(device=device(GPU1, 1), status=None, healthy=False)
    health = HealthSnapshot({"nvml": False}, {"nvml": 1}, {"nvml": f"{GPU1}: GPU is lost"})
    samples = scrape_text(
        Scrape(Readings(gpus=(reading(GPU0, 0), lost), nvml_up=True), health=health)
    )
    assert values(samples, "gpupack_exporter_nvml_up") == {(): 1.0}
    assert values(samples, "gpupack_gpu_healthy") == {(GPU0,): 1.0, (GPU1,): 0.0}


def test_each_pods_gpu_processes_are_counted_by_whether_the_shim_runs_in_them() -> None:
    readings = Readings(
        gpus=(
            reading(
                GPU0,
                0,
                ProcessUsage(pid=100, memory=GIB, compute=0.1),
                ProcessUsage(pid=101, memory=GIB, compute=0.1),
                ProcessUsage(pid=102, memory=GIB, compute=0.1),
                ProcessUsage(pid=103, memory=GIB, compute=0.1),
            ),
        ),
        nvml_up=True,
    )
    owners = {
        100: ProcessOwner(OwnerKind.POD, "uid-trainer", CONTAINER_A, shim=True),
        101: ProcessOwner(OwnerKind.POD, "uid-trainer", CONTAINER_A, shim=True),
        102: ProcessOwner(OwnerKind.POD, "uid-trainer", CONTAINER_B, shim=False),
        103: ProcessOwner(OwnerKind.POD, "uid-trainer", CONTAINER_B),
    }
    trainer = replace(TRAINER, enforcement="memory")
    samples = scrape_text(Scrape(readings, owners, {p.uid: p for p in (trainer, HOLDER)}))
    assert values(samples, "gpupack_pod_gpu_processes") == {
        ("ml", "trainer-0", "main", GPU0, "loaded"): 2.0,
        ("ml", "trainer-0", "sidecar", GPU0, "missing"): 1.0,
        ("ml", "trainer-0", "sidecar", GPU0, "unknown"): 1.0,
    }
    assert values(samples, "gpupack_pod_enforcement_info") == {("ml", "trainer-0", "memory"): 1.0}
