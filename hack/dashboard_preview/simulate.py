"""The simulated cluster: half an hour of four H100s on two nodes, scraped through the
exporter's real collector and the scheduler's real metrics every 30 s of virtual time."""

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cgroup import HOST, OwnerKind, ProcessOwner
from exporter.collector import ExporterCollector, Scrape
from exporter.health import API, NVML, POD_RESOURCES, HealthSnapshot
from exporter.pods import PodInfo
from exporter.readings import Device, DeviceStatus, GpuReading, ProcessUsage, Readings
from gpupack.capacity import capacity_name
from scheduler.metrics import Metrics, Usage

REPO: Final = Path(__file__).resolve().parents[2]
DASHBOARD: Final = REPO / "charts" / "gpupack" / "dashboards" / "gpupack.json"
OUT: Final = REPO / "docs" / "dashboard.png"
ROWS: Final = ("Packing", "Per pod", "GPUs and exporters")  # the rows drawn
NOTE: Final = (
    "Preview rendered by hack/dashboard_preview: each panel's PromQL answered by Prometheus "
    "over simulated exporter data; not a Grafana screenshot"
)
STEP: Final = 30  # seconds of virtual time between scrapes
STEPS: Final = 61  # half an hour, both ends included
START: Final = datetime(2025, 1, 1, 14, 0)
GIB: Final = 1 << 30

# --- The simulated cluster ----------------------------------------------------------

Profile = Callable[[float, random.Random], tuple[float, float]]  # minute -> SM ratio, GiB


@dataclass(frozen=True, slots=True)
class SimPod:
    namespace: str
    name: str
    compute: int  # allocated millis
    memory: int  # allocated GiB
    gpu: int  # index into GPUS
    profile: Profile
    start: float = 0.0  # minute it is bound and running
    end: float = math.inf  # minute it finishes

    def running(self, minute: float) -> bool:
        return self.start <= minute < self.end


def serving(base: float, swing: float, phase: float, memory: float) -> Profile:
    def profile(minute: float, rng: random.Random) -> tuple[float, float]:
        wave = swing * math.sin(minute / 4 + phase)
        return max(0.0, base + wave + rng.gauss(0, 0.02)), memory + rng.gauss(0, 0.2)

    return profile


def steady(level: float, memory: float, loading_until: float = 0.0) -> Profile:
    def profile(minute: float, rng: random.Random) -> tuple[float, float]:
        if minute < loading_until:  # reading its data: some memory, no kernels yet
            return 0.0, memory / 3
        return max(0.0, level + rng.gauss(0, 0.015)), memory

    return profile


def notebook(busy: tuple[float, float], memory: float) -> Profile:
    def profile(minute: float, rng: random.Random) -> tuple[float, float]:
        working = busy[0] <= minute < busy[1]
        return (0.12 if working else 0.0) + abs(rng.gauss(0, 0.004)), memory

    return profile


INSTANCES: Final = ("gpu-node-a:9400", "gpu-node-b:9400")  # GPUs 0-1 and 2-3
GPUS: Final = tuple(
    Device(
        i % 2, f"GPU-5e7c{i}a40-1f3b-4c2d-9e8f-00000000000{i}", "NVIDIA H100 80GB HBM3", 80 * GIB
    )
    for i in range(4)
)
GPU3_ASKED: Final = 11.0  # three pods fit nowhere: a capacity pod is created
GPU3_HELD: Final = 12.5  # it holds GPU 3; the pods are bound at 13
GPU3_EMPTY: Final = 25.0  # they finish
GPU3_RELEASED: Final = 27.5  # the empty capacity pod is deleted
API_OUTAGE: Final = (18.0, 19.5)  # gpu-node-b's pod watch loses the API server
PODS: Final = (
    SimPod("ml", "chat-api-6c9f-x2kqp", 400, 24, 0, serving(0.27, 0.09, 0.0, 21)),
    SimPod("ml", "chat-api-6c9f-q8wzn", 400, 24, 0, serving(0.25, 0.09, 1.8, 21)),
    SimPod("notebooks", "alice-0", 200, 16, 0, notebook((7.0, 9.5), 3.2)),
    SimPod("ml", "trainer-0", 600, 40, 1, steady(0.68, 38)),  # over its compute
    SimPod("ml", "embedder-7b4d-m2c7r", 250, 12, 1, serving(0.15, 0.04, 0.7, 9)),
    SimPod("notebooks", "bob-0", 150, 8, 1, notebook((21.0, 22.0), 1.4)),
    SimPod("research", "sweep-3", 300, 16, 2, steady(0.24, 13)),
    SimPod("research", "sweep-7", 300, 16, 2, steady(0.27, 13), end=24.0),
    SimPod("ml", "reranker-5f6b-t9vvd", 300, 10, 2, serving(0.10, 0.04, 2.5, 11.5)),  # memory
    *(
        SimPod("research", f"sweep-{n}", 300, 16, 3, steady(0.25, 13, 14.5), 13.0, GPU3_EMPTY)
        for n in (11, 12, 13)
    ),
)


def held(gpu: int, minute: float) -> bool:
    return gpu < 3 or GPU3_HELD <= minute < GPU3_RELEASED


def has_capacity_pod(gpu: int, minute: float) -> bool:
    return gpu < 3 or GPU3_ASKED <= minute < GPU3_RELEASED


