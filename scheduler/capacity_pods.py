"""Creating capacity pods: how the scheduler (when a pod fits nowhere; it is their one
creator) turns "this pool lacks N GPUs" into pods on the API server.

It plans with the contract (`gpupack.packing.shortfall`); this module owns what follows:

- **claim**: names for the missing GPUs, the lowest free indices of the pool
  (`capacity_names`), counting the names already in flight as used. Claimed names are
  *in flight* (counted as GPUs on their way by the next plan) until the caller's
  informer shows them or `ttl` seconds pass, so two refusals a few milliseconds apart
  do not both create a GPU for the same pods.
- **create**: each name's manifest (`capacity_pod`), created with the one retry helper
  within a time budget. AlreadyExists is success: names are deterministic, so another
  writer that won the race (a predecessor's create still in flight after a restart)
  created the very same GPU; unless the pod of that name is on its way out (deleted,
  or finished: a capacity pod whose node went, which the pod garbage collector marks
  Failed and deletes), which is no GPU coming: then the name is created again once that
  pod is gone (`NAME_FREED`). On any other
  failure the names not created are released, and the next plan tries again.

Thread-safe: the scheduler claims under its lock and creates on its writer threads.
"""

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from gpupack import keys
from gpupack.capacity import DEFAULT_IMAGE, capacity_index, capacity_names
from gpupack.objects import JSON
from gpupack.runtime.api import ApiError, Backoff, retry
from gpupack.shares import is_live
from scheduler.manifest import ANYWHERE, Where, capacity_pod

log = logging.getLogger(__name__)

IN_FLIGHT_TTL: Final = 60.0  # seconds a claimed name counts before the informer shows it
CREATE_BUDGET: Final = 5.0  # seconds of retrying the creates of one claim
# Seconds a create waits for a capacity pod on its way out to free its name: past the
# capacity pods' termination grace period (5 s).
NAME_FREED: Final = 15.0


class PodCreator(Protocol):
    """The one verb this needs: create pods in the capacity namespace."""

    def create(self, path: str, body: JSON) -> JSON: ...

    def get(self, path: str) -> JSON: ...


@dataclass(frozen=True, slots=True)
class Created:
    """What `create` did: names created, names another writer had created, and the
    failure that stopped it (None when every name exists now)."""

    created: tuple[str, ...] = ()
    existing: tuple[str, ...] = ()
    failure: str | None = None


