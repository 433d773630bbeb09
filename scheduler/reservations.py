"""The GPU shares the extender holds for pods between filter and bind: one owner.

kube-scheduler filters the next pod before the previous one is bound, so the share
chosen at filter must count at once, as kube-scheduler's cache assumes a pod. A
reservation is that share, and only this class makes and gives back reservations: its
own table, the snapshot's booking (`Ledger.assume` / `forget`), the cache's `assumed`
set and the pod's place among the cache's `pending` pods change together here. The
cache's informer side keeps `assumed` in step with the cluster (below).

```
               reserve (filter chose a GPU)
  pending ─────────────────────────────────────► reserved
     ▲                                              │ binding (the writes start:
     │ release (filtered again, bind failed,        │ never expired meanwhile)
     │ bound elsewhere, never bound in time)        ▼
     └───────────────────────────────────────── binding
                                                    │ confirm (bound)
                                                    ▼
                          booked: the informer's copy of the bound pod takes over
```

A reservation also ends when the informer shows its pod deleted or bound (the cache
drops the key from `assumed` and books the pod from its annotations); `expire` forgets
those. Not thread-safe: the extender calls it under its lock.
"""

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gpupack.objects import JSON
from scheduler.cache import Cache
from scheduler.ledger import Request
from scheduler.placement import Placement

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Reservation:
    """A GPU share held for a pod between filter and bind."""

    uid: str
    node: str
    gpu: str
    holder: str  # the capacity pod holding the GPU
    request: Request
    pod: JSON  # as filtered: its resourceVersion is the bind's precondition
    since: float
    binding: bool = False  # the writes are running: never expired meanwhile


class Reservations(Mapping[str, Reservation]):
    """The live reservations by pod key (read as a mapping); `reserve`, `release`,
    `confirm` and `expire` are the only ways they change."""

    def __init__(self, cache: Cache) -> None:
        self._cache = cache
        self._held: dict[str, Reservation] = {}

    def __getitem__(self, key: str) -> Reservation:
        return self._held[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def booked(self, key: str) -> bool:
        """Whether the pod's share is booked and not yet seen bound by the informer: a
        reservation's, or one the cache kept across a relist."""
        return key in self._cache.assumed

    def reserve(
        self, key: str, pod: JSON, request: Request, placement: Placement, now: float
    ) -> Reservation:
        """Book `placement` for the pod: pending → reserved."""
        snapshot = self._cache.ledger
        snapshot.assume(request, placement.node, placement.gpus)
        self._cache.assumed.add(key)
        self._cache.pending.pop(key, None)
        uuid = placement.gpus[0]
        held = self._held[key] = Reservation(
            uid=str(pod["metadata"].get("uid", "")),
            node=placement.node,
            gpu=uuid,
            holder=snapshot.gpus[uuid].holder,
            request=request,
            pod=pod,
            since=now,
        )
        return held

    def release(self, key: str, why: str) -> bool:
        """Give the pod's share back: reserved or binding → pending (from the informer's
        copy of the pod). False when there was nothing to give back."""
        held = self._held.pop(key, None)
        if held is None or key not in self._cache.assumed:
            return False
        log.debug("released reservation", extra={"pod": key, "gpu": held.gpu, "why": why})
        self._cache.assumed.discard(key)
        self._cache.ledger.forget(key)
        self._cache.dirty.pod(key)
        return True

    def confirm(self, key: str, held: Reservation) -> None:
        """The pod is bound as `held` said: binding → booked. The snapshot keeps the
        booking (`assumed`) until the informer's copy of the bound pod replaces it."""
        if self._held.get(key) is held:
            del self._held[key]

    def expire(self, now: float, timeout: float) -> list[str]:
        """Forget reservations the informer showed bound or deleted; release those not
        binding after `timeout` seconds. The keys released."""
        released = []
        for key, held in list(self._held.items()):
            if key not in self._cache.assumed:  # deleted, or bound (the cache books it)
                del self._held[key]
            elif not held.binding and now - held.since > timeout:
                self.release(key, "never bound")
                released.append(key)
        return released
