"""The exporter's shell: the sampler, the PID table, the node's pods and kubelet, wired.

`scrape()` gathers one consistent `Scrape` for the collector: the sampler's readings,
the owner of every PID in them, the node's pods, the health of each source.
`discover()` asks kubelet which GPU each capacity pod on this node holds and writes it
on the pod (`exporter.discovery` decides what to write). Both keep going when a source
is down; `Health` records the state and logs each change once.
"""

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Final, Protocol

from exporter.cgroup import ProcessOwner
from exporter.collector import Scrape
from exporter.discovery import RESOURCE, plan
from exporter.health import API, POD_RESOURCES, Health
from exporter.kube import Kube
from exporter.pods import UID_INDEX, PodInfo, PodMap, uid_index
from exporter.readings import Device, Readings
from exporter.shims import Roster, mark
from gpupack.runtime.api import ApiError, ListWatch
from gpupack.runtime.informer import Informer

log = logging.getLogger(__name__)


def node_pods(
    client: ListWatch, node: str, on_change: Callable[[str], None] | None = None
) -> Informer:
    """An informer over the pods bound to `node` (the only ones the exporter can see),
    indexed as `PodMap` reads it."""
    return Informer(
        client,
        "/api/v1/pods",
        {"fieldSelector": f"spec.nodeName={node}"},
        name="node pods",
        indexers={UID_INDEX: uid_index},
        on_change=on_change,
    )


DISCOVERY_INTERVAL: Final = 10.0


class Sampling(Protocol):
    def readings(self) -> Readings: ...

    def devices(self) -> list[Device]: ...

    def unhealthy(self) -> dict[str, str]: ...


class PodDevices(Protocol):
    """One pod in kubelet's pod-resources answer."""

    @property
    def name(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    def device_ids(self, resource_name: str) -> tuple[str, ...]: ...


class Processes(Protocol):
    """Who owns a host PID (`exporter.cgroup.ProcessTable`)."""

    def owner(self, pid: int) -> ProcessOwner: ...

    def forget_missing(self, live_pids: Collection[int]) -> int: ...


class Lister(Protocol):
    def list(self) -> Sequence[PodDevices]: ...


class ClaimGpus(Protocol):
    """The GPUs DRA gave a pod through a ResourceClaim (`exporter.claims.ClaimReader`)."""

    def uuids(
        self, namespace: str, claim: str, requests: tuple[str, ...]
    ) -> tuple[tuple[str, ...], str]: ...

    def keep_only(self, claims: Collection[tuple[str, str]]) -> None: ...


class Agent:
    def __init__(
        self,
        kube: Kube,
        pods: PodMap,
        sampler: Sampling,
        processes: Processes,
        lister: Lister,
        health: Health,
        *,
        lister_errors: tuple[type[Exception], ...] = (),
        claims: ClaimGpus | None = None,
        roster: Roster | None = None,
    ) -> None:
        self._kube = kube
        self._claims = claims
        self._roster = roster  # which pod processes run the memory shim (exporter.shims)
        self._pods = pods
        self._sampler = sampler
        self._processes = processes
        self._processes_lock = threading.Lock()  # the table is single-threaded
        self._lister = lister
        self._lister_errors = lister_errors or (Exception,)
        self.health = health
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._problems: frozenset[str] = frozenset()

    def scrape(self) -> Scrape:
        readings = self._sampler.readings()
        pids = {process.pid for gpu in readings.gpus for process in gpu.processes}
        with self._processes_lock:  # scrapes may overlap
            owners = {pid: self._processes.owner(pid) for pid in sorted(pids)}
            self._processes.forget_missing(pids)
        if self._roster is not None:
            owners = mark(owners, self._roster)
        pods = {pod.uid: pod for pod in self._pods.all()}
        return Scrape(readings, owners, pods, self.health.snapshot())

    def wake(self) -> None:
        """Run discovery soon (a capacity pod on this node changed)."""
        self._wake.set()

    def discover(self) -> int:
        """Annotate the capacity pods whose GPU kubelet knows; the number patched."""
        if not self._pods.synced:
            self.health.failed(API, self._pods.error or "the node's pods are not listed yet")
            return 0
        watch_error = self._pods.error
        try:
            answer = self._lister.list()
        except self._lister_errors as error:
            self.health.failed(POD_RESOURCES, str(error))
            return 0
        self.health.ok(POD_RESOURCES)
        allocated: dict[tuple[str, str], Sequence[str]] = {}
        for pod in answer:
            ids = pod.device_ids(RESOURCE)
            if ids:
                allocated[(pod.namespace, pod.name)] = ids
        capacity = [pod for pod in self._pods.all() if pod.capacity]
        unresolved = self._claimed(capacity, allocated)
        decided = plan(
            capacity, allocated, self._sampler.devices(), self._sampler.unhealthy(), unresolved
        )
        self._report(decided.problems)
        patched, failed = 0, False
        for patch in decided.patches:
            body = {
                "metadata": {
                    "resourceVersion": patch.resource_version,
                    "annotations": dict(patch.annotations),
                }
            }
            try:
                self._kube.patch(f"/api/v1/namespaces/{patch.namespace}/pods/{patch.name}", body)
            except ApiError as error:
                if error.status in (404, 409):  # gone, or changed since: the watch says how
                    continue
                self.health.failed(API, f"annotating {patch.namespace}/{patch.name}: {error}")
                failed = True
                continue
            patched += 1
            log.info(
                "capacity pod holds GPU",
                extra={
                    "pod": f"{patch.namespace}/{patch.name}",
                    "annotations": dict(patch.annotations),
                },
            )
        if watch_error:  # discovery went on with the pods known before the outage
            self.health.failed(API, f"watching the node's pods: {watch_error}")
        elif not failed:
            self.health.ok(API)
        return patched

    def _claimed(
        self, capacity: Sequence[PodInfo], allocated: dict[tuple[str, str], Sequence[str]]
    ) -> dict[tuple[str, str], str]:
        """Add to `allocated` the GPUs DRA gave the Running capacity pods kubelet lists no
        device for (their ResourceClaims); why, for those it could not name."""
        unresolved: dict[tuple[str, str], str] = {}
        if self._claims is None:
            return unresolved
        self._claims.keep_only({(p.namespace, p.claim) for p in capacity if p.claim})
        for pod in capacity:
            key = (pod.namespace, pod.name)
            if key in allocated or not pod.claim or pod.phase != "Running":
                continue
            uuids, why = self._claims.uuids(pod.namespace, pod.claim, pod.claim_requests)
            if uuids:
                allocated[key] = uuids
            else:
                unresolved[key] = why
        return unresolved

    def _report(self, problems: Sequence[str]) -> None:
        current = frozenset(problems)
        for problem in sorted(current - self._problems):
            log.warning("%s", problem)
        self._problems = current

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run_discovery(self, interval: float = DISCOVERY_INTERVAL) -> None:
        """Discover every `interval` seconds, or sooner when woken, until `stop()`."""
        while not self._stop.is_set():
            try:
                self.discover()
            except Exception as error:  # the loop must outlive any one bad answer
                log.exception("discovery failed")
                self.health.failed(POD_RESOURCES, f"discovery failed: {error}")
            self._wake.wait(interval)
            self._wake.clear()
