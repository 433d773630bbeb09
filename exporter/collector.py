"""Readings and the pod map in, Prometheus metric families out: the exporter's pure core.

Every scrape builds fresh families from one `Scrape` (the sampler's readings, who owns
each PID, the node's pods, the exporter's health), so a pod that is gone leaves no stale
series. Names follow Prometheus conventions: base units, `_ratio`, `_bytes`, `_total`,
and few labels: `gpu` is the device UUID (stable across reboots, unlike the index);
pods are named by `namespace`, `pod`, `container`.

Beside each pod's use of a GPU stand the allocation from its gpupack annotations, so
over-use is one comparison away. Use by processes in no pod (the host), by the CUDA MPS
server (which runs clients' kernels: charged to no pod, since the pod hosting the
daemon did not ask for them), or by PIDs that could not be attributed is reported per
GPU under `source`.
"""

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.cgroup import GONE, OwnerKind, ProcessOwner
from exporter.health import API, POD_RESOURCES, SOURCES, HealthSnapshot
from exporter.pods import PodInfo
from exporter.readings import GpuReading, Readings
from gpupack import metrics
from gpupack.metrics import Use

PREFIX: Final = "gpupack_"
POD_LABELS: Final = ("namespace", "pod", "container", "gpu")
ALLOCATION_LABELS: Final = ("namespace", "pod", "gpu")
LIVE_PHASES: Final = frozenset({"Pending", "Running", ""})


class Source(enum.StrEnum):
    """Who used GPU time that no pod is charged for (the `source` label)."""

    HOST = "host"  # a process in no pod
    MPS_SERVER = "mps-server"
    UNKNOWN = "unknown"  # exited before it could be read, or its pod is not known yet


@dataclass(frozen=True, slots=True)
class Scrape:
    readings: Readings
    owners: Mapping[int, ProcessOwner] = field(default_factory=dict)  # by host PID
    pods: Mapping[str, PodInfo] = field(default_factory=dict)  # the node's pods by UID
    health: HealthSnapshot = field(default_factory=lambda: HealthSnapshot({}, {}, {}))


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


_SOURCES: Final = {OwnerKind.HOST: Source.HOST, OwnerKind.MPS_SERVER: Source.MPS_SERVER}


class Shim(enum.StrEnum):
    """Whether a pod's GPU process runs with the memory shim (the `shim` label)."""

    LOADED = "loaded"
    MISSING = "missing"
    UNKNOWN = "unknown"  # its memory map could not be read


def _shim(owner: ProcessOwner) -> Shim:
    if owner.shim is None:
        return Shim.UNKNOWN
    return Shim.LOADED if owner.shim else Shim.MISSING


def _by_owner(
    gpu: GpuReading,
    owners: Mapping[int, ProcessOwner],
    pods: Mapping[str, PodInfo],
    shims: dict[tuple[str, str, str, Shim], int] | None = None,
) -> tuple[dict[tuple[str, str, str], Use], dict[Source, Use]]:
    """Sum a GPU's processes per (namespace, pod, container), and the rest per source;
    count the pods' processes per shim state into `shims`."""
    in_pods: dict[tuple[str, str, str], Use] = {}
    others: dict[Source, Use] = {}
    for process in gpu.processes:
        owner = owners.get(process.pid, GONE)
        pod = pods.get(owner.pod_uid or "") if owner.kind is OwnerKind.POD else None
        if pod is None:
            source = _SOURCES.get(owner.kind, Source.UNKNOWN)
            others.setdefault(source, Use()).add(process.compute, process.memory)
            continue
        container = pod.containers.get(owner.container_id or "", "")
        key = (pod.namespace, pod.name, container)
        in_pods.setdefault(key, Use()).add(process.compute, process.memory)
        if shims is not None:
            counted = (*key, _shim(owner))
            shims[counted] = shims.get(counted, 0) + 1
    return in_pods, others


