"""A preview of the Grafana dashboard without Grafana: `docs/dashboard.png`.

Grafana cannot run where the docs are made, so this draws the dashboard's first rows
(packing, per pod, GPUs and exporters) with matplotlib. Titles, layout, units, legends,
line styles, thresholds and table columns come from the chart's dashboard JSON; the data
from a simulated cluster: half an hour of four H100s on two nodes, shared by up to twelve
fractional pods. Every 30 seconds of virtual time the simulation's readings and pods go
through the exporter's real collector and the scheduler's real metrics, and the
Prometheus text they write is parsed back, so every number carries a real metric name.
Each PromQL expression a drawn panel uses is evaluated by a hand-written Python
equivalent kept beside the expression's text; an expression without one stops the
script, so the preview cannot silently drift from the dashboard.

    python -m hack.dashboard_preview [--out docs/dashboard.png]

matplotlib is optional: pip install -e '.[docs]'.
"""

import argparse
import functools
import json
import math
import random
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cgroup import HOST, OwnerKind, ProcessOwner
from exporter.collector import ExporterCollector, Scrape
from exporter.health import API, NVML, POD_RESOURCES, HealthSnapshot
from exporter.pods import PodInfo
from exporter.readings import Device, DeviceStatus, GpuReading, ProcessUsage, Readings
from gpupack.capacity import capacity_name
from scheduler.metrics import Metrics, Usage

try:  # the docs extra
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator
    from PIL import Image
except ImportError:
    sys.exit("hack/dashboard_preview.py needs matplotlib: pip install -e '.[docs]'")

