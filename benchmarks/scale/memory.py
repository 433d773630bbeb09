"""What the extender and the webhook keep per pod and per node, from a real API server.

The components' own classes, pointed at the cluster the scale benchmark filled: the
scheduler's informers (nodes; every live pod) and its `Cache` (the GPU ledger built from
them), and the webhook's `Cluster` (namespaces, capacity pods, fractional pods, policies,
recommendations). What each keeps is the Python heap it holds once synced (tracemalloc,
after a collection), split by what it is kept for:

- scheduler, per node: the nodes' store and a `Cache` over nodes alone;
- scheduler, per pod: the pods' store and what a `Cache` over both adds to that;
- webhook, per pod: everything its `Cluster` keeps, over the pods it watches (gpupack's
  fractional pods and capacity pods; its namespaces and policies are a few objects).

Each is scaled to 10,000 pods and 1,000 nodes (linear: each pod and node costs about
the same), once as the components keep objects (without `metadata.managedFields`; the
webhook only the fields capacity planning reads) and once with every object kept whole,
as the API server sends it (as they did before), the baseline in the same run. A
process's resident memory adds the interpreter and libraries (about 60 MiB) and what the
C heap keeps after peaks: the scale benchmark's peak figures are those.
"""

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from gpupack.objects import JSON
from gpupack.runtime.informer import Informer
from gpupack.runtime.transport import Transport
from scheduler.cache import Cache, Dirty
from scheduler.cli import LIVE_PODS
from webhook.cluster import Cluster

SYNC_SECONDS = 120.0
PODS, NODES = 10_000, 1_000
MIB = 1024 * 1024


class _Empty:
    """A store with nothing in it: a `Cache` over nodes alone."""

    def get(self, key: str) -> JSON | None:
        return None

    def items(self) -> list[JSON]:
        return []


@contextmanager
def _traced() -> Iterator[Callable[[], int]]:
    """A function that says how many bytes are held now beyond those held on entry."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]

    def held() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base

    try:
        yield held
    finally:
        tracemalloc.stop()


def _synced(informer: Informer) -> Informer:
    informer.start()
    if not informer.wait_synced(SYNC_SECONDS):
        raise RuntimeError(f"the {informer.name} informer did not sync in {SYNC_SECONDS:g} s")
    return informer


def _scheduler(connect: Callable[[], Transport]) -> dict[str, Any]:
    client = connect()
    nodes = pods = None
    try:
        with _traced() as held:
            nodes = _synced(Informer(client, "/api/v1/nodes", name="nodes"))
            node_store = held()
            alone = Cache(nodes, _Empty(), Dirty())
            alone.refresh()
            node_books = held() - node_store
            del alone
            pods = _synced(
                Informer(client, "/api/v1/pods", {"fieldSelector": LIVE_PODS}, name="pods")
            )
            pod_store = held() - node_store
            cache = Cache(nodes, pods, Dirty())
            cache.refresh()
            pod_books = held() - node_store - pod_store - node_books
            node_count, pod_count = len(nodes.items()), len(pods.items())
            del cache
    finally:
        for informer in (nodes, pods):
            if informer is not None:
                informer.stop()
        client.close()
    return {
        "nodes": node_count,
        "pods": pod_count,
        "mib_per_1k_nodes": round((node_store + node_books) / node_count * NODES / MIB, 1),
        "mib_per_10k_pods": round((pod_store + pod_books) / pod_count * PODS / MIB, 1),
        "books_share": round(
            (node_books + pod_books) / (node_store + pod_store + node_books + pod_books), 2
        ),
    }


def _webhook(connect: Callable[[], Transport]) -> dict[str, Any]:
    cluster = Cluster(connect())
    try:
        with _traced() as held:
            cluster.start()
            for informer in (cluster.fractional_pods, cluster.capacity_pods, cluster.namespaces):
                if not informer.wait_synced(SYNC_SECONDS):
                    raise RuntimeError(f"the webhook's {informer.name} informer did not sync")
            kept = held()
            watched = len(cluster.fractional_pods.items()) + len(cluster.capacity_pods.items())
    finally:
        cluster.stop()
    return {"pods": watched, "mib_per_10k_pods": round(kept / max(1, watched) * PODS / MIB, 1)}


@contextmanager
def _whole() -> Iterator[None]:
    """Informers made meanwhile keep every object whole, as the API server sends it."""
    made = Informer.__init__

    def whole(self: Informer, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **{**kwargs, "keep": lambda obj: obj})

    with mock.patch.object(Informer, "__init__", whole):
        yield


def footprints(connect: Callable[[], Transport]) -> dict[str, Any]:
    """Both components' figures, as they keep objects and with objects kept whole."""
    with _whole():
        before = {"extender": _scheduler(connect), "webhook": _webhook(connect)}
    now = {"extender": _scheduler(connect), "webhook": _webhook(connect)}
    return {**now, "objects_whole": before}
