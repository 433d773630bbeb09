"""The same trace through the churn simulator (`benchmarks.churn.replay`): placement and
consolidation alone, on enough 8-GPU nodes that nothing waits, with no capacity pods, no
grace or headroom, no autoscaler and no restart time. Beside the live run it shows what
the lifecycle and the autoscaler add to the bill (docs/scheduler.md)."""

import math
from collections.abc import Sequence

from benchmarks.bill.trace import Workload
from benchmarks.churn.replay import Timed, replay
from benchmarks.openb.trace import TraceNode, TracePod
from gpupack.policy import ConsolidationMode


def simulated(workloads: Sequence[Workload], gpus_per_node: int) -> dict[str, object]:
    """GPU- and node-time over their bounds, consolidation Off and On."""
    pods = [
        Timed(
            TracePod(f"{w.name}-{r}", cpu=100, memory_mib=16, gpus=1, compute=w.compute),
            round(w.start),
            max(round(w.end), round(w.start) + 1),
        )
        for w in workloads
        for r in range(w.replicas)
    ]
    count = math.ceil(len(pods) / gpus_per_node) + 1
    nodes = [
        TraceNode(f"node-{i:03d}", 192_000, 2_097_152, gpus_per_node, "V100M32")
        for i in range(count)
    ]
    result: dict[str, object] = {}
    for mode in (ConsolidationMode.OFF, ConsolidationMode.ON):
        run = replay("bill", "gpupack", mode, nodes, pods)
        result[mode.value] = {
            "gpu_seconds_over_bound": round(run.gpu_ratio, 3),
            "node_seconds_over_bound": round(run.node_ratio, 3),
            "evictions": run.evictions,
            "failed": run.failed,
        }
    return result