def _gpu_families(scrape: Scrape) -> Iterator[Metric]:
    gpus = scrape.readings.gpus
    info = _gauge(
        metrics.GPU_INFO,
        "A GPU on this node (1), with its index, model and MIG mode",
        ("gpu", "index", "model", "mig"),
    )
    util = _gauge(
        metrics.GPU_UTILIZATION, "Time a kernel ran on the GPU over NVML's last period", ("gpu",)
    )
    used = _gauge(PREFIX + "gpu_memory_used_bytes", "GPU memory in use", ("gpu",))
    total = _gauge(PREFIX + "gpu_memory_total_bytes", "GPU memory installed", ("gpu",))
    temperature = _gauge(PREFIX + "gpu_temperature_celsius", "GPU temperature", ("gpu",))
    power = _gauge(PREFIX + "gpu_power_watts", "GPU power draw", ("gpu",))
    healthy = _gauge(
        metrics.GPU_HEALTHY, "1 unless the GPU is lost or reported a critical XID", ("gpu",)
    )
    xids = CounterMetricFamily(
        PREFIX + "gpu_xid_errors", "XID errors NVML reported", labels=["gpu"]
    )
    last_xid = _gauge(
        PREFIX + "gpu_last_xid_code", "The code of the GPU's last XID error", ("gpu",)
    )
    for gpu in gpus:
        device, uuid = gpu.device, gpu.device.uuid
        info.add_metric(
            [uuid, str(device.index), device.name, "true" if device.mig else "false"], 1.0
        )
        total.add_metric([uuid], float(device.memory_total))
        healthy.add_metric([uuid], 1.0 if gpu.healthy else 0.0)
        xids.add_metric([uuid], float(gpu.xid_errors))
        if gpu.last_xid is not None:
            last_xid.add_metric([uuid], float(gpu.last_xid))
        status = gpu.status
        if status is None:
            continue
        for family, value in (
            (util, status.utilization),
            (used, status.memory_used),
            (temperature, status.temperature),
            (power, status.power),
        ):
            if value is not None:
                family.add_metric([uuid], float(value))
    yield from (info, util, used, total, temperature, power, healthy, xids, last_xid)


def _pod_families(scrape: Scrape) -> Iterator[Metric]:
    compute = _gauge(
        metrics.POD_COMPUTE,
        "Share of the GPU's SMs the container's processes used, averaged over the scrape window",
        POD_LABELS,
    )
    memory = _gauge(metrics.POD_MEMORY_USED, "GPU memory the container's processes use", POD_LABELS)
    other_compute = _gauge(
        metrics.GPU_UNATTRIBUTED_COMPUTE,
        "SM share used by processes charged to no pod, by source (host, mps-server, unknown)",
        ("gpu", "source"),
    )
    other_memory = _gauge(
        PREFIX + "gpu_unattributed_memory_used_bytes",
        "GPU memory used by processes charged to no pod, by source",
        ("gpu", "source"),
    )
    processes = _gauge(
        metrics.POD_GPU_PROCESSES,
        "The container's processes on the GPU, by whether they run with the memory shim "
        "(shim: loaded, missing, unknown); a pod whose gpupack.io/enforcement names memory "
        "should have none missing",
        (*POD_LABELS, "shim"),
    )
    using: set[tuple[str, str]] = set()
    used: dict[tuple[str, str, str], float] = {}  # SM share by (namespace, pod, gpu)
    for gpu in scrape.readings.gpus:
        uuid = gpu.device.uuid
        shims: dict[tuple[str, str, str, Shim], int] = {}
        in_pods, others = _by_owner(gpu, scrape.owners, scrape.pods, shims)
        for (namespace, pod, container, shim), count in sorted(shims.items()):
            processes.add_metric([namespace, pod, container, uuid, shim.value], float(count))
        for (namespace, pod, container), use in sorted(in_pods.items()):
            using.add((namespace, pod))
            labels = [namespace, pod, container, uuid]
            if use.compute is not None:
                compute.add_metric(labels, use.compute)
                used[(namespace, pod, uuid)] = used.get((namespace, pod, uuid), 0.0) + use.compute
            if use.memory is not None:
                memory.add_metric(labels, float(use.memory))
        for source, use in sorted(others.items()):
            if use.compute is not None:
                other_compute.add_metric([uuid, source.value], use.compute)
            if use.memory is not None:
                other_memory.add_metric([uuid, source.value], float(use.memory))
    yield from (compute, memory, processes, other_compute, other_memory)
    yield from _allocation_families(scrape, using, used)


