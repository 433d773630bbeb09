"""Scrape time and resident memory of the exporter on a busy node, against bare exposition.

Measured: what a Prometheus scrape of /metrics runs, in full. That is
`exporter.exposition.text(registry)` (the server's writer; byte-for-byte what
`generate_latest` writes) on a registry that holds `ExporterCollector(agent.scrape)`,
with the real code under the agent:

- a `Sampler` over the fake NVML reader (`FakeReader.typical`): `--gpus` H100s, each
  with `--processes` compute processes, a tenth of them idle;
- a `ProcessTable` over a fake /proc in a temporary directory: `stat` and `cgroup` for
  every process, cgroup v2, systemd driver, containerd;
- a `PodMap` over the `Informer` that `exporter.agent.node_pods` builds. Its list returns
  the node's pods. Its watch stays open and sends nothing.

The node: every GPU process is its own container. Pods of `--containers` containers
(default 4, say an inference server with several model workers) share one GPU. Each
pod carries gpupack's annotations (compute, memory, GPU UUID, decision), and one
capacity pod in gpupack-system holds each GPU. The defaults give 8 GPUs x 64 processes:
512 processes in 128 pods (16 per GPU), plus 8 capacity pods.

Before measuring, the sampler ticks through its 60 s maximum window. Between scrapes it
ticks `--interval` more times (one simulated second each, outside the timed region), so
each scrape averages a real window over a full history.

Baseline, measured in the same run: the same series (same names, labels and values) as
ordinary prometheus_client Gauges, set once and exposed with `generate_latest`. That is
what bare exposition of that many series costs. It is built from the last warm-up
scrape, and each timed round scrapes ours, then the baseline, so drift on a busy
machine hits both alike. `ratio` is ours divided by the baseline, at p50: what
rebuilding everything on each scrape costs on top of it. Target: <= 20 ms per scrape,
with p50 and p99 both reported against it. The garbage collector stays on, as in the
exporter, and what start-up made is frozen out of it (`shell.settle_heap`), as there.

Also reported:
- one sampler tick (`sample_once`, which runs once a second in the background), for
  information;
- resident memory: RSS just after importing what the exporter binary imports; VmRSS
  after the warm-up scrapes, before the baseline is built (the exporter's steady state:
  full history, warm caches); VmRSS and VmHWM after the run, which include the
  baseline's Gauges.

The fake /proc is plain files in a temporary directory. Reading the real
/proc/<pid>/stat costs the kernel more, so on a node `Agent.scrape` reads PID owners
somewhat slower than it does here.

With `--nvml real` the sampler reads this machine's GPUs through `PynvmlReader`, each with
`--processes` real CUDA processes of 256 MiB (`doubles.cuda_worker`; one in 8
spins on every SM), and the fake /proc gives their real PIDs the pods' cgroups: the
scrape then costs what it costs over real NVML readings, and the sampler tick is the
real NVML calls. Its compute series are not what the processes did: the simulated clock
ticks far faster than NVML refreshes its samples. `hack/gpu-proof` runs it with 1, 8
and 32 processes beside `--nvml fake`.

Usage: .venv/bin/python -m benchmarks.exporter.run [--gpus 8] [--processes 64]
       [--containers 4] [--scrapes 200] [--nvml fake|real] [--json PATH] [--exposition PATH]
"""

import argparse
import functools
import gc
import hashlib
import importlib
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from doubles.cuda_worker import cuda_process
from doubles.nvml import FakeReader, fake_uuid
from doubles.procfs import containerd_v2, write_proc
from exporter.agent import Agent, PodDevices, node_pods
from exporter.cgroup import ProcessTable
from exporter.collector import ExporterCollector, Scrape
from exporter.exposition import text as exposition_text
from exporter.health import API, POD_RESOURCES, Health
from exporter.nvml import PynvmlReader
from exporter.pods import PodMap
from exporter.readings import Reader
from exporter.sampler import Sampler
from gpupack import keys
from gpupack.objects import JSON
from gpupack.quantity import format_compute, format_memory
from gpupack.runtime import shell
from gpupack.runtime.api import ApiError, WatchStream

