"""The FGD paper's published baselines, re-implemented as `Scorer`s (our own code).

Semantics follow the paper's simulator (hkust-adsl/kubernetes-scheduler-simulator), read
for behaviour and not copied:

- **BestFit** scores a node by its free CPU and free GPU millis left after the pod,
  normalised by the largest node (128 cores, 8 GPUs), weight 0.5 each; lower leftover is
  better. A sharing pod takes the fitting GPU with the least free compute (the first on
  a tie), a whole-GPU pod the first idle GPUs.
- **FGD** scores a node by how much the pod grows the node's fragmentation with respect
  to the typical task mix (`scheduler.score.fragmentation`), through a sigmoid. A
  sharing pod takes the GPU that grows it least (the first on a tie); a whole-GPU pod
  the first idle GPUs.

Both simulator plugins return integer scores in 0..100 (cost = -score here); the
simulator breaks ties between equally scored nodes by the smallest node name, which is
placement's "first node met" when the snapshot lists nodes in name order.
"""

import math
from collections.abc import Sequence
from typing import Final

from scheduler.fragmentation import TaskType, fragmentation
from scheduler.ledger import FULL_GPU, Gpu, Node, Request
from scheduler.placement import Scorer

MAX_SPEC_CPU: Final = 128_000  # millicores: the largest node the simulator normalises by
MAX_SPEC_GPU: Final = 8_000  # GPU millis
MAX_SCORE: Final = 100


def _first_idle(fits: Sequence[Gpu], count: int) -> tuple[Gpu, ...]:
    return tuple(g for g in fits if g.used_compute == 0)[:count]


class BestFitScorer(Scorer):
    generation: Final = 0

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        gpu_left = sum(g.free_compute for g in node.gpus) - request.compute * request.gpus
        left = (node.free_cpu - request.cpu) / MAX_SPEC_CPU * 0.5 + gpu_left / MAX_SPEC_GPU * 0.5
        score = int((1.0 - left) * MAX_SCORE)
        if request.gpus == 0:
            chosen: tuple[Gpu, ...] = ()
        elif request.gpus == 1 and request.compute < FULL_GPU:
            best = min(fits, key=lambda g: g.free_compute)  # min keeps the first on a tie
            chosen = (best,)
        else:
            chosen = _first_idle(fits, request.gpus)
            if len(chosen) < request.gpus:
                return None
        return float(-score), chosen


class FgdScorer(Scorer):
    """Fragmentation Gradient Descent as the paper's simulator scores it."""

    generation: Final = 0

    def __init__(self, mix: Sequence[TaskType]) -> None:
        self._mix = tuple(mix)
        self._frag: dict[tuple[str, int, tuple[int, ...]], float] = {}
        self._answers: dict[tuple[object, ...], tuple[int, tuple[int, ...]] | None] = {}

    def _fragmentation(self, model: str, free_cpu: int, free: list[int]) -> float:
        key = (model, free_cpu, tuple(sorted(free)))
        value = self._frag.get(key)
        if value is None:
            value = self._frag[key] = fragmentation(self._mix, model, free_cpu, key[2])
        return value

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        # Only GPUs placement lets the pod use are candidates (not one draining, say). In
        # the arrival replay every GPU with room for the pod is among them, so this
        # changes no figure of the paper's protocol.
        usable = {id(g) for g in fits}
        allowed = tuple(i for i, g in enumerate(node.gpus) if id(g) in usable)
        free = [g.free_compute for g in node.gpus]
        model = node.gpus[0].model if node.gpus else ""
        key = (
            request.cpu,
            request.compute,
            request.gpus,
            model,
            node.free_cpu,
            tuple(free),
            allowed,
        )
        if key not in self._answers:
            self._answers[key] = self._score(model, node.free_cpu, request, free, allowed)
        answer = self._answers[key]
        if answer is None:
            return None
        score, indices = answer
        return float(-score), tuple(node.gpus[i] for i in indices)

    def _score(
        self,
        model: str,
        free_cpu: int,
        request: Request,
        free: list[int],
        allowed: tuple[int, ...],
    ) -> tuple[int, tuple[int, ...]] | None:
        before = self._fragmentation(model, free_cpu, free)
        cpu_after = free_cpu - request.cpu
        if request.gpus == 1 and request.compute < FULL_GPU:
            best: tuple[int, tuple[int, ...]] | None = None
            for i in allowed:
                left = free[i]
                if left < request.compute:
                    continue
                after = list(free)
                after[i] -= request.compute
                score = _sigmoid_score(before - self._fragmentation(model, cpu_after, after))
                if best is None or score > best[0]:
                    best = (score, (i,))
            return best
        indices = tuple(i for i in allowed if free[i] == FULL_GPU)[: request.gpus]
        if len(indices) < request.gpus:
            return None
        after = list(free)
        for i in indices:
            after[i] -= request.compute
        return _sigmoid_score(before - self._fragmentation(model, cpu_after, after)), indices


def _sigmoid_score(gain: float) -> int:
    """The simulator's node score for a fragmentation gain in GPU millis."""
    return int(MAX_SCORE / (1.0 + math.exp(-gain / FULL_GPU)))
