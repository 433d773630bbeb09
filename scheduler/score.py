"""Scorers: which GPUs on a node a pod should take, and at what cost (lower is better).

Pure. `PackingScorer` is best fit in compute: the GPU left with the least free compute
wins, so partly used GPUs fill before empty ones are opened (consolidation), and among
equal GPUs the fuller node wins, so whole nodes stay free for the autoscaler.
"""

from collections.abc import Sequence
from typing import Final

from scheduler.snapshot import FULL_GPU, Gpu, Node, Request

NODE_WEIGHT: Final = 1e-3  # node fullness only breaks ties between equal GPUs


class PackingScorer:
    generation: Final = 0

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        ranked = sorted(fits, key=lambda g: (g.free_compute, -g.pods, g.uuid))
        chosen = tuple(ranked[: request.gpus])
        left = sum(g.free_compute - request.compute for g in chosen) / (FULL_GPU * request.gpus)
        node_free = node.free_cpu / node.cpu if node.cpu else 0.0
        return left + NODE_WEIGHT * node_free, chosen
