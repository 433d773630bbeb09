"""Cheaper scale-downs: which pods a shrinking ReplicaSet loses first.

When a ReplicaSet shrinks, its controller deletes first the pods with the lowest
`controller.kubernetes.io/pod-deletion-cost` (among pods equally running and ready).
Without it, it thins every GPU: the pods it picks (the newest, those on crowded nodes)
sit on GPUs that keep their other shares, so no GPU empties and no capacity pod goes.
The leader keeps each such pod's cost equal to the compute booked on its GPU, in steps
of `STEP` millis: pods on the emptiest GPUs go first, and a scale-down empties GPUs.

The cost has to follow the GPU as other pods come and go (a cost written once at bind
says how full the GPU was then, and does as well as none: `benchmarks.churn.scaledown`).
So the leader rewrites it, but only when the GPU's fill crosses a step, at most `LIMIT`
pods per round, and only on running pods a ReplicaSet owns. A cost the user set is
theirs: gpupack manages the annotation only while it is absent or equal to the value
gpupack last wrote (`gpupack.io/deletion-cost`, which only gpupack may write). The API
server lets the scheduler change nothing else on a user's pod (the chart's admission
policy `immutable-allocations`).
"""

import logging
from collections.abc import Callable
from typing import Final

from gpupack import keys
from gpupack.objects import JSON, annotations_of, controller_kind
from gpupack.runtime.api import ApiError
from gpupack.shares import is_running
from scheduler import writer
from scheduler.cache import Cache
from scheduler.kube import Kube
from scheduler.ledger import Ledger

log = logging.getLogger(__name__)

STEP: Final = 100  # millis of GPU compute per cost step
LIMIT: Final = 50  # pods re-annotated per round, at most
INTERVAL: Final = 5.0  # seconds between rounds


def costs(snapshot: Ledger) -> dict[str, int]:
    """The deletion cost of every pod booked on one GPU: its GPU's booked compute, in
    steps of `STEP`."""
    out: dict[str, int] = {}
    for key, booking in snapshot.bookings.items():
        if len(booking.gpus) != 1:
            continue
        gpu = snapshot.gpus.get(booking.gpus[0])
        if gpu is not None:
            out[key] = round(gpu.used_compute / STEP) * STEP
    return out


def managed(pod: JSON) -> bool:
    """Whether gpupack may set the pod's deletion cost: a running pod a ReplicaSet owns,
    whose cost is absent or the one gpupack wrote."""
    if controller_kind(pod) != "ReplicaSet":
        return False
    if not is_running(pod):
        return False
    annotations = annotations_of(pod)
    current = annotations.get(keys.POD_DELETION_COST)
    return current is None or current == annotations.get(keys.DELETION_COST)


class Costs:
    """The leader's rounds: rewrite the costs that crossed a step."""

    def __init__(self, kube: Kube, cache: Cache, submit: Callable[..., object]) -> None:
        self._kube = kube
        self.cache = cache
        self._submit = submit
        self._last = -INTERVAL

    def round(self, now: float) -> int:
        """Submit the writes of one round, if one is due; how many."""
        if now - self._last < INTERVAL:
            return 0
        self._last = now
        written = 0
        for key, cost in sorted(costs(self.cache.ledger).items()):
            pod = self.cache.pod(key)
            if pod is None or not managed(pod):
                continue
            value = str(cost)
            if annotations_of(pod).get(keys.POD_DELETION_COST) == value:
                continue
            self._submit(self._write, pod, value)
            written += 1
            if written == LIMIT:
                break
        return written

    def _write(self, pod: JSON, value: str) -> None:
        try:
            writer.annotate(
                self._kube, pod, {keys.POD_DELETION_COST: value, keys.DELETION_COST: value}
            )
        except ApiError as error:  # changed meanwhile (409) or gone: the next round sees it
            meta = pod["metadata"]
            log.debug(
                "deletion cost of %s/%s not written: %s", meta["namespace"], meta["name"], error
            )