TARGET_MS: Final = 20.0
NODE: Final = "gpu-node-0"
NAMESPACE: Final = "inference"
IMAGE: Final = "vllm/vllm-openai:v0.6.3"
TEMPLATE_HASH: Final = "5d8f7c9b6"
FIRST_PID: Final = 41_000
BOOT_TICKS: Final = 8_000_000  # process start times, clock ticks after boot
FILL_TICKS: Final = 60  # the sampler's default max window, at one tick a second
MiB: Final = 1 << 20
REAL_PROCESS_BYTES: Final = 256 * MiB  # --nvml real: what each CUDA process holds
REAL_PROCESS_SECONDS: Final = 3600.0  # its longest life; it is stopped when the run ends
SPIN_EVERY: Final = 8  # --nvml real: one process in 8 keeps every SM busy


# -- the node -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layout:
    gpus: int
    processes: int  # per GPU; each process is one container
    containers: int  # per pod; a pod's containers all use the same GPU

    @property
    def pods_per_gpu(self) -> int:
        return -(-self.processes // self.containers)

    def pid(self, gpu: int, n: int) -> int:
        """The PID `FakeReader.typical(first_pid=FIRST_PID)` gives process `n` of `gpu`."""
        return FIRST_PID + gpu * self.processes + n

    def as_json(self) -> dict[str, int]:
        return {
            "gpus": self.gpus,
            "processes_per_gpu": self.processes,
            "processes": self.gpus * self.processes,
            "containers_per_pod": self.containers,
            "pods": self.gpus * self.pods_per_gpu,
            "capacity_pods": self.gpus,
        }


def pod_uid(gpu: int, index: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpupack-bench/pod/{gpu}/{index}"))


def container_id(uid: str, n: int) -> str:
    """A containerd container ID: 64 hex digits."""
    return hashlib.sha256(f"{uid}/{n}".encode()).hexdigest()


def pod_name(gpu: int, index: int) -> str:
    return f"llm-{gpu}-{TEMPLATE_HASH}-{index:05x}"


def container_name(n: int) -> str:
    return f"worker-{n}"


def workload_pod(layout: Layout, gpu: int, gpu_uuid: str, index: int, memory_total: int) -> JSON:
    """A pod of a Deployment that gpupack admitted and placed on GPU `gpu` (`gpu_uuid`)."""
    uid = pod_uid(gpu, index)
    count = min(layout.containers, layout.processes - index * layout.containers)
    compute = max(1, 1000 // layout.pods_per_gpu)
    memory = memory_total // layout.pods_per_gpu // MiB * MiB
    statuses = [
        {
            "name": container_name(n),
            "containerID": f"containerd://{container_id(uid, n)}",
            "image": IMAGE,
            "ready": True,
            "restartCount": 0,
            "started": True,
        }
        for n in range(count)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(gpu, index),
            "namespace": NAMESPACE,
            "uid": uid,
            "resourceVersion": str(10_000 + gpu * layout.pods_per_gpu + index),
            "labels": {"app": f"llm-{gpu}", "pod-template-hash": TEMPLATE_HASH},
            "annotations": {
                keys.GPU_COMPUTE: format_compute(compute),
                keys.GPU_MEMORY: format_memory(memory),
                keys.GPU_UUID: gpu_uuid,
                keys.DECISION: str(uuid.uuid5(uuid.NAMESPACE_URL, f"decision/{uid}")),
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"llm-{gpu}-{TEMPLATE_HASH}",
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"replicaset/{gpu}")),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": NODE,
            "schedulerName": keys.SCHEDULER_NAME,
            "containers": [{"name": container_name(n), "image": IMAGE} for n in range(count)],
        },
        "status": {"phase": "Running", "containerStatuses": statuses},
    }


def capacity_pod(gpu: int, gpu_uuid: str, memory_total: int) -> JSON:
    """The capacity pod holding GPU `gpu` (`gpu_uuid`), annotated as the exporter's
    discovery leaves it."""
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpupack-bench/capacity/{gpu}"))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"gpupack-capacity-{gpu}",
            "namespace": keys.SYSTEM_NAMESPACE,
            "uid": uid,
            "resourceVersion": str(1_000 + gpu),
            "labels": {keys.ROLE: keys.ROLE_CAPACITY, keys.POOL: "h100-80gb"},
            "annotations": {
                keys.GPU_UUID: gpu_uuid,
                keys.GPU_MEMORY: format_memory(memory_total),
            },
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "hold", "image": "pause:3.10"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "hold", "containerID": f"containerd://{container_id(uid, 0)}"}
            ],
        },
    }