REPO: Final = Path(__file__).resolve().parents[1]
DASHBOARD: Final = REPO / "charts" / "gpupack" / "dashboards" / "gpupack.json"
OUT: Final = REPO / "docs" / "dashboard.png"
ROWS: Final = ("Packing", "Per pod", "GPUs and exporters")  # the rows drawn
NOTE: Final = (
    "Preview rendered by hack/dashboard_preview.py from the dashboard's panels with "
    "simulated exporter data; not a Grafana screenshot"
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


# --- PromQL, by hand ----------------------------------------------------------------

Vector = dict[Labels, float]
Evaluate = Callable[[Sequence[Frame], int], Vector]  # all frames, a step -> the result there


def key(labels: Mapping[str, str], names: Iterable[str]) -> Labels:
    return tuple(sorted((name, labels.get(name, "")) for name in names))


def series(frame: Frame, name: str, keep: Callable[[Sample], bool] = lambda _: True) -> Vector:
    """`name`, every label kept (`keep` filters, as a comparison does)."""
    return {key(s[0], s[0]): s[1] for s in frame.get(name, []) if keep(s)}


def aggregate(vector: Vector, names: Sequence[str], how: Callable[[list[float]], float]) -> Vector:
    """`how by (names) (vector)`."""
    groups: dict[Labels, list[float]] = {}
    for labels, value in vector.items():
        groups.setdefault(key(dict(labels), names), []).append(value)
    return {k: how(values) for k, values in groups.items()}


def count(vector: Vector) -> Vector:
    return {(): float(len(vector))} if vector else {}


def binary(a: Vector, b: Vector, op: Callable[[float, float], float | None]) -> Vector:
    """`a op b`, one-to-one on identical labels; None (a division by zero) drops a sample."""
    pairs = ((k, op(v, b[k])) for k, v in a.items() if k in b)
    return {k: v for k, v in pairs if v is not None}


def divide(a: float, b: float) -> float | None:
    return a / b if b else None


def where(vector: Vector, keep: Callable[[float], bool]) -> Vector:
    return {k: v for k, v in vector.items() if keep(v)}


def either(a: Vector, b: Vector) -> Vector:
    """`a or b`."""
    return {**b, **a}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def on_held(frame: Frame, name: str, keep: Callable[[Sample], bool] = lambda _: True) -> Vector:
    """`name and on (gpu) gpupack_gpu_capacity_pod`."""
    gpus = {labels["gpu"] for labels, _ in frame.get("gpupack_gpu_capacity_pod", [])}
    return series(frame, name, lambda s: s[0]["gpu"] in gpus and keep(s))


def on_leader(frame: Frame, name: str) -> Vector:
    """`name and on (instance) gpupack_scheduler_leader == 1`."""
    leaders = {labels["instance"] for labels, v in frame.get("gpupack_scheduler_leader", []) if v}
    return series(frame, name, lambda s: s[0]["instance"] in leaders)


def over_time(frames: Sequence[Frame], name: str, how: Callable[[list[float]], float]) -> Vector:
    """`<how>_over_time(name[range])` over all of `frames`."""
    seen: dict[Labels, list[float]] = {}
    for frame in frames:
        for labels, value in series(frame, name).items():
            seen.setdefault(labels, []).append(value)
    return {labels: how(values) for labels, values in seen.items()}


def rate(frames: Sequence[Frame], i: int, name: str) -> Vector:
    """`rate(name[5m])`, without Prometheus's extrapolation at the window's edges."""
    back = max(0, i - 300 // STEP)
    before, now = series(frames[back], name), series(frames[i], name)
    return {k: (v - before.get(k, v)) / max(STEP, (i - back) * STEP) for k, v in now.items()}


NS: Final = '{namespace=~"$namespace"}'
LEADER: Final = "and on (instance) gpupack_scheduler_leader == 1"
HELD: Final = "count(gpupack_gpu_capacity_pod)"
ASKED: Final = "count(gpupack_pod_gpu_compute_allocated_ratio)"
POD: Final = ("namespace", "pod")


def held_now(f: Sequence[Frame], i: int) -> Vector:
    return count(series(f[i], "gpupack_gpu_capacity_pod"))


def asked_now(f: Sequence[Frame], i: int) -> Vector:
    return count(series(f[i], "gpupack_pod_gpu_compute_allocated_ratio"))


def by_pod(name: str) -> Evaluate:
    return lambda f, i: aggregate(series(f[i], name), POD, sum)


def over(used: str, allocated: str) -> tuple[str, Evaluate]:
    """Pods over their allocation now."""
    expr = f"sum by (namespace, pod) ({used}{NS}) / sum by (namespace, pod) ({allocated}{NS}) > 1"
    return expr, lambda f, i: where(
        binary(by_pod(used)(f, i), by_pod(allocated)(f, i), divide), lambda v: v > 1
    )


def under(used: str, allocated: str, how: str) -> tuple[str, Evaluate]:
    """Pods under a quarter of their allocation over the dashboard's range."""
    expr = (
        f"(sum by (namespace, pod) ({how}_over_time({used}{NS}[$__range])) "
        f"or 0 * sum by (namespace, pod) ({allocated}{NS})) "
        f"/ sum by (namespace, pod) ({allocated}{NS}) < 0.25"
    )

    def evaluate(f: Sequence[Frame], i: int) -> Vector:
        reduce = mean if how == "avg" else max
        use = aggregate(over_time(f[: i + 1], used, reduce), POD, sum)
        allocation = by_pod(allocated)(f, i)
        idle = dict.fromkeys(allocation, 0.0)
        return where(binary(either(use, idle), allocation, divide), lambda v: v < 0.25)

    return expr, evaluate


def health(name: str) -> tuple[str, Evaluate]:
    return f"max by (instance) ({name})", lambda f, i: aggregate(
        series(f[i], name), ["instance"], max
    )


def problems(f: Sequence[Frame], i: int) -> Vector:
    nvml, kubelet, api = (
        series(f[i], f"gpupack_exporter_{name}_up") for name in ("nvml", "pod_resources", "api")
    )
    product = binary(binary(nvml, kubelet, float.__mul__), api, float.__mul__)
    return either(count(where(product, lambda v: v == 0)), {(): 0.0})


def utilization_by_index(f: Sequence[Frame], i: int) -> Vector:
    index = {(s[0]["instance"], s[0]["gpu"]): s[0]["index"] for s in f[i]["gpupack_gpu_info"]}
    return {
        (*key(labels, ("gpu", "instance")), ("index", index[labels["instance"], labels["gpu"]])): v
        for labels, v in f[i]["gpupack_gpu_utilization_ratio"]
    }


def leader_sum(name: str) -> tuple[str, Evaluate]:
    return f"sum({name} {LEADER})", lambda f, i: aggregate(on_leader(f[i], name), (), sum)


def sm_use(f: Sequence[Frame], i: int) -> Vector:
    return aggregate(on_held(f[i], "gpupack_gpu_utilization_ratio"), (), mean)


def allocated(f: Sequence[Frame], i: int) -> Vector:
    return aggregate(on_leader(f[i], "gpupack_scheduler_allocated_compute_ratio"), (), max)


# Every expression a drawn panel uses, and what it evaluates to here.
CU, CA = "gpupack_pod_gpu_compute_ratio", "gpupack_pod_gpu_compute_allocated_ratio"
MU, MA = "gpupack_pod_gpu_memory_used_bytes", "gpupack_pod_gpu_memory_allocated_bytes"
EVALUATIONS: Final[dict[str, Evaluate]] = dict(
    [
        (HELD, held_now),
        (ASKED, asked_now),
        (f"{ASKED} - {HELD}", lambda f, i: binary(asked_now(f, i), held_now(f, i), float.__sub__)),
        (f"{ASKED} / {HELD}", lambda f, i: binary(asked_now(f, i), held_now(f, i), divide)),
        (f"max(gpupack_scheduler_allocated_compute_ratio {LEADER})", allocated),
        ("avg(gpupack_gpu_utilization_ratio and on (gpu) gpupack_gpu_capacity_pod)", sm_use),
        (
            "count(gpupack_gpu_utilization_ratio > 0.05 and on (gpu) gpupack_gpu_capacity_pod)",
            lambda f, i: count(
                on_held(f[i], "gpupack_gpu_utilization_ratio", lambda s: s[1] > 0.05)
            ),
        ),
        leader_sum("gpupack_scheduler_gpus_in_use"),
        leader_sum("gpupack_scheduler_gpus_coming"),
        *((f"sum by (namespace, pod) ({name}{NS})", by_pod(name)) for name in (CU, CA, MU, MA)),
        over(CU, CA),
        over(MU, MA),
        under(CU, CA, "avg"),
        under(MU, MA, "max"),
        (
            "count((gpupack_exporter_nvml_up * gpupack_exporter_pod_resources_up * "
            "gpupack_exporter_api_up) == 0) or vector(0)",
            problems,
        ),
        (
            "count(gpupack_gpu_healthy == 0) or vector(0)",
            lambda f, i: either(
                count(series(f[i], "gpupack_gpu_healthy", lambda s: s[1] == 0)), {(): 0.0}
            ),
        ),
        *(
            health(f"gpupack_exporter_{name}")
            for name in ("nvml_up", "pod_resources_up", "api_up", "last_sample_age_seconds")
        ),
        (
            "sum by (instance, source) (rate(gpupack_exporter_errors_total[5m]))",
            lambda f, i: aggregate(
                rate(f, i, "gpupack_exporter_errors_total"), ("instance", "source"), sum
            ),
        ),
        (
            "gpupack_gpu_utilization_ratio * on (instance, gpu) group_left (index) "
            "gpupack_gpu_info",
            utilization_by_index,
        ),
        (
            "sum by (source) (gpupack_gpu_unattributed_compute_ratio)",
            lambda f, i: aggregate(
                series(f[i], "gpupack_gpu_unattributed_compute_ratio"), ["source"], sum
            ),
        ),
    ]
)


# --- The dashboard's panels, evaluated ----------------------------------------------

JSON = dict[str, Any]
Results = dict[str, dict[Labels, list[float | None]]]  # refId -> labels -> value per step


def drawn_panels(dashboard: JSON) -> list[JSON]:
    """The panels of the rows in ROWS, top to bottom."""
    row, drawn = "", []
    for panel in sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        row = panel["title"] if panel["type"] == "row" else row
        if row in ROWS:
            drawn.append(panel)
    return drawn


def evaluate(panel: JSON, frames: Sequence[Frame]) -> Results:
    results: Results = {}
    for target in panel["targets"]:
        run = EVALUATIONS.get(target["expr"])
        if run is None:
            sys.exit(
                f"panel {panel['title']!r}, query {target['refId']}: no evaluation here for\n"
                f"  {target['expr']}\nadd one to EVALUATIONS in hack/dashboard_preview.py"
            )
        values: dict[Labels, list[float | None]] = {}
        for step in range(len(frames)):
            for labels, value in run(frames, step).items():
                values.setdefault(labels, [None] * len(frames))[step] = value
        results[target["refId"]] = values
    return results


# --- Drawing ------------------------------------------------------------------------

WIDTH: Final = 1600  # pixels; Grafana's grid is 24 columns wide
UNIT: Final = 30  # pixels per grid row
GAP: Final = 6
HEADER: Final = 78
FOOTER: Final = 30
BACKGROUND, PANEL, HEADING, BORDER = "#111217", "#181b1f", "#22252b", "#2c3235"
TEXT, MUTED = "#ccccdc", "#8e8e99"
NAMED: Final = {"green": "#73BF69", "red": "#F2495C", "orange": "#FF9830", "blue": "#5794F2"}
PALETTE: Final = (
    "#73BF69", "#F2CC0C", "#5794F2", "#FF780A", "#F2495C", "#B877D9", "#4FC3C7",
    "#FF7EB6", "#C0D8FF", "#CDDC39", "#C8A27A", "#E6E6E6", "#37872D", "#8F3BB8",
)  # fmt: skip
MINUTES: Final = [step * STEP / 60 for step in range(STEPS)]


@dataclass(frozen=True, slots=True)
class Box:
    """A rectangle in pixels from the figure's top left, as Grafana lays panels out."""

    left: float
    top: float
    width: float
    height: float


class Canvas:
    """A figure addressed in pixels from the top left."""

    def __init__(self, height: float) -> None:
        self.height = height
        self.figure = Figure(figsize=(WIDTH / 100, height / 100), dpi=100, facecolor=BACKGROUND)

    def x(self, px: float) -> float:
        return px / WIDTH

    def y(self, py: float) -> float:
        return 1 - py / self.height

    def text(self, x: float, y: float, text: str, **style: Any) -> None:
        self.figure.text(
            self.x(x), self.y(y), text, **{"color": TEXT, "fontsize": 9, "va": "top", **style}
        )

    def rect(self, box: Box, color: str = PANEL, edge: str = BORDER) -> None:
        corner = (self.x(box.left), self.y(box.top + box.height))
        size = (box.width / WIDTH, box.height / self.height)
        transform = self.figure.transFigure
        self.figure.add_artist(
            Rectangle(
                corner, *size, transform=transform, facecolor=color, edgecolor=edge, zorder=-1
            )
        )

    def line(self, left: float, right: float, y: float) -> None:
        xs, ys = [self.x(left), self.x(right)], [self.y(y), self.y(y)]
        self.figure.add_artist(
            Line2D(xs, ys, transform=self.figure.transFigure, color=BORDER, linewidth=0.6)
        )

    def axes(self, box: Box) -> Axes:
        ax = self.figure.add_axes(
            (
                self.x(box.left),
                self.y(box.top + box.height),
                box.width / WIDTH,
                box.height / self.height,
            )
        )
        ax.set_facecolor(PANEL)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.tick_params(colors=MUTED, labelsize=7.5, length=0, pad=3)
        return ax


def fmt(value: float, unit: str, decimals: int | None = None) -> str:
    """A value as Grafana writes it in `unit`."""
    if unit == "percentunit":
        value *= 100
        auto = 0 if value == 0 or abs(value) >= 10 else 1
        return f"{value:.{auto if decimals is None else decimals}f}%"
    if unit == "bytes":
        size, suffix = next(
            (s for s in ((GIB, "GiB"), (1 << 20, "MiB")) if abs(value) >= s[0]), (1, "B")
        )
        auto = 0 if abs(value) / size >= 10 or size == 1 else 1
        return f"{value / size:.{auto if decimals is None else decimals}f} {suffix}"
    suffix = {"s": " s", "cps": " c/s", "ops": " ops/s"}.get(unit, "")
    if decimals is not None:
        return f"{value:.{decimals}f}{suffix}"
    return f"{value:.0f}{suffix}" if float(value).is_integer() else f"{value:.3g}{suffix}"


def override(panel: JSON, matcher: str, name: str) -> dict[str, Any]:
    """The properties of a panel's overrides for `matcher` (byFrameRefID, byName) `name`."""
    found: dict[str, Any] = {}
    for entry in panel["fieldConfig"].get("overrides", ()):
        if entry["matcher"] == {"id": matcher, "options": name}:
            found.update({p["id"]: p["value"] for p in entry["properties"]})
    return found


def value_axis(ax: Axes, unit: str, low: float | None, high: float | None) -> None:
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v, unit)))
    bottom, top = ax.get_ylim()
    if unit == "bytes":  # whole GiB steps
        step = next(s for s in (1, 2, 5, 10, 20, 40, 80) if top / (s * GIB) <= 5)
        ax.yaxis.set_major_locator(MultipleLocator(step * GIB))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(5, integer=unit == "short"))
    ax.set_ylim(bottom if low is None else low, top * 1.08 if high is None else high)