@dataclass
class CapacityCreator:
    """Claims names for a pool's missing GPUs and creates their capacity pods."""

    client: PodCreator
    namespace: str = keys.SYSTEM_NAMESPACE
    image: str = DEFAULT_IMAGE
    mps_image: str | None = None  # MPS pools' capacity pods (gpupack's image)
    ttl: float = IN_FLIGHT_TTL
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    attempts: int = 3
    budget: float = CREATE_BUDGET
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    # pool -> name -> (expiry, the placement key it was claimed for)
    _in_flight: dict[str, dict[str, tuple[float, str]]] = field(
        default_factory=dict, init=False, repr=False
    )

    def in_flight(
        self, pool: str, seen: Iterable[str] = (), placement: str | None = None
    ) -> tuple[str, ...]:
        """The pool's claimed names that are not `seen` yet (by the caller's informer) and
        have not expired (the others are forgotten); with `placement`, only those claimed
        for it (`scheduler.manifest.Where.key`)."""
        now, shown = self.clock(), set(seen)
        with self._lock:
            names = self._in_flight.get(pool, {})
            for name, (expires, _) in list(names.items()):
                if expires <= now or name in shown:
                    del names[name]
            return tuple(sorted(n for n, (_, key) in names.items() if placement in (None, key)))

    def shown(self, names: Iterable[str]) -> None:
        """Forget claimed names the caller's informer shows now, in every pool: they are
        counted as the capacity pods they are from now on, and once such a pod is gone it
        must not be counted as coming any longer (an in-flight name outlived a capacity
        pod deleted soon after it appeared, and its pool waited for the TTL)."""
        shown = set(names)
        with self._lock:
            for names_in_flight in self._in_flight.values():
                for name in shown.intersection(names_in_flight):
                    del names_in_flight[name]

    def claim(
        self, pool: str, count: int, used: Iterable[str], placement: str = ""
    ) -> tuple[str, ...]:
        """`count` names for new capacity pods of `pool`, not in `used` (the pool's
        capacity pods the caller knows) nor in flight; they are in flight from now on, as
        GPUs coming for pods with the requirements `placement` names."""
        if count <= 0:
            return ()
        with self._lock:
            names = self._in_flight.setdefault(pool, {})
            claimed = capacity_names(pool, [*used, *names], count)
            names.update(dict.fromkeys(claimed, (self.clock() + self.ttl, placement)))
        return claimed

    def _going(self, path: str) -> bool:
        """Whether the pod at `path` is on its way out: gone already, deleted, or finished
        (no GPU a pod can use). Unreadable: taken to be live, as before reading."""
        try:
            pod = self.client.get(path)
        except ApiError as error:
            return error.status == 404
        return not is_live(pod)

    def _create_when_freed(self, path: str, body: JSON) -> bool:
        """Create `body` once the pod of its name is gone, within `NAME_FREED` seconds;
        False if the name stayed taken (or another error came)."""
        deadline = self.clock() + NAME_FREED
        while True:
            try:
                self.client.create(path, body)
                return True
            except ApiError as error:
                if not error.already_exists or self.clock() >= deadline:
                    return False
            self.sleep(0.5)

    def release(self, pool: str, names: Iterable[str]) -> None:
        """Forget claimed names that will not be created (the next plan counts them out)."""
        with self._lock:
            in_flight = self._in_flight.get(pool, {})
            for name in names:
                in_flight.pop(name, None)

    def create(
        self,
        pool: str,
        names: Iterable[str],
        scheduling: JSON,
        created_for: str,
        *,
        where: Where = ANYWHERE,
        node_labels: Mapping[str, str] | None = None,
    ) -> Created:
        """Create the claimed `names` (blocking: API calls). `scheduling` is the pool's
        scheduling metadata, `created_for` the workload for the pod's annotation, `where`
        where they may and should go (`scheduler.manifest.Where`), `node_labels` how the
        nodes it avoids are named (`scheduler.manifest.capacity_pod`)."""
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        todo = list(names)
        created: list[str] = []
        existing: list[str] = []
        deadline = self.clock() + self.budget
        for position, name in enumerate(todo):
            index = capacity_index(pool, name)
            if index is None:
                raise ValueError(f"{name!r} is not a capacity pod name of pool {pool}")
            body = capacity_pod(
                pool,
                scheduling,
                index=index,
                created_for=created_for,
                image=self.image,
                mps_image=self.mps_image,
                namespace=self.namespace,
                where=where,
                node_labels=node_labels,
            )
            try:
                retry(
                    functools.partial(self.client.create, path, body),
                    attempts=self.attempts,
                    backoff=Backoff(base=0.1, cap=1.0),
                    sleep=self.sleep,
                    retryable=lambda error: error.retryable and self.clock() < deadline,
                )
            except ApiError as error:
                failure = None
                if not error.already_exists:
                    failure = f"creating capacity pod {name} failed: {error}"
                elif not self._going(f"{path}/{name}"):
                    existing.append(name)  # another writer won the race: the same GPU
                elif not self._create_when_freed(path, body):
                    failure = (
                        f"capacity pod {name} was still on its way out after "
                        f"{NAME_FREED:g} s; its name is free for the next plan"
                    )
                else:
                    created.append(name)
                if failure is not None:
                    log.warning("pool %s: %s", pool, failure)
                    self.release(pool, todo[position:])
                    return Created(tuple(created), tuple(existing), failure)
            else:
                created.append(name)
            with self._lock:  # counted until the informer shows it
                self._in_flight.setdefault(pool, {})[name] = (
                    self.clock() + self.ttl,
                    where.key,
                )
        if created:
            log.info("pool %s: created capacity pods %s", pool, ", ".join(created))
        return Created(tuple(created), tuple(existing))