def scrapes(minute: float, rng: random.Random, errors: dict[str, int]) -> dict[str, Scrape]:
    """What each node's exporter sees at `minute`, by instance."""
    pods: list[PodInfo] = []
    owners: dict[int, ProcessOwner] = {999: HOST}  # a host process: a profiler on GPU 1
    processes: list[list[ProcessUsage]] = [[] for _ in GPUS]
    processes[1].append(ProcessUsage(999, 600 << 20, 0.01 + abs(rng.gauss(0, 0.003))))
    if 24.0 <= minute < 25.0:  # sweep-7's processes exited before they could be read
        processes[2].append(ProcessUsage(998, 2 * GIB, 0.05))
    for pid, pod in enumerate(PODS, start=1000):
        if not pod.running(minute):
            continue
        uid, container = f"uid-{pod.name}", f"{pid:064x}"
        pods.append(
            PodInfo(
                uid=uid,
                namespace=pod.namespace,
                name=pod.name,
                containers=MappingProxyType({container: "main"}),
                managed=True,
                compute=pod.compute,
                memory=pod.memory * GIB,
                gpu_uuid=GPUS[pod.gpu].uuid,
                phase="Running",
            )
        )
        owners[pid] = ProcessOwner(OwnerKind.POD, uid, container)
        compute, memory = pod.profile(minute, rng)
        processes[pod.gpu].append(ProcessUsage(pid, int(memory * GIB), compute))
    for i, gpu in enumerate(GPUS):
        if has_capacity_pod(i, minute):
            name, holding = capacity_name("h100-80gb", i), held(i, minute)
            pods.append(
                PodInfo(
                    uid=f"uid-{name}",
                    namespace="gpupack-system",
                    name=name,
                    containers=MappingProxyType({}),
                    managed=False,
                    gpu_uuid=gpu.uuid if holding else None,  # pending: no GPU yet
                    capacity=True,
                    phase="Running" if holding else "Pending",
                )
            )
    api_down = API_OUTAGE[0] <= minute < API_OUTAGE[1]
    errors[INSTANCES[1]] += api_down
    result: dict[str, Scrape] = {}
    for node, instance in enumerate(INSTANCES):
        gpus = []
        for i in (2 * node, 2 * node + 1):
            sm = sum(p.compute or 0.0 for p in processes[i])
            status = DeviceStatus(
                utilization=min(1.0, 1.1 * sm),  # a kernel running: more than its SM share
                memory_used=sum(p.memory or 0 for p in processes[i]) + (512 << 20),
                temperature=38 + 30 * sm,
                power=90 + 500 * sm,
            )
            gpus.append(GpuReading(GPUS[i], status, healthy=True, processes=tuple(processes[i])))
        mine = {g.uuid for g in GPUS[2 * node : 2 * node + 2]}
        up = not (api_down and node == 1)
        result[instance] = Scrape(
            Readings(tuple(gpus), nvml_up=True, sample_age=0.4, window=float(STEP)),
            owners=owners,
            pods={p.uid: p for p in pods if p.gpu_uuid in mine or (not p.gpu_uuid and node == 1)},
            health=HealthSnapshot(
                {NVML: True, POD_RESOURCES: True, API: up},
                {NVML: 0, POD_RESOURCES: 0, API: errors[instance]},
                {},
            ),
        )
    return result


def usage(minute: float) -> Usage:
    """The scheduler's view at `minute`."""
    running = [p for p in PODS if p.running(minute)]
    return Usage(
        gpus_held=sum(held(i, minute) for i in range(len(GPUS))),
        gpus_coming=sum(
            has_capacity_pod(i, minute) and not held(i, minute) for i in range(len(GPUS))
        ),
        gpus_in_use=len({p.gpu for p in running}),
        compute_allocated=sum(p.compute for p in running),
        pending_pods=sum(GPU3_ASKED <= minute < p.start for p in PODS),
        leader=True,
    )


# --- Scraping: Prometheus text, parsed back -----------------------------------------

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Sample = tuple[dict[str, str], float]
Frame = dict[str, list[Sample]]  # metric name -> samples: one scrape of every target


def parse(text: str, instance: str, frame: Frame) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, "instance": instance}
            frame.setdefault(sample.name, []).append((labels, sample.value))


@dataclass(slots=True)
class Now:
    """The virtual clock, and what each exporter sees at it."""

    minute: float = 0.0
    scrapes: dict[str, Scrape] = field(default_factory=dict)

    def scrape(self, instance: str) -> Scrape:
        return self.scrapes[instance]


def simulate() -> list[Frame]:
    rng = random.Random(7)  # noqa: S311 - made-up data, the same on every run
    errors = dict.fromkeys(INSTANCES, 0)
    now = Now()
    scheduler = CollectorRegistry()
    Metrics(scheduler, lambda: usage(now.minute))
    exporters = {instance: CollectorRegistry() for instance in INSTANCES}
    for instance, registry in exporters.items():
        registry.register(ExporterCollector(functools.partial(now.scrape, instance)))
    frames: list[Frame] = []
    for step in range(STEPS):
        now.minute = step * STEP / 60
        now.scrapes = scrapes(now.minute, rng, errors)
        frame: Frame = {}
        for instance, registry in exporters.items():
            parse(generate_latest(registry).decode(), instance, frame)
        parse(generate_latest(scheduler).decode(), "gpupack-scheduler:9090", frame)
        frames.append(frame)
    return frames