def time_axis(ax: Axes) -> None:
    ticks = list(range(0, int(MINUTES[-1]) + 1, 5))
    ax.set_xticks(ticks, [f"{START + timedelta(minutes=m):%H:%M}" for m in ticks])
    ax.set_xlim(MINUTES[0], MINUTES[-1])
    ax.grid(visible=True, color=BORDER, linewidth=0.6)


def common_words(texts: list[str]) -> str:
    """What one series' legends share: "ml/trainer-0" of "ml/trainer-0 used", "... allocated"."""
    shared = []
    for words in zip(*(t.split() for t in texts), strict=False):
        if len(set(words)) > 1:
            break
        shared.append(words[0])
    return " ".join(shared)


def draw_timeseries(canvas: Canvas, panel: JSON, box: Box, results: Results) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    templates = {t["refId"]: t["legendFormat"] for t in panel["targets"]}
    colors: dict[Labels | str, str] = {}  # by labels: a pod's used and allocated share one
    names: dict[Labels | str, list[str]] = {}
    for ref, lines in results.items():
        for labels in sorted(lines):
            colors.setdefault(labels or ref, PALETTE[len(colors) % len(PALETTE)])
            text = templates[ref]
            for label, value in labels:
                text = text.replace("{{" + label + "}}", value)
            names.setdefault(labels or ref, []).append(text)
    paired = any(len(texts) > 1 for texts in names.values())
    handles = [Line2D([], [], color=colors[k], linewidth=2) for k in names]
    texts = [common_words(t) if paired else t[0] for t in names.values()]
    if paired:  # then a key to the line styles: "— used", "- - allocated"
        example = next(t for t in names.values() if len(t) > 1)
        for ref, text in zip(results, example, strict=False):
            dashed = "custom.lineStyle" in override(panel, "byFrameRefID", ref)
            handles.append(Line2D([], [], color=MUTED, linestyle="--" if dashed else "-"))
            texts.append(text.removeprefix(common_words(example)).strip())
    per_row = max(1, min(len(texts), int((box.width - 12) // (6.2 * max(map(len, texts)) + 40))))
    legend_height = 8 + 14 * math.ceil(len(texts) / per_row)
    ax = canvas.axes(
        Box(box.left + 52, box.top + 30, box.width - 64, box.height - 52 - legend_height)
    )
    for ref, lines in results.items():
        dashed = "custom.lineStyle" in override(panel, "byFrameRefID", ref)
        for labels, values in lines.items():
            ys = [math.nan if v is None else v for v in values]
            style = "--" if dashed else "-"
            ax.plot(MINUTES, ys, color=colors[labels or ref], linewidth=1.6, linestyle=style)
    time_axis(ax)
    value_axis(ax, defaults["unit"], defaults.get("min"), defaults.get("max"))
    canvas.figure.legend(
        handles,
        texts,
        loc="upper left",
        bbox_to_anchor=(canvas.x(box.left + 6), canvas.y(box.top + box.height - legend_height)),
        bbox_transform=canvas.figure.transFigure,
        ncol=per_row,
        frameon=False,
        fontsize=7.5,
        labelcolor=TEXT,
        handlelength=1.8,
        columnspacing=1.4,
        borderaxespad=0,
        borderpad=0,
        labelspacing=0.35,
    )


def threshold_color(defaults: JSON, value: float) -> str:
    color = NAMED["blue"]
    for step in defaults.get("thresholds", {}).get("steps", ()):
        if step["value"] is None or value >= step["value"]:
            color = NAMED.get(step["color"], step["color"])
    return color


def draw_stat(canvas: Canvas, panel: JSON, box: Box, results: Results) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    (values,) = results["A"].values()
    ys = [math.nan if v is None else v for v in values]
    present = [v for v in values if v is not None]
    last = present[-1]
    color = threshold_color(defaults, last)
    spark = canvas.axes(
        Box(box.left + 1, box.top + box.height * 0.62, box.width - 2, box.height * 0.38 - 1)
    )
    spark.fill_between(MINUTES, ys, color=color, alpha=0.18, linewidth=0)
    spark.plot(MINUTES, ys, color=color, linewidth=1.2, alpha=0.8)
    spark.set_xlim(MINUTES[0], MINUTES[-1])
    spark.set_ylim(min(0.0, *present), max(present) * 1.15 or 1)
    spark.set_axis_off()
    text = fmt(last, defaults["unit"], defaults.get("decimals"))
    middle = box.left + box.width / 2
    canvas.text(
        middle,
        box.top + box.height * 0.45,
        text,
        fontsize=25,
        weight="bold",
        color=color,
        ha="center",
        va="center",
    )


def cell(panel: JSON, column: str, value: float | None) -> tuple[str, str]:
    """A table cell's text and colour: value mappings first, then the column's unit."""
    if value is None:
        return "", TEXT
    defaults, props = panel["fieldConfig"]["defaults"], override(panel, "byName", column)
    for mapping in props.get("mappings", ()):
        if (option := mapping["options"].get(f"{value:g}")) is not None:
            return option["text"], NAMED.get(option["color"], option["color"])
    text = fmt(value, props.get("unit", defaults["unit"]), props.get("decimals"))
    fixed = defaults.get("color", {}).get("fixedColor")  # with cellOptions "color-text"
    return text, NAMED.get(fixed, fixed) if fixed else TEXT


def draw_table(canvas: Canvas, panel: JSON, box: Box, results: Results) -> None:
    rename: dict[str, str] = {}
    for transformation in panel.get("transformations", ()):
        if transformation["id"] == "organize":
            rename = transformation["options"].get("renameByName", {})
    merged: dict[Labels, dict[str, float]] = {}  # the "merge" transformation, at the last step
    for ref, lines in results.items():
        for labels, values in lines.items():
            if values[-1] is not None:
                merged.setdefault(labels, {})[rename.get(f"Value #{ref}", ref)] = values[-1]
    label_columns = sorted({name for labels in merged for name, _ in labels})
    value_columns = [rename.get(f"Value #{t['refId']}", t["refId"]) for t in panel["targets"]]
    rows = sorted(merged.items())
    for sort in panel["options"].get("sortBy", ()):
        rows.sort(key=lambda row: row[1].get(sort["displayName"], -math.inf), reverse=sort["desc"])
    table = [
        [(dict(labels)[name], TEXT) for name in label_columns]
        + [cell(panel, name, values.get(name)) for name in value_columns]
        for labels, values in rows
    ]
    headers = label_columns + value_columns
    widths = [max([len(h)] + [len(row[n][0]) for row in table]) + 3 for n, h in enumerate(headers)]
    x, top = box.left + 12, box.top + 34
    canvas.rect(Box(box.left + 1, top - 6, box.width - 2, 24), color=HEADING, edge="none")
    for n, header in enumerate(headers):
        canvas.text(x, top, header, fontsize=8.5, color=NAMED["blue"], weight="bold")
        for r, row in enumerate(table):
            canvas.text(x, top + 26 + 21 * r, row[n][0], fontsize=8.5, color=row[n][1])
        x += widths[n] * (box.width - 24) / sum(widths)
    for r in range(len(table)):
        canvas.line(box.left + 1, box.left + box.width - 1, top + 21 + 21 * r)
    if not table:
        canvas.text(
            box.left + box.width / 2, box.top + box.height / 2, "No data", color=MUTED, ha="center"
        )


def clip(title: str, width: float) -> str:
    """A title too long for its panel is cut, as Grafana does."""
    fits = int(width // 7.2)  # characters at 9.5 points, bold
    return title if len(title) <= fits else title[: fits - 1].rstrip() + "\u2026"


def draw_header(canvas: Canvas, dashboard: JSON) -> None:
    canvas.text(GAP + 4, 12, f"\u2630  {dashboard['title']}", fontsize=14, weight="bold")
    end = START + timedelta(seconds=STEP * (STEPS - 1))
    when = f"\u25f7 {START:%H:%M} to {end:%H:%M}   \u27f3 {dashboard['refresh']}"
    canvas.text(WIDTH - GAP - 4, 14, when, color=MUTED, ha="right")
    x = GAP + 6.0
    for variable in dashboard["templating"]["list"]:
        label = variable.get("label", variable["name"])
        value = "Prometheus" if variable["type"] == "datasource" else "All"
        for text, width, color in (
            (label, 7.5 * len(label) + 14, HEADING),
            (f"{value}  \u25be", 7 * len(value) + 30, BACKGROUND),
        ):
            canvas.rect(Box(x, 42, width, 24), color=color)
            canvas.text(
                x + 7,
                54,
                text,
                fontsize=8.5,
                va="center",
                color=NAMED["blue"] if color == HEADING else TEXT,
            )
            x += width
        x += 12
    shown = f"Rows shown: {', '.join(ROWS)}; the Scheduler and Webhook rows follow"
    canvas.text(WIDTH - GAP - 4, 54, shown, fontsize=8, color=MUTED, ha="right", va="center")


DRAW: Final = {"timeseries": draw_timeseries, "stat": draw_stat, "table": draw_table}


def draw(dashboard: JSON, frames: Sequence[Frame], out: Path) -> None:
    panels = drawn_panels(dashboard)
    first = min(p["gridPos"]["y"] for p in panels)
    last = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    canvas = Canvas(HEADER + (last - first) * UNIT + GAP + FOOTER)
    draw_header(canvas, dashboard)
    column = (WIDTH - GAP) / 24
    for panel in panels:
        pos = panel["gridPos"]
        box = Box(
            pos["x"] * column + GAP,
            HEADER + (pos["y"] - first) * UNIT + GAP,
            pos["w"] * column - GAP,
            pos["h"] * UNIT - GAP,
        )
        if panel["type"] == "row":
            canvas.text(
                box.left + 2, box.top + 4, f"\u25be {panel['title']}", fontsize=11, weight="bold"
            )
            continue
        canvas.rect(box)
        canvas.text(
            box.left + 10,
            box.top + 8,
            clip(panel["title"], box.width - 20),
            fontsize=9.5,
            weight="bold",
        )
        DRAW[panel["type"]](canvas, panel, box, evaluate(panel, frames))
    canvas.text(
        WIDTH / 2,
        canvas.height - FOOTER / 2,
        NOTE,
        fontsize=8,
        color=MUTED,
        ha="center",
        va="center",
    )
    canvas.figure.savefig(out, dpi=100, facecolor=BACKGROUND)
    with Image.open(out) as image:  # a palette PNG: the same look at a fraction of the size
        small = image.convert("RGB").quantize(
            96, Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
        )
    small.save(out, optimize=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Draw docs/dashboard.png: a preview of the Grafana dashboard."
    )
    parser.add_argument(
        "--out", type=Path, default=OUT, help="the PNG to write (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    draw(json.loads(DASHBOARD.read_text()), simulate(), args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
