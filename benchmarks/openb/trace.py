"""The openb trace as the placement core sees it: nodes, pods, and the arrival process.

Reads the CSVs of `shared/data/openb` (any files of those formats: the node list
`sn,cpu_milli,memory_mib,gpu,model`, the pod lists with 11 columns or the multigpu
files' 5), builds a `Ledger` of the cluster and one `Request` per pod, and draws the
arrivals of one seed as the FGD paper's artifact does (see `arrivals`).

GPU memory: the trace has none. Each GPU gets its model's memory, the simulator's
`MapGpuTypeMemoryMiB` values (`MODEL_MEMORY_MIB`; G2 and G3 are its placeholders), and a
pod's GPU memory would be gpu_milli/1000 x that memory. Since that is proportional to
compute on every GPU, the compute check implies the memory check, so requests carry
`gpu_memory=0` and placement checks compute only (`MEMORY_NOTE`).
"""

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from scheduler.ledger import FULL_GPU, Gpu, Ledger, Node, Request

MiB: Final = 2**20
MODEL_MEMORY_MIB: Final = {
    "T4": 15109,
    "P100": 16280,
    "V100M16": 16160,
    "V100M32": 32510,
    "A10": 22731,
    "G2": 20000,
    "G3": 30000,
}
MEMORY_NOTE: Final = (
    "GPU memory derived as gpu_milli/1000 x the model's memory (simulator's "
    "MapGpuTypeMemoryMiB: T4 15109, P100 16280, V100M16 16160, V100M32 32510, A10 22731, "
    "G2 20000, G3 30000 MiB; G2/G3 are placeholders). Each Gpu carries its model's memory; "
    "requests carry gpu_memory=0 because memory proportional to compute is implied by the "
    "compute check."
)
DEFAULT_DATA: Final = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb"
DEFAULT_NODES: Final = DEFAULT_DATA / "openb_node_list_gpu_node.csv"
DEFAULT_PODS: Final = DEFAULT_DATA / "openb_pod_list_default.csv"
TARGET_RATIO: Final = 1.3  # arrivals stop once 130 % of the GPU capacity has arrived


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu: int  # millicores
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu: int  # millicores
    memory_mib: int
    gpus: int
    compute: int  # millis of each GPU
    spec: str = ""  # allowed models, '|'-separated; empty: any

    @property
    def gpu_milli(self) -> int:
        """The pod's whole GPU request (num_gpu x gpu_milli)."""
        return self.gpus * self.compute


def read_nodes(path: Path) -> list[TraceNode]:
    with path.open(newline="") as f:
        return [
            TraceNode(
                row["sn"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["gpu"]),
                row.get("model") or "",
            )
            for row in csv.DictReader(f)
        ]


def read_pods(path: Path) -> list[TracePod]:
    with path.open(newline="") as f:
        return [
            TracePod(
                row["name"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["num_gpu"]),
                int(row["gpu_milli"]),
                row.get("gpu_spec") or "",
            )
            for row in csv.DictReader(f)
        ]


def capacity(nodes: Sequence[TraceNode]) -> int:
    """The cluster's GPU capacity in millis."""
    return FULL_GPU * sum(n.gpus for n in nodes)


def arrivals(
    pods: Sequence[TracePod], seed: int, gpu_capacity: int, ratio: float = TARGET_RATIO
) -> list[TracePod]:
    """One seed's arrival order: shuffle the trace, then append clones drawn uniformly
    with replacement until the next one would take the total GPU request past
    `ratio` x capacity; if the trace alone is past it, drop random pods until it is not."""
    rng = random.Random(seed)
    out = list(pods)
    rng.shuffle(out)
    target = ratio * gpu_capacity
    total = sum(p.gpu_milli for p in out)
    if total > target:
        while total > target:
            total -= out.pop(rng.randrange(len(out))).gpu_milli
        return out
    while pods:
        clone = pods[rng.randrange(len(pods))]
        if total + clone.gpu_milli > target:
            break
        out.append(clone)
        total += clone.gpu_milli
    return out


def snapshot(nodes: Sequence[TraceNode], replicas: int = 1) -> Ledger:
    """The cluster as the placement core's snapshot (pool "" everywhere); `replicas`
    copies of every node, for a larger cluster of the same shape."""
    out: list[Node] = []
    for copy in range(replicas):
        for spec in nodes:
            name = spec.name if copy == 0 else f"{spec.name}-x{copy}"
            node = Node(name, spec.cpu, spec.memory_mib * MiB, max_pods=1_000_000)
            memory = MODEL_MEMORY_MIB.get(spec.model, 0) * MiB
            node.gpus = [
                Gpu(
                    f"{name}-gpu{i}",
                    name,
                    memory=memory,
                    model=spec.model,
                    holder=f"cap-{name}-{i}",
                )
                for i in range(spec.gpus)
            ]
            out.append(node)
    return Ledger(out)


def request(pod: TracePod, index: int) -> Request:
    """The pod's request; `index` keeps clones of one trace pod apart."""
    return Request(
        f"openb/{pod.name}-{index}",
        cpu=pod.cpu,
        memory=pod.memory_mib * MiB,
        compute=pod.compute if pod.gpus else 0,
        gpu_memory=0,
        gpus=pod.gpus,
        models=frozenset(pod.spec.split("|")) if pod.spec else None,
    )
