"""The capacity lifecycle: scale up when pods fit nowhere, scale down what nothing can
use, mark what hosts pods for the autoscalers, evict pods whose GPU nobody holds.

Called by the extender under its lock (it reads the extender's cache), but for
`ensure_hosting`, which a bind calls and which takes the lock itself; the waiting room
(`scheduler.waiting`) asks it for capacity. API writes go to the extender's thread pool
through `submit`.

- **Scale up:** the first-fit plan of the pool's waiting pods over its coming GPUs says
  how many capacity pods are missing; they are created under deterministic names
  (`scheduler.capacity_pods`: a retry, or another replica after a failover, collides).
  Each may land only where the pod it is made for could then run: never on an
  existing node kube-scheduler found infeasible for it, and next to what its required
  pod affinity names; among those it prefers the feasible
  nodes, then nodes that already hold GPUs (`scheduler.manifest.Where`). The nodes it
  avoids are named so that the cluster's autoscaler acts on the pod: by their
  `gpupack.io/node` label where Karpenter runs, which housekeeping writes on every GPU
  node, else by hostname (`scheduler.exclusion`).
- **Released for another pool:** an empty capacity pod on a node where a waiting pod of
  another pool may go, whose own capacity pod kube-scheduler cannot place, is deleted at
  once rather than after the grace period: its GPU is the one that pod needs.
- **Scale down:** a capacity pod with nothing booked on its GPU for `grace_period`
  seconds (`unused_grace` for one created since this extender started that never
  hosted a share: a burst's capacity its pods did not need) is deleted (uid and
  resourceVersion preconditions), unless a waiting pod of
  its pool could use it: its GPU is not on a node yet, or on a node the pod may go to
  with the memory the pod asks, or its pool keeps it as headroom (`scheduler.headroom`:
  room for one more pod like the largest it runs, made up from empty GPUs only where its
  used GPUs lack it). A pod larger than every GPU of its pool gets no more of them.
  So a capacity pod that landed where its pool's pods cannot go (their anti-affinity,
  spread or volumes exclude the node) does not hold a GPU for long.
- **Consolidated:** a capacity pod whose GPU consolidation drained (`scheduler.drain`,
  `gpupack.io/draining`) is deleted as soon as nothing is booked on it; so is one on a
  node an autoscaler is removing (`keys.AUTOSCALER_REMOVAL_TAINTS`): it must not keep
  the node, and placement puts nothing new there.
- **Hosting:** the one owner of the `gpupack.io/hosting` label: written before the first
  bind on a capacity pod's GPU (`ensure_hosting`), taken off by housekeeping once
  nothing runs there. One hosting pods carries the autoscalers' do-not-evict
  annotations.
- **Orphans:** a pod bound to a GPU that no capacity pod holds any more (someone
  deleted it, its node went away) gets a Warning Event and is evicted through the
  Eviction API after `orphan_grace` seconds: its controller recreates it and the new pod
  is placed on a GPU that is held. Nothing keeps running on a GPU nobody accounts for.
- **Over-committed GPUs:** a pod running on a GPU whose books cannot hold its share
  (`Booking.over`: the objects said more than the GPU has) gets one Warning Event
  `GPUOvercommitted` and a log line, and is counted in
  `gpupack_scheduler_overcommitted_pods`; the GPU takes no new pods until it fits.
  It is not evicted: it may be the workload that was there first.
"""

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gpupack import keys
from gpupack.capacity import placement_of
from gpupack.objects import JSON
from gpupack.packing import Allocation, PlanGpu, shortfall
from gpupack.runtime.api import ApiError
from gpupack.shares import scheduling_of, workload
from scheduler import writer
from scheduler.cache import Cache, Capacity
from scheduler.capacity_pods import CapacityCreator
from scheduler.exclusion import Autoscaler, NodeLabels, already_excluded
from scheduler.headroom import pools_headroom
from scheduler.kube import Kube
from scheduler.ledger import Gpu
from scheduler.manifest import MAX_NODES, Where, affinity_to_others, holding_nodes
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.waiting import Waiting, unschedulable

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(
        self,
        kube: Kube,
        cache: Cache,
        settings: Settings,
        submit: Callable[..., Any],
        metrics: Metrics | None = None,
        lock: "threading.Lock | None" = None,
    ) -> None:
        self._kube = kube
        self.cache = cache
        self._lock = lock or threading.Lock()  # the cache's: `ensure_hosting` runs outside it
        self._settings = settings
        self._submit = submit
        self._metrics = metrics
        self.node_labels = NodeLabels(kube, Autoscaler(settings.autoscaler), written=self._written)
        self._creator = CapacityCreator(
            kube,
            namespace=settings.namespace,
            image=settings.capacity_image,
            mps_image=settings.mps_image,
        )
        self._empty_since: dict[str, float] = {}
        self._orphan_since: dict[str, float] = {}
        self._evicting: set[str] = set()
        self._overcommitted: set[str] = set()  # pods reported over-committed
        # Capacity pods first seen after the first housekeeping round that have hosted no
        # share yet: deleted after `unused_grace`, not `grace_period`, once nothing wants
        # them. Those there at start may have hosted shares before a restart: not fresh.
        self._fresh: set[str] | None = None
        self._known: set[str] = set()  # capacity pods seen at the last round
        self.headroom: frozenset[str] = frozenset()  # empty GPUs kept as pools' headroom
        # Capacity pod -> the resourceVersion our cache had when we labelled it hosting:
        # until the informer brings the labelled copy, the next binds need not label again.
        self._marked: dict[str, str] = {}
        self._mark_gates: dict[str, threading.Lock] = {}  # one label write per capacity pod
        # pool -> node -> (the Node object judged, whether the pool's inherited
        # constraints keep capacity off it): `requirements`, for the nodes it asks about.
        self._excluded: dict[str, dict[str, tuple[JSON | None, bool]]] = {}

    def _written(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.node_labels.labels(result=result).inc()

    def requirements(
        self,
        example: JSON,
        pool: str,
        feasible: Collection[str],
        memory: int,
        judged: float | None,
    ) -> Where:
        """Where a new GPU for `example` (of `pool`), which asks `memory` bytes of it, may
        land (`scheduler.manifest.Where`): not on a GPU node kube-scheduler found infeasible
        for it (`feasible` are the nodes it let the pod go to; a node that does not exist
        yet is fine), nor on one whose GPUs are known to be smaller than that, and next to
        the pods its required pod affinity names. Nodes the capacity pod's inherited
        constraints keep it off already are not named (`scheduler.exclusion`); that
        verdict is kept per pool and node object, since every refused filter asks. A node an
        autoscaler is removing is avoided even where feasible: placement puts nothing on its
        GPUs, so a capacity pod there would be given back at once, again and again; so is
        one whose every GPU consolidation is draining (`scheduler.relocation` empties it for
        the autoscaler: the pods it moves must not come back). Nor
        is a node still starting (`scheduler.exclusion.starting`, one an autoscaler just
        added, maybe for this very pod): kube-scheduler refuses every pod there until it
        is ready, and naming it would ask a GPU elsewhere for pods whose GPU is coming
        there, and change where their GPUs may land while it starts. Nor, when
        kube-scheduler's filter `judged` the pod then, one that began taking pods less
        than `SETTLING` seconds before (`Cache.settling`): its verdict may be about the
        node as it was before (a GPU node bought for a burst, named as avoided, made the
        next capacity pod a node of its own). `judged` is None for a verdict known to be
        about the nodes as they are (`Extender._adopt_unplaceable` waits for one)."""
        verdicts = self._excluded.setdefault(pool, {})
        scheduling: JSON | None = None
        avoid = []
        for name, size in self.cache.gpu_nodes.items():
            if name in feasible and not 0 < size < memory and not self._unusable(name):
                continue
            if name not in feasible and self.cache.settling(name, judged):
                continue
            node = self.cache.node(name)
            known = verdicts.get(name)
            if known is None or known[0] is not node:
                if scheduling is None:
                    scheduling = scheduling_of(example)
                known = verdicts[name] = (node, already_excluded(scheduling, node))
            if not known[1]:
                avoid.append(name)
        return Where(avoid=tuple(sorted(avoid)), near=affinity_to_others(example))

    def _unusable(self, name: str) -> bool:
        """Whether a GPU new on node `name` would take nothing: an autoscaler is removing
        the node, or consolidation is draining every GPU held there."""
        node = self.cache.ledger.nodes.get(name)
        if node is None:
            return False
        return node.removing or (bool(node.gpus) and all(g.draining for g in node.gpus))

    def request(
        self,
        pool: str,
        example: JSON,
        waiting: list[Allocation],
        required: Where,
        feasible: Collection[str] = (),
    ) -> None:
        """Create the capacity pods `pool` lacks for `waiting`, its pods that fit nowhere
        and whose GPUs may land where `required` says (`requirements` of `example`, one
        of them, whose scheduling metadata is the pool's); `feasible` the nodes
        kube-scheduler let `example` go to. Only GPUs coming with the same requirements
        count for them: a GPU bound for another node helps them not. A pod asking more
        memory than the largest GPU the pool holds gets none: another such GPU would not
        take it either (its FailedScheduling says `insufficient GPU memory`)."""
        key = required.key
        seen = [*self.cache.capacity, *self.cache.leaving]
        creating = self._creator.in_flight(pool, seen=seen, placement=key)
        coming = [PlanGpu(c.name) for c in self.cache.coming(pool) if placement_of(c.pod) == key]
        coming += [PlanGpu(name) for name in creating]
        known = [g.memory for g in self.cache.ledger.gpus.values() if g.pool == pool and g.memory]
        if known:
            waiting = [a for a in waiting if a.memory <= max(known)]
        missing = shortfall(coming, waiting, new_gpu_memory=min(known) if known else None).missing
        used = [c.name for c in self.cache.capacity.values() if c.pool == pool]
        used += self.cache.leaving  # a name reused before its pod is gone is no new GPU
        names = self._creator.claim(pool, missing, used, placement=key)
        if not names:
            return
        where = Where(
            steer=tuple(sorted(feasible)),
            packed=tuple(holding_nodes(c.pod for c in self.cache.capacity.values())),
            avoid=required.avoid,
            near=required.near,
        )
        spec = scheduling_of(example)
        owner = f"{example['metadata'].get('namespace')}/{workload(example)}"
        labels = {n: v for n in where.avoid if (v := self.cache.node_label(n))}
        for name in names:
            self._submit(self._create_capacity, pool, name, spec, owner, example, where, labels)

    def _create_capacity(
        self,
        pool: str,
        name: str,
        spec: JSON,
        owner: str,
        example: JSON,
        where: Where,
        known: Mapping[str, str],
    ) -> None:
        node_labels = None
        if where.avoid and len(where.avoid) <= MAX_NODES and self.node_labels.by_label():
            try:
                node_labels = self.node_labels.ensure(where.avoid, known)
            except ApiError as error:
                self._creator.release(pool, (name,))
                log.warning(
                    "not creating capacity pod %s: the nodes it must avoid cannot all be "
                    "labelled %s: %s",
                    name,
                    keys.NODE,
                    error,
                )
                return
        made = self._creator.create(
            pool, (name,), spec, owner, where=where, node_labels=node_labels
        )
        if made.failure is not None:
            log.warning("could not create capacity pod %s: %s", name, made.failure)
            return
        if made.created:
            if self._metrics is not None:
                self._metrics.capacity_created.inc()
            writer.event(
                self._kube,
                example,
                "CapacityRequested",
                f"no GPU of pool {pool} had room; created capacity pod {name}",
                instance=self._settings.identity,
            )

    # The hosting label.

    def ensure_hosting(self, holder: str) -> None:
        """Label the capacity pod `holder` hosting before the first pod lands on its GPU
        (a bind, outside the cache's lock): from then on the API server refuses to delete
        or evict it, so its GPU stays held while anything runs. kube-scheduler binds in
        parallel: one bind per capacity pod writes the label, the others wait for it
        rather than write it again. Housekeeping takes it off once nothing runs there."""
        with self._lock:
            gate = self._mark_gates.setdefault(holder, threading.Lock())
        with gate:
            with self._lock:
                pod = self._unmarked(holder)
            if pod is None:
                return
            writer.mark_hosting(self._kube, pod, True)
            with self._lock:
                self._marked[holder] = pod["metadata"].get("resourceVersion", "")

    def _unmarked(self, holder: str) -> JSON | None:
        """The capacity pod `holder` when it still needs the hosting label, else None."""
        capacity = self.cache.capacity.get(holder)
        if capacity is None or writer.hosting(capacity.pod):
            self._marked.pop(holder, None)
            return None
        version = capacity.pod["metadata"].get("resourceVersion", "")
        return None if self._marked.get(holder) == version else capacity.pod

    def tidy(self) -> None:
        """Forget the hosting labels written for capacity pods that are gone (every
        round, leading or not: binds label while following too)."""
        for holder in [h for h in self._marked if h not in self.cache.capacity]:
            del self._marked[holder]
        for holder in [h for h in self._mark_gates if h not in self.cache.capacity]:
            del self._mark_gates[holder]

    # Housekeeping.

    def housekeeping(self, now: float, waiting: Mapping[str, Waiting]) -> None:
        """Scale down, autoscaler annotations, orphans. `waiting`: the pods that fit on no
        GPU at their last filter."""
        snapshot = self.cache.ledger
        self._creator.shown(self.cache.capacity)
        by_pool: dict[str, list[Waiting]] = {}
        for entry in waiting.values():
            by_pool.setdefault(entry.pool, []).append(entry)
        released = self._release_for_other_pools(by_pool)
        self._label_nodes()
        self._forget_verdicts(by_pool)
        fresh = self._fresh_capacity()
        empty: list[tuple[str, Capacity, Gpu | None]] = []
        for name, capacity in list(self.cache.capacity.items()):
            if name in released:
                continue
            gpu = snapshot.gpus.get(capacity.gpu) if capacity.gpu else None
            pods = gpu.pods if gpu is not None else 0
            if pods > 0:
                fresh.discard(name)
            if gpu is not None and not gpu.coming and (pods > 0) != writer.hosting(capacity.pod):
                self._submit(self._mark, capacity.pod, pods > 0)
            usable = any(_could_use(e, gpu, capacity.pod) for e in by_pool.get(capacity.pool, ()))
            if pods > 0 or usable:
                self._empty_since.pop(name, None)
                continue
            empty.append((name, capacity, gpu))
        self.headroom = self._headroom([g for _, _, g in empty if g is not None])
        for name, capacity, gpu in empty:
            # At once: `scheduler.drain` emptied it, or an autoscaler is removing its node.
            reason = "empty"
            if gpu is not None and gpu.draining:
                reason = "consolidated"
            elif gpu is not None and gpu.removing:
                reason = "node-removed"
            elif gpu is not None and gpu.uuid in self.headroom:
                self._empty_since.pop(name, None)  # its grace begins once it is not needed
                continue
            since = self._empty_since.setdefault(name, now)
            grace = self._settings.unused_grace if name in fresh else self._settings.grace_period
            if reason != "empty" or now - since >= grace:
                del self._empty_since[name]
                self._submit(self._delete_capacity, capacity.pod, now - since, reason)
        for name in [n for n in self._empty_since if n not in self.cache.capacity]:
            del self._empty_since[name]
        self._evict_orphans(now)
        self._report_overcommitted()

    def _headroom(self, empty: list[Gpu]) -> frozenset[str]:
        """The empty running GPUs each pool keeps as its headroom (`scheduler.headroom`)."""
        return pools_headroom(self.cache.ledger, empty, self._settings.headroom_pods)

    def _forget_verdicts(self, by_pool: Mapping[str, list[Waiting]]) -> None:
        """Drop `requirements`' kept verdicts of pools nothing waits in any more, and of
        nodes that are gone."""
        for pool in [p for p in self._excluded if p not in by_pool]:
            del self._excluded[pool]
        for verdicts in self._excluded.values():
            for name in [n for n in verdicts if n not in self.cache.gpu_nodes]:
                del verdicts[name]

    def _label_nodes(self) -> None:
        """Have the GPU nodes without a `gpupack.io/node` label labelled, a few a round,
        long before a capacity pod needs to name them (`scheduler.exclusion`)."""
        if not self.node_labels.may_label():
            return
        unlabelled = [n for n in self.cache.gpu_nodes if not self.cache.node_label(n)]
        claimed = self.node_labels.label_missing(unlabelled)
        if claimed:
            self._submit(self.node_labels.write, claimed)

    def _fresh_capacity(self) -> set[str]:
        """The capacity pods that never hosted a share since this extender first saw them,
        first seen after its first round (kept up to date: the caller discards the ones
        that host)."""
        names = set(self.cache.capacity)
        if self._fresh is None:
            self._known, self._fresh = names, set()
        self._fresh |= names - self._known
        self._fresh &= names
        self._known = names
        return self._fresh

    def _release_for_other_pools(self, by_pool: Mapping[str, list[Waiting]]) -> set[str]:
        """Delete, without waiting for the grace period, empty capacity pods that hold a
        GPU another pool's waiting pod needs: that pool's own capacity pod cannot be
        placed (kube-scheduler found no node for it), and the empty one sits on a node
        the waiting pod may go to while no pod of its own pool could use it. At most one
        per such stuck capacity pod. Returns the names deleted."""
        stuck: dict[str, int] = {}
        for capacity in self.cache.capacity.values():
            if capacity.gpu is None and unschedulable(capacity.pod) is not None:
                stuck[capacity.pool] = stuck.get(capacity.pool, 0) + 1
        released: set[str] = set()
        snapshot = self.cache.ledger
        for pool, wanted in stuck.items():
            nodes = set().union(*(w.nodes for w in by_pool.get(pool, ())))
            left = wanted
            for name, capacity in self.cache.capacity.items():
                if left == 0:
                    break
                gpu = snapshot.gpus.get(capacity.gpu) if capacity.gpu else None
                if capacity.pool == pool or name in released or gpu is None:
                    continue
                if gpu.pods or gpu.node not in nodes or writer.hosting(capacity.pod):
                    continue
                if any(_could_use(e, gpu, capacity.pod) for e in by_pool.get(capacity.pool, ())):
                    continue
                released.add(name)
                left -= 1
                self._empty_since.pop(name, None)
                log.info("releasing empty %s for pool %s, whose capacity fits nowhere", name, pool)
                self._submit(self._delete_capacity, capacity.pod, 0.0, "released-for-pool")
        return released

    def _report_overcommitted(self) -> None:
        over = {b.request.key: b for b in self.cache.ledger.overcommitted()}
        self._overcommitted &= over.keys()
        for key in sorted(over.keys() - self._overcommitted):
            pod = self.cache.pod(key)
            if pod is None:
                continue
            self._overcommitted.add(key)
            booking = over[key]
            note = (
                f"this pod runs on GPU {', '.join(booking.over)}, whose other pods already "
                f"hold its compute or memory (it asks {booking.request.compute}m and "
                f"{booking.request.gpu_memory} bytes); it is not booked there and the GPU "
                "takes no new pods until it fits"
            )
            log.warning("%s is over-committed: %s", key, note)
            self._submit(writer.event, self._kube, pod, "GPUOvercommitted", note, warning=True)

    def _mark(self, pod: JSON, hosting: bool) -> None:
        try:
            writer.mark_hosting(self._kube, pod, hosting)
        except ApiError as error:
            log.warning("could not annotate %s: %s", pod["metadata"]["name"], error)

    def _delete_capacity(self, pod: JSON, empty_for: float, reason: str = "empty") -> None:
        try:
            deleted = writer.delete_capacity(self._kube, pod)
        except ApiError as error:
            log.warning("could not delete %s: %s", pod["metadata"]["name"], error)
            return
        if deleted:
            log.info("deleted capacity pod %s, empty for %.0fs", pod["metadata"]["name"], empty_for)
            if self._metrics is not None:
                self._metrics.capacity_deleted.labels(reason=reason).inc()

    def _evict_orphans(self, now: float) -> None:
        orphans = {b.request.key for b in self.cache.orphans()}
        for key in [k for k in self._orphan_since if k not in orphans]:
            del self._orphan_since[key]
        self._evicting &= orphans
        for key in sorted(orphans - self._evicting):
            since = self._orphan_since.setdefault(key, now)
            if now - since < self._settings.orphan_grace:
                continue
            pod = self.cache.pod(key)
            if pod is None:
                continue
            self._evicting.add(key)
            self._submit(self._evict, pod)

    def _evict(self, pod: JSON) -> None:
        meta = pod["metadata"]
        note = (
            f"the capacity pod {meta.get('annotations', {}).get(keys.CAPACITY_POD)} holding this "
            "pod's GPU is gone; evicting it so its controller recreates it on a held GPU"
        )
        writer.event(self._kube, pod, "GPUCapacityLost", note, warning=True, action="Evicting")
        try:
            writer.evict(self._kube, pod)
        except ApiError as error:
            log.warning("could not evict %s/%s: %s", meta["namespace"], meta["name"], error)
            return
        if self._metrics is not None:
            self._metrics.evicted.inc()


def _could_use(waiting: Waiting, gpu: Gpu | None, holder: JSON) -> bool:
    """Whether a pod that waits could use a capacity pod's GPU: it is not on a node yet
    and was made for pods with the pod's requirements, or it is on a node the pod may go
    to, with the memory the pod asks (or unknown)."""
    if gpu is None:
        return placement_of(holder) == waiting.placement
    if gpu.draining:
        return False  # placement puts nothing new on it
    return gpu.node in waiting.nodes and (not gpu.memory or waiting.allocation.memory <= gpu.memory)