def _allocation_families(
    scrape: Scrape, using: set[tuple[str, str]], used: Mapping[tuple[str, str, str], float]
) -> Iterator[Metric]:
    allocated_compute = _gauge(
        metrics.POD_COMPUTE_ALLOCATED,
        "Compute share gpupack allocated to the pod (gpupack.io/gpu-compute)",
        ALLOCATION_LABELS,
    )
    allocated_memory = _gauge(
        metrics.POD_MEMORY_ALLOCATED,
        "GPU memory gpupack allocated to the pod (gpupack.io/gpu-memory)",
        ALLOCATION_LABELS,
    )
    managed = _gauge(
        metrics.POD_MANAGED,
        "1 for a pod whose GPU share gpupack decides, 0 for a pod using a GPU outside gpupack",
        ("namespace", "pod"),
    )
    enforcement = _gauge(
        metrics.POD_ENFORCEMENT,
        "What holds the pod to its share (1), as its gpupack.io/enforcement says: "
        "accounting, mps, memory, mps,memory, memory,compute, memory,compute-cap",
        ("namespace", "pod", "enforcement"),
    )
    against_share = _gauge(
        metrics.POD_COMPUTE_SHARE,
        "GPU time the pod's processes used over its compute share (1: all of it; below 1 "
        "on a busy GPU: held back, or not asking for more)",
        ALLOCATION_LABELS,
    )
    holders = _gauge(
        metrics.GPU_CAPACITY_POD,
        "The capacity pod holding the GPU for gpupack's fractional pods (1)",
        ("gpu", "namespace", "pod"),
    )
    for pod in sorted(scrape.pods.values(), key=lambda p: (p.namespace, p.name)):
        if pod.phase not in LIVE_PHASES:
            continue
        if pod.capacity:
            if pod.gpu_uuid:
                holders.add_metric([pod.gpu_uuid, pod.namespace, pod.name], 1.0)
            continue
        key = (pod.namespace, pod.name)
        if pod.managed and pod.gpu_uuid:
            labels = [pod.namespace, pod.name, pod.gpu_uuid]
            if pod.compute is not None:
                allocated_compute.add_metric(labels, pod.compute / 1000)
                share = used.get((pod.namespace, pod.name, pod.gpu_uuid))
                if share is not None and pod.compute > 0:
                    against_share.add_metric(labels, share / (pod.compute / 1000))
            if pod.memory is not None:
                allocated_memory.add_metric(labels, float(pod.memory))
            if pod.enforcement:
                enforcement.add_metric([pod.namespace, pod.name, pod.enforcement], 1.0)
        if (pod.managed and pod.gpu_uuid) or key in using:
            managed.add_metric(list(key), 1.0 if pod.managed else 0.0)
    yield from (allocated_compute, allocated_memory, against_share, managed, enforcement, holders)


def _health_families(scrape: Scrape) -> Iterator[Metric]:
    health = scrape.health
    # NVML's state is the sampler's: a lost GPU is a problem Health logs, but NVML still
    # answers for the others (gpupack_gpu_healthy says which GPU).
    yield GaugeMetricFamily(
        PREFIX + "exporter_nvml_up",
        "1 when NVML answers",
        value=1.0 if scrape.readings.nvml_up else 0.0,
    )
    for source, name, doc in (
        (
            POD_RESOURCES,
            "exporter_pod_resources_up",
            "1 when the kubelet pod-resources API answers",
        ),
        (API, "exporter_api_up", "1 when the node's pod watch is synced with the API server"),
    ):
        yield GaugeMetricFamily(PREFIX + name, doc, value=1.0 if health.up.get(source) else 0.0)
    age = scrape.readings.sample_age
    yield GaugeMetricFamily(
        PREFIX + "exporter_last_sample_age_seconds",
        "Seconds since the last complete NVML sample (-1 before the first)",
        value=-1.0 if age is None else age,
    )
    yield GaugeMetricFamily(
        PREFIX + "exporter_window_seconds",
        "The window per-process compute is averaged over in this scrape",
        value=scrape.readings.window,
    )
    errors = CounterMetricFamily(
        PREFIX + "exporter_errors",
        "Failures by source (nvml, pod-resources, api)",
        labels=["source"],
    )
    for source in sorted(set(SOURCES) | set(health.errors)):
        errors.add_metric([source], float(health.errors.get(source, 0)))
    yield errors


def families(scrape: Scrape) -> list[Metric]:
    """Every metric family for one scrape."""
    return [*_gpu_families(scrape), *_pod_families(scrape), *_health_families(scrape)]


_EMPTY: Final = Scrape(Readings())


class ExporterCollector(Collector):
    """A prometheus_client collector: `collect()` builds fresh families on every scrape;
    `describe()` names them without taking a sample (used at registration)."""

    def __init__(self, scrape: Callable[[], Scrape]) -> None:
        self._scrape = scrape

    def describe(self) -> Iterator[Metric]:
        yield from families(_EMPTY)

    def collect(self) -> Iterator[Metric]:
        yield from families(self._scrape())
