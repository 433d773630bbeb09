"""Pods that escaped gpupack: in an opted-in scope, asking for one whole GPU, never rewritten.

The webhook rewrites an opted-in pod that asks for exactly one `nvidia.com/gpu`. When
its admission never reaches the webhook (every replica down, unreachable, or too slow)
the API server applies `failurePolicy: Ignore` and creates the pod as it was written;
when the webhook fails on a pod it admits it unchanged. Either way the pod holds a whole
GPU that gpupack would have shared, and nothing said so. The scheduler already watches
every live pod; this module picks those out so that each gets one Warning Event saying
why it holds a whole GPU, and `gpupack_scheduler_escaped_pods` counts them for as long
as they run.

What counts is what the webhook would take (`gpupack.gpu_request.escaped`, over the scan
it uses itself) in the scope its two registrations select: the pod labelled
`gpupack.io/optimize=enabled`, or its namespace labelled so and the pod not `disabled`;
never in an excluded namespace; still addressed to the default scheduler. Pods the
webhook leaves whole on purpose (more than one GPU, another GPU resource, another
scheduler, opted out, an unreadable GPU count) are not escapes; their audit lines say
why. A pod created with `spec.nodeName` already set is counted: nothing distinguishes it
from an escaped pod once bound, and it holds a whole GPU all the same.
"""

from collections.abc import Collection
from typing import Final

from gpupack import keys
from gpupack.gpu_request import escaped
from gpupack.objects import JSON, labels_of
from gpupack.runtime.informer import object_key
from scheduler.cache import Dirty, Store

REASON: Final = "NotRewrittenByGPUPack"


def note(pod: JSON, namespace: JSON | None, system_namespace: str) -> str:
    """The Event's text: why the pod holds a whole GPU and what to do."""
    pod_choice = labels_of(pod).get(keys.OPTIMIZE)
    scope = (
        f"the pod is labelled {keys.OPTIMIZE}={pod_choice}"
        if pod_choice
        else f"its namespace is labelled {keys.OPTIMIZE}={keys.OPTIMIZE_ENABLED}"
    )
    return (
        f"this pod holds a whole GPU: {scope}, but gpupack never rewrote it. Its admission "
        "did not reach the gpupack webhook (no ready replica, unreachable, or too slow: "
        "failurePolicy Ignore created it as written) or the webhook failed on it. Check "
        f"`kubectl get endpoints -n {system_namespace}` and the webhook's log; re-create "
        "the pod (for a Deployment, `kubectl rollout restart`) to share a GPU."
    )


class Escapes:
    """The escaped pods among `pods`, kept current from informer changes.

    `pod(key)` and `namespace(key)` are informer `on_change` callbacks (any thread);
    `refresh()` folds them in (the extender's loop). A changed namespace re-examines
    every pod, since its label decides the scope of all of them.
    """

    def __init__(self, pods: Store, namespaces: Store, excluded: Collection[str]) -> None:
        self._pods = pods
        self._namespaces = namespaces
        self.excluded = frozenset(excluded)
        # Which pods changed since the last refresh; a relist (or a namespace change,
        # which can change the scope of every pod) means all of them.
        self._dirty = Dirty()
        self.pods: dict[str, JSON] = {}  # key -> the escaped pod
        self._reported: set[str] = set()  # uids whose Event this process wrote

    def pod(self, key: str) -> None:
        self._dirty.pod(key)

    def namespace(self, key: str) -> None:
        self._dirty.pod("")

    def refresh(self) -> None:
        _, dirty, _, everything = self._dirty.take()
        if everything:
            self.pods = {}
            for pod in self._pods.items():
                self._examine(object_key(pod), pod)
        else:
            for key in dirty:
                self._examine(key, self._pods.get(key))
        live = {str((p.get("metadata") or {}).get("uid", "")) for p in self.pods.values()}
        self._reported &= live

    def _examine(self, key: str, pod: JSON | None) -> None:
        if pod is not None and escaped(pod, self.namespace_of(pod), self.excluded):
            self.pods[key] = pod
        else:
            self.pods.pop(key, None)

    def namespace_of(self, pod: JSON) -> JSON | None:
        return self._namespaces.get(str((pod.get("metadata") or {}).get("namespace", "")))

    def unreported(self) -> list[JSON]:
        """Escaped pods whose Event this process has not written; marks them written."""
        fresh = []
        for key in sorted(self.pods):
            pod = self.pods[key]
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            if uid not in self._reported:
                self._reported.add(uid)
                fresh.append(pod)
        return fresh
