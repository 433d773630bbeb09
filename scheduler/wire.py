"""kube-scheduler's extender protocol, as JSON: what arrives and what goes back.

Pure. kube-scheduler (`KubeSchedulerConfiguration.extenders`, `nodeCacheCapable: true`)
POSTs to the filter verb `{"Pod": <pod>, "NodeNames": [...]}`, the nodes that passed
every in-tree rule, and to the bind verb `{"PodName", "PodNamespace", "PodUID", "Node"}`.
The answers name the nodes that remain, and why each other node failed; a node in
`FailedAndUnresolvableNodes` is one where preemption would not help, so kube-scheduler
does not evict pods for it. Field names are Go's (k8s.io/kube-scheduler/extender/v1).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypedDict

MAX_NODES: Final = 100_000  # more names than any cluster has: a malformed request


class FilterResult(TypedDict):
    NodeNames: list[str]
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class BindResult(TypedDict):
    Error: str


@dataclass(frozen=True, slots=True)
class FilterArgs:
    pod: dict[str, Any]
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BindArgs:
    namespace: str
    name: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class WireError(ValueError):
    """A request that is not what kube-scheduler sends; the message names the field."""


def filter_args(body: object) -> FilterArgs:
    if not isinstance(body, dict):
        raise WireError("the filter request must be a JSON object")
    pod = body.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise WireError("Pod: expected a pod object with metadata")
    names = body.get("NodeNames")
    if names is None:
        raise WireError("NodeNames: missing; configure the extender with nodeCacheCapable: true")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise WireError("NodeNames: expected a list of node names")
    if len(names) > MAX_NODES:
        raise WireError(f"NodeNames: {len(names)} names, more than {MAX_NODES}")
    return FilterArgs(pod, tuple(names))


def bind_args(body: object) -> BindArgs:
    if not isinstance(body, dict):
        raise WireError("the bind request must be a JSON object")
    values = []
    for field in ("PodNamespace", "PodName", "PodUID", "Node"):
        value = body.get(field)
        if not isinstance(value, str) or not value:
            raise WireError(f"{field}: expected a non-empty string")
        values.append(value)
    return BindArgs(*values)


def chosen(node: str) -> FilterResult:
    """The pod goes to `node` (the GPU is reserved there); the other nodes are simply
    left out, as kube-scheduler needs no reason for nodes when the pod is placed."""
    return FilterResult(NodeNames=[node], FailedNodes={}, FailedAndUnresolvableNodes={}, Error="")


def refused(reasons: Mapping[str, str], *, resolvable: bool = False) -> FilterResult:
    """No node will do, each for its reason. Unresolvable unless `resolvable`: evicting
    lower-priority pods from a node cannot make room on a GPU (they keep their share
    until they are gone, and gpupack adds capacity instead)."""
    failed = dict(reasons)
    if resolvable:
        return FilterResult(
            NodeNames=[], FailedNodes=failed, FailedAndUnresolvableNodes={}, Error=""
        )
    return FilterResult(NodeNames=[], FailedNodes={}, FailedAndUnresolvableNodes=failed, Error="")


def retry(why: str) -> FilterResult:
    """Not now, soon: an error, which kube-scheduler retries after its backoff (1 to 10 s)
    rather than parking the pod until an event its own plugins care about (a GPU starting
    is none)."""
    return FilterResult(NodeNames=[], FailedNodes={}, FailedAndUnresolvableNodes={}, Error=why)


def every(nodes: Sequence[str], reason: str) -> FilterResult:
    """The same reason for every node: the pod itself is the problem."""
    return refused(dict.fromkeys(nodes, reason))


def bound() -> BindResult:
    return BindResult(Error="")


def bind_failed(why: str) -> BindResult:
    return BindResult(Error=why)
