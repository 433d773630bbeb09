"""Metric names that cross a component boundary: written by the exporter, read by the
recommender (usage history), the chart's dashboard and Prometheus rules.

One place, so a rename cannot leave a reader querying a series nobody writes. Names
follow Prometheus conventions: base units (`_bytes`, `_ratio`), one GPU is ratio 1.0.
Metrics that only their own component reads (the webhook's, the scheduler's) stay in
that component's metrics module.
"""

from dataclasses import dataclass
from typing import Final

# Per pod and container, per GPU: labels namespace, pod, container, gpu (UUID).
POD_COMPUTE: Final = "gpupack_pod_gpu_compute_ratio"
POD_MEMORY_USED: Final = "gpupack_pod_gpu_memory_used_bytes"

# Per fractional pod, per GPU: labels namespace, pod, gpu. What gpupack allocated.
POD_COMPUTE_ALLOCATED: Final = "gpupack_pod_gpu_compute_allocated_ratio"
# The pod's GPU time over its compute share: who is held back, who runs past its share.
POD_COMPUTE_SHARE: Final = "gpupack_pod_gpu_compute_share_ratio"
POD_MEMORY_ALLOCATED: Final = "gpupack_pod_gpu_memory_allocated_bytes"
POD_MANAGED: Final = "gpupack_pod_gpu_managed"  # labels namespace, pod
POD_GPU_PROCESSES: Final = "gpupack_pod_gpu_processes"  # + shim: loaded|missing|unknown
POD_ENFORCEMENT: Final = "gpupack_pod_enforcement_info"  # namespace, pod, enforcement

# Per GPU: label gpu (UUID), plus those named.
GPU_INFO: Final = "gpupack_gpu_info"  # index, model, mig
GPU_UTILIZATION: Final = "gpupack_gpu_utilization_ratio"
GPU_HEALTHY: Final = "gpupack_gpu_healthy"
GPU_CAPACITY_POD: Final = "gpupack_gpu_capacity_pod"  # namespace, pod of the holder
GPU_UNATTRIBUTED_COMPUTE: Final = "gpupack_gpu_unattributed_compute_ratio"  # source


@dataclass(slots=True)
class Use:
    """A running sum of GPU use, compute (ratio of one GPU) and memory (bytes), where
    either may be unknown (None) until some reading says: the exporter sums a GPU's
    processes per container, the recommender a pod's series over containers and GPUs."""

    compute: float | None = None
    memory: int | None = None

    def add(self, compute: float | None, memory: int | None) -> None:
        if compute is not None:
            self.compute = (self.compute or 0.0) + compute
        if memory is not None:
            self.memory = (self.memory or 0) + memory
