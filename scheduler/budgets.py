"""Consolidation budgets that outlive a leader.

Each workload may be moved at most its policy's `evictionsPerWindow` times in any
`windowSeconds` (`scheduler.drain`). The leader keeps those eviction times in memory;
without more, a new leader (a restart, a `helm upgrade`, a failover) could not know what
the last one spent, so it had to start with every budget spent and move nothing for a
whole window: ten minutes with the built-in policies, after every upgrade, in which
churn leaves GPUs and nodes part-used and billed.

So the leader also writes them, after each round that moved pods, to one ConfigMap in
the release namespace (`--budgets-configmap`; the chart creates it empty and lets the
scheduler `get` and `patch` that object alone). A new leader reads it once: each
workload's evictions of the last day, as wall-clock times, become its budgets, and it
moves at once. Where the ConfigMap cannot be read (absent, forbidden, unreadable), it
falls back to the safe rule: every budget spent for a window. A write that fails is
logged and tried again after the next move; the cost of a lost write is one move more
than the budget for a workload moved just before a failover, never an unbounded one.

The ledger is JSON in the ConfigMap's data key `evictions`: workload ("namespace/Kind/
name") -> Unix times of its evictions.
"""

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Final

from gpupack.runtime.api import ApiError
from scheduler.kube import MERGE_PATCH, Kube

log = logging.getLogger(__name__)

KEY: Final = "evictions"
KEPT: Final = 86_400.0  # seconds of history written: longer than any sane window


def _path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps/{name}"


def load(kube: Kube, namespace: str, name: str) -> dict[str, list[float]] | None:
    """The ledger's evictions (workload -> Unix times); None when it cannot be read."""
    try:
        found = kube.get(_path(namespace, name))
    except ApiError as error:
        log.warning(
            "cannot read the consolidation budgets in ConfigMap %s/%s (%s): every budget "
            "starts spent for a window",
            namespace,
            name,
            error,
        )
        return None
    text = (found.get("data") or {}).get(KEY) or "{}"
    try:
        parsed = json.loads(text)
        ledger = {
            str(owner): [float(t) for t in times]
            for owner, times in parsed.items()
            if isinstance(times, list)
        }
    except (ValueError, TypeError, AttributeError) as error:
        log.warning(
            "ConfigMap %s/%s: %s is not a JSON object of workload -> eviction times (%s); "
            "every budget starts spent for a window",
            namespace,
            name,
            KEY,
            error,
        )
        return None
    return ledger


def save(
    kube: Kube, namespace: str, name: str, evicted: Mapping[str, Sequence[float]], wall: float
) -> None:
    """Write the evictions of the last `KEPT` seconds (Unix times); never raises."""
    recent = {
        owner: [round(t, 1) for t in times if wall - t < KEPT] for owner, times in evicted.items()
    }
    body = {"data": {KEY: json.dumps({o: t for o, t in sorted(recent.items()) if t})}}
    try:
        kube.patch(_path(namespace, name), body, MERGE_PATCH)
    except ApiError as error:
        log.warning(
            "could not write the consolidation budgets to ConfigMap %s/%s: %s",
            namespace,
            name,
            error,
        )
