"""What the bill benchmark adds up from its samples: node- and GPU-seconds held, against
the bound of what ran, per side (gpupack, whole GPUs). Pure: samples in, figures out.

A sample is what one look at the cluster saw (`Seen`); each counts until the next one
(a step function), so the sums are as exact as the sampling interval. The bound of a
moment is the fewest GPUs that could hold what ran then (`trace.bound_gpus`: shares'
compute and memory rounded up; one GPU per whole-GPU pod) and the fewest nodes of
`gpus_per_node` GPUs that could hold those.
"""

import math
import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Seen:
    """One side at one moment."""

    nodes: int  # Karpenter NodeClaims of the side's NodePool (billed until gone)
    gpus: int  # GPUs held: capacity pods on a node, or whole-GPU pods on a node
    bound_gpus: int  # the fewest GPUs what ran could fit
    running: int  # pods running
    orphans: int = 0  # shares bound to a GPU no running capacity pod holds


@dataclass(slots=True)
class Side:
    """A side's sums over the replay."""

    gpus_per_node: int
    node_seconds: float = 0.0
    gpu_seconds: float = 0.0
    bound_gpu_seconds: float = 0.0
    bound_node_seconds: float = 0.0
    peak_nodes: int = 0
    peak_gpus: int = 0
    orphan_samples: int = 0
    waits: dict[str, float] = field(default_factory=dict)  # pod uid -> seconds to scheduled
    moves: dict[str, int] = field(default_factory=dict)  # workload -> pods moved
    nodes_gone_after: float | None = None  # seconds from the last departure

    def add(self, seen: Seen, seconds: float) -> None:
        self.node_seconds += seen.nodes * seconds
        self.gpu_seconds += seen.gpus * seconds
        self.bound_gpu_seconds += seen.bound_gpus * seconds
        self.bound_node_seconds += math.ceil(seen.bound_gpus / self.gpus_per_node) * seconds
        self.peak_nodes = max(self.peak_nodes, seen.nodes)
        self.peak_gpus = max(self.peak_gpus, seen.gpus)
        self.orphan_samples += 1 if seen.orphans else 0

    def report(self) -> dict[str, object]:
        waits = sorted(self.waits.values())
        return {
            "node_seconds": round(self.node_seconds),
            "bound_node_seconds": round(self.bound_node_seconds),
            "node_seconds_over_bound": ratio(self.node_seconds, self.bound_node_seconds),
            "gpu_seconds": round(self.gpu_seconds),
            "bound_gpu_seconds": round(self.bound_gpu_seconds),
            "gpu_seconds_over_bound": ratio(self.gpu_seconds, self.bound_gpu_seconds),
            "peak_nodes": self.peak_nodes,
            "peak_gpus": self.peak_gpus,
            "pods": len(waits),
            "wait_p50_seconds": percentile(waits, 50),
            "wait_p99_seconds": percentile(waits, 99),
            "pods_moved": sum(self.moves.values()),
            "most_moves_of_a_workload": max(self.moves.values(), default=0),
            "samples_with_a_share_on_an_unheld_gpu": self.orphan_samples,
            "nodes_gone_after_last_departure_seconds": (
                None if self.nodes_gone_after is None else round(self.nodes_gone_after, 1)
            ),
        }


def ratio(value: float, base: float) -> float | None:
    return round(value / base, 3) if base else None


def percentile(values: list[float], p: float) -> float | None:
    """The nearest-rank percentile of sorted `values`, None when there are none."""
    if not values:
        return None
    rank = max(1, math.ceil(p / 100 * len(values)))
    return round(values[rank - 1], 1)


def compare(gpupack: Side, whole: Side) -> dict[str, object]:
    """The figures the issue asks for, side by side."""
    return {
        "gpupack_over_whole_node_seconds": ratio(gpupack.node_seconds, whole.node_seconds),
        "gpupack_over_whole_gpu_seconds": ratio(gpupack.gpu_seconds, whole.gpu_seconds),
        "gpupack_bound_over_whole_node_seconds": ratio(
            gpupack.bound_node_seconds, whole.node_seconds
        ),
        "mean_wait_ratio": ratio(
            statistics.fmean(gpupack.waits.values()) if gpupack.waits else 0.0,
            statistics.fmean(whole.waits.values()) if whole.waits else 0.0,
        ),
    }