def write_processes(root: Path, layout: Layout, gpus: "Gpus") -> None:
    """/proc/<pid>/{stat,cgroup,cmdline} for every GPU process, each in its container."""
    for gpu in range(layout.gpus):
        for n in range(layout.processes):
            uid = pod_uid(gpu, n // layout.containers)
            cgroup = containerd_v2(uid, container_id(uid, n % layout.containers))
            pid = gpus.pids[gpu][n]
            write_proc(root, pid, cgroup=cgroup, start_time=BOOT_TICKS + pid)


@dataclass(frozen=True, slots=True)
class Gpus:
    """What the sampler reads: a reader, the UUID of each GPU of the layout, and the PIDs
    of each GPU's processes."""

    reader: Reader
    uuids: list[str]
    pids: list[list[int]]
    memory_total: int


@contextmanager
def fake_gpus(layout: Layout) -> Iterator[Gpus]:
    reader = FakeReader.typical(layout.gpus, layout.processes, first_pid=FIRST_PID)
    uuids = [fake_uuid(gpu) for gpu in range(layout.gpus)]
    pids = [[layout.pid(gpu, n) for n in range(layout.processes)] for gpu in range(layout.gpus)]
    yield Gpus(reader, uuids, pids, reader.device(uuids[0]).memory_total)


@contextmanager
def real_gpus(layout: Layout) -> Iterator[Gpus]:
    """The first `layout.gpus` whole GPUs NVML lists, each with `layout.processes` real
    CUDA processes of REAL_PROCESS_BYTES (`doubles.cuda_worker`): one in
    SPIN_EVERY spins on every SM, the others sleep."""
    probe = PynvmlReader()
    try:
        devices = [device for device in probe.open() if not device.mig][: layout.gpus]
    finally:
        probe.close()
    if len(devices) < layout.gpus:
        raise SystemExit(f"--nvml real: {layout.gpus} GPU(s) asked for, NVML lists {len(devices)}")
    with ExitStack() as stack:
        pids = [
            [
                stack.enter_context(
                    cuda_process(
                        "spin" if n % SPIN_EVERY == 0 else "idle",
                        device.uuid,
                        REAL_PROCESS_BYTES,
                        REAL_PROCESS_SECONDS,
                    )
                ).pid
                for n in range(layout.processes)
            ]
            for device in devices
        ]
        uuids = [device.uuid for device in devices]
        yield Gpus(PynvmlReader(), uuids, pids, devices[0].memory_total)


class QuietWatch:
    """A watch that stays open and sends nothing until closed: the pods hold still."""

    def __init__(self) -> None:
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[JSON]:
        self._closed.wait()
        yield from ()

    def close(self) -> None:
        self._closed.set()


class NodeApi:
    """The API server as the exporter sees it (`exporter.kube.Kube`): the node's pods."""

    def __init__(self, pods: Sequence[JSON]) -> None:
        self._pods = list(pods)

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        meta = {"resourceVersion": "20000"}
        return {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": self._pods}

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream:
        return QuietWatch()

    def patch(self, path: str, body: JSON) -> JSON:
        raise ApiError(405, "MethodNotAllowed", "the benchmark's API server is read-only")

    def close(self) -> None:
        pass


class NoPodResources:
    """kubelet's pod-resources API; a scrape never asks it."""

    def list(self) -> Sequence[PodDevices]:
        return []


@dataclass(slots=True)
class Clock:
    """Simulated seconds for the sampler: one tick a second, however fast the machine."""

    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Node:
    layout: Layout
    clock: Clock
    sampler: Sampler
    registry: CollectorRegistry
    agent_seconds: list[float] = field(default_factory=list)  # Agent.scrape, per scrape

    def tick(self) -> None:
        """One second passes and the sampler reads NVML, as its thread does."""
        self.clock.now += 1.0
        self.sampler.sample_once()


def timed(call: Callable[[], Scrape], into: list[float]) -> Callable[[], Scrape]:
    def scrape() -> Scrape:
        started = time.perf_counter()
        try:
            return call()
        finally:
            into.append(time.perf_counter() - started)

    return scrape


@contextmanager
def running_node(layout: Layout, gpus: Gpus) -> Iterator[Node]:
    """The exporter wired as `exporter.cli` wires it, with its sampler's history full."""
    with tempfile.TemporaryDirectory(prefix="gpupack-bench-proc-") as proc:
        write_processes(Path(proc), layout, gpus)
        memory_total = gpus.memory_total
        pods = [capacity_pod(gpu, gpus.uuids[gpu], memory_total) for gpu in range(layout.gpus)]
        pods += [
            workload_pod(layout, gpu, gpus.uuids[gpu], index, memory_total)
            for gpu in range(layout.gpus)
            for index in range(layout.pods_per_gpu)
        ]
        api = NodeApi(pods)
        informer = node_pods(api, NODE)
        health = Health()
        clock = Clock()
        sampler = Sampler(gpus.reader, health, clock=clock)
        agent = Agent(
            api, PodMap(informer), sampler, ProcessTable(Path(proc)), NoPodResources(), health
        )
        registry = CollectorRegistry()
        node = Node(layout, clock, sampler, registry)
        registry.register(ExporterCollector(timed(agent.scrape, node.agent_seconds)))
        informer.start()
        try:
            if not informer.wait_synced(30):
                raise RuntimeError("the node's pod informer did not sync within 30 s")
            health.ok(API)
            health.ok(POD_RESOURCES)
            for _ in range(FILL_TICKS):
                node.tick()
            yield node
        finally:
            informer.stop()
            sampler.stop()  # closes the reader


# -- measuring ----------------------------------------------------------------------------


def summary(seconds: Sequence[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    if len(ordered) > 1:
        cuts = statistics.quantiles(ordered, n=100, method="inclusive")
        p50, p99 = cuts[49], cuts[98]
    else:
        p50 = p99 = ordered[0]
    return {
        "p50_ms": round(p50 * 1e3, 3),
        "p99_ms": round(p99 * 1e3, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1e3, 3),
        "max_ms": round(ordered[-1] * 1e3, 3),
    }


@dataclass
class Run:
    scrapes: list[list[float]]  # seconds per scrape, one list per registry
    ticks: list[float] = field(default_factory=list)
    exposition: bytes = b""  # the first registry's last scrape


def scrape_loop(
    node: Node, renderers: Sequence[Callable[[], bytes]], scrapes: int, interval: int
) -> Run:
    """`scrapes` rounds of: `interval` sampler ticks, then one scrape of each renderer in
    turn (interleaved, so drift on a busy machine hits every one alike)."""
    run = Run([[] for _ in renderers])
    gc.collect()
    for _ in range(scrapes):
        for _ in range(interval):
            started = time.perf_counter()
            node.tick()
            run.ticks.append(time.perf_counter() - started)
        for index, (render, seconds) in enumerate(zip(renderers, run.scrapes, strict=True)):
            started = time.perf_counter()
            exposition = render()
            seconds.append(time.perf_counter() - started)
            if index == 0:
                run.exposition = exposition
    return run


def samples_of(exposition: bytes) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(exposition.decode()))


def gauge_registry(exposition: bytes) -> CollectorRegistry:
    """The baseline: every sample of `exposition` as an ordinary Gauge, set once. A
    counter's `<name>_total` sample becomes a gauge of that name; families without
    samples are left out (they expose two comment lines and nothing else)."""
    registry = CollectorRegistry()
    for family in text_string_to_metric_families(exposition.decode()):
        by_name: dict[str, list[Sample]] = {}
        for sample in family.samples:
            by_name.setdefault(sample.name, []).append(sample)
        for name, samples in by_name.items():
            gauge = Gauge(
                name, family.documentation, labelnames=list(samples[0].labels), registry=registry
            )
            for sample in samples:
                (gauge.labels(**sample.labels) if sample.labels else gauge).set(sample.value)
    return registry


def memory_kib() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in KiB, from /proc/self/status."""
    found: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def mib(kib: int) -> float:
    return round(kib / 1024, 1)


def measure(
    layout: Layout, scrapes: int, warmup: int, interval: int, nvml: str = "fake"
) -> tuple[JSON, bytes]:
    importlib.import_module("exporter.cli")  # what the binary loads: RSS compares with it
    gc.collect()
    at_import = memory_kib()["VmRSS"]
    started = time.perf_counter()
    gpus = real_gpus if nvml == "real" else fake_gpus
    with gpus(layout) as source, running_node(layout, source) as node:
        shell.settle_heap()  # as every gpupack binary does once started
        ours_render = functools.partial(exposition_text, node.registry)  # what /metrics serves
        warm = scrape_loop(node, [ours_render], warmup, interval)
        exporter_only = memory_kib()  # steady state: full history, warm caches
        baseline_registry = gauge_registry(warm.exposition)
        series = samples_of(warm.exposition)
        baseline_series = samples_of(generate_latest(baseline_registry))
        if baseline_series != series:
            raise RuntimeError(f"the baseline exposes {baseline_series} series, not {series}")
        node.agent_seconds.clear()
        baseline_render = functools.partial(generate_latest, baseline_registry)
        timed_run = scrape_loop(node, [ours_render, baseline_render], scrapes, interval)
        ours, base = timed_run.scrapes
        agent = list(node.agent_seconds)
        after = memory_kib()
    gpupack, baseline = summary(ours), summary(base)
    report: JSON = {
        "benchmark": "exporter-scrape",
        "measures": "exporter.exposition.text(registry) (what /metrics serves) with "
        "ExporterCollector(Agent.scrape), "
        f"Sampler over {'PynvmlReader (real NVML)' if nvml == 'real' else 'FakeReader.typical'}, "
        "ProcessTable over a fake /proc, PodMap over an Informer",
        "nvml": nvml,
        "layout": layout.as_json(),
        "scrapes": scrapes,
        "warmup": warmup,
        "ticks_between_scrapes": interval,
        "series": series,
        "exposition_bytes": len(timed_run.exposition),
        "gpupack": gpupack,
        "agent_scrape": summary(agent),
        "baseline_gauges": baseline,
        "ratio_p50": round(gpupack["p50_ms"] / baseline["p50_ms"], 2),
        "ratio_p99": round(gpupack["p99_ms"] / baseline["p99_ms"], 2),
        "target_ms": TARGET_MS,
        "within_target": {
            "p50": gpupack["p50_ms"] <= TARGET_MS,
            "p99": gpupack["p99_ms"] <= TARGET_MS,
        },
        "sample_once": {"ticks": len(timed_run.ticks), **summary(timed_run.ticks)},
        "memory_mib": {
            "rss_after_imports": mib(at_import),
            "vmrss_before_baseline": mib(exporter_only["VmRSS"]),
            "vmrss_after_run": mib(after["VmRSS"]),
            "vmhwm_after_run": mib(after["VmHWM"]),
        },
        "seconds": round(time.perf_counter() - started, 1),
    }
    return report, timed_run.exposition


def table(report: Mapping[str, Any]) -> str:
    layout, memory = report["layout"], report["memory_mib"]
    ours, base = report["gpupack"], report["baseline_gauges"]
    rows = [
        ("gpupack scrape (/metrics)", ours),
        ("  of which Agent.scrape()", report["agent_scrape"]),
        ("baseline: the same series as Gauges", base),
        ("sampler tick (sample_once)", report["sample_once"]),
    ]
    target = report["target_ms"]
    verdict = {True: "within", False: "OVER"}
    lines = [
        f"exporter scrape ({report['nvml']} NVML): {layout['gpus']} GPUs x "
        f"{layout['processes_per_gpu']} processes = "
        f"{layout['processes']} processes in {layout['pods']} pods of "
        f"{layout['containers_per_pod']} containers (+{layout['capacity_pods']} capacity pods)",
        f"{report['series']} series, {report['exposition_bytes'] / 1024:.1f} KiB per scrape; "
        f"{report['scrapes']} scrapes after {report['warmup']} warm-up, "
        f"{report['ticks_between_scrapes']} sampler ticks between scrapes",
        "",
        f"{'':38}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'max ms':>9}",
    ]
    for name, figures in rows:
        lines.append(
            f"{name:38}{figures['p50_ms']:9.3f}{figures['p99_ms']:9.3f}"
            f"{figures['mean_ms']:9.3f}{figures['max_ms']:9.3f}"
        )
    lines += [
        f"{'ratio gpupack / baseline':38}{report['ratio_p50']:9.2f}{report['ratio_p99']:9.2f}",
        f"{'target per scrape':38}{target:9.1f}{target:9.1f}   "
        f"p50 {verdict[report['within_target']['p50']]}, "
        f"p99 {verdict[report['within_target']['p99']]}",
        "",
        f"resident memory (MiB): {memory['rss_after_imports']} after imports; "
        f"{memory['vmrss_before_baseline']} after the warm-up scrapes (the exporter alone); "
        f"after the run (with the baseline's Gauges): VmRSS {memory['vmrss_after_run']}, "
        f"VmHWM {memory['vmhwm_after_run']}",
    ]
    return "\n".join(lines)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=positive, default=8)
    parser.add_argument("--processes", type=positive, default=64, help="GPU processes per GPU")
    parser.add_argument(
        "--containers", type=positive, default=4, help="containers per pod, one process each"
    )
    parser.add_argument("--scrapes", type=positive, default=200, help="timed scrapes")
    parser.add_argument(
        "--warmup",
        type=positive,
        default=20,
        help="untimed scrapes first (the baseline is built from the last one)",
    )
    parser.add_argument(
        "--interval",
        type=positive,
        default=15,
        help="sampler ticks (simulated seconds) between scrapes: the scrape interval",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the report here")
    parser.add_argument(
        "--exposition", type=Path, metavar="PATH", help="write the last scrape's text here"
    )
    parser.add_argument(
        "--nvml",
        choices=("fake", "real"),
        default="fake",
        help="fake: FakeReader.typical; real: PynvmlReader on this machine's GPUs, each "
        "with --processes real CUDA processes (needs an NVIDIA GPU; default: fake)",
    )
    args = parser.parse_args(argv)
    layout = Layout(args.gpus, args.processes, args.containers)
    report, exposition = measure(layout, args.scrapes, args.warmup, args.interval, args.nvml)
    print(table(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.exposition is not None:
        args.exposition.write_bytes(exposition)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
