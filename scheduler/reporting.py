"""What the extender tells operators beyond its answers: Warning Events about pods, and
the usage the gauges read.

- **Events**, written by the leader only, off the lock (on the extender's write pool):
  `EscapedGPUPack` on an opted-in pod that holds a whole GPU gpupack never rewrote
  (`scheduler.escapes`), and `MPSDaemonRestarted` on an MPS capacity pod whose daemon
  restarted and on each pod it hosted (`scheduler.mps_health`). Escapes are remembered
  per process, so a new leader writes one more Event for a pod its predecessor already
  reported; restart counts are followed on every replica, so a new leader reports only
  the restarts that came after it took over.
- **Usage**: the snapshot's GPUs, reservations and pending pods as one `Usage`, taken
  once per housekeeping round and read by the metrics collector.
"""

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from gpupack.codec import parse_time
from gpupack.objects import JSON
from scheduler import writer
from scheduler.cache import Cache
from scheduler.escapes import REASON as ESCAPED
from scheduler.escapes import Escapes
from scheduler.escapes import note as escape_note
from scheduler.kube import Kube
from scheduler.metrics import Usage
from scheduler.mps_health import RESTARTED, MpsHealth, daemons
from scheduler.mps_health import notices as mps_notices

log = logging.getLogger(__name__)

Submit = Callable[..., "Future[Any]"]


class Notices:
    """The Warning Events about pods, from the cache each housekeeping round."""

    def __init__(
        self, kube: Kube, cache: Cache, submit: Submit, namespace: str, escapes: Escapes | None
    ) -> None:
        self._kube = kube
        self._cache = cache
        self._submit = submit
        self._namespace = namespace  # gpupack's own (the escape note names it)
        self.escapes = escapes
        self._mps = MpsHealth()

    def report(self, leading: bool) -> None:
        self._escapes(leading)
        self._mps_restarts(leading)

    def _escapes(self, leading: bool) -> None:
        if self.escapes is None:
            return
        self.escapes.refresh()
        if not leading:
            return
        for pod in self.escapes.unreported():
            meta = pod["metadata"]
            text = escape_note(pod, self.escapes.namespace_of(pod), self._namespace)
            log.warning("%s/%s escaped gpupack: %s", meta["namespace"], meta["name"], text)
            self._event(pod, ESCAPED, text, "Admission")

    def _mps_restarts(self, leading: bool) -> None:
        cache = self._cache
        restarted = self._mps.restarted(c.pod for c in cache.capacity.values())
        if not leading or not restarted:
            return

        def gpu_of(name: str) -> str | None:
            capacity = cache.capacity.get(name)
            return capacity.gpu if capacity is not None else None

        for pod, text in mps_notices(restarted, gpu_of, cache.ledger.naming, cache.pod):
            log.warning("%s: %s", pod["metadata"].get("name"), text)
            self._event(pod, RESTARTED, text, "MPS")

    def _event(self, pod: JSON, reason: str, text: str, action: str) -> None:
        self._submit(writer.event, self._kube, pod, reason, text, warning=True, action=action)


def measure(
    cache: Cache, reservations: Mapping[str, object], leading: bool, escapes: Escapes | None
) -> Usage:
    gpus = list(cache.ledger.gpus.values())
    held = [g for g in gpus if not g.coming]
    mps, mps_ready = daemons(c.pod for c in cache.capacity.values())
    return Usage(
        gpus_held=len(held),
        gpus_coming=len(cache.capacity) - len(held),
        gpus_in_use=sum(1 for g in held if g.pods),
        compute_allocated=sum(g.used_compute for g in held),
        pending_pods=len(cache.pending),
        leader=leading,
        reservations=len(reservations),
        unhealthy=sum(1 for g in held if not g.healthy),
        overcommitted=len(cache.ledger.overcommitted()),
        escaped=0 if escapes is None else len(escapes.pods),
        mps_daemons=mps,
        mps_daemons_ready=mps_ready,
        oldest_pending=min((created(p.pod) for p in cache.pending.values()), default=None),
    )


def created(pod: JSON) -> float:
    """A pod's creationTimestamp in Unix seconds (now when it has none yet)."""
    stamp = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return time.time() if stamp is None else stamp
