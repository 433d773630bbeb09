"""How a capacity pod is kept off the nodes its pods cannot use, in terms autoscalers act on.

A capacity pod made for a waiting pod must not land on an existing node kube-scheduler
found infeasible for that pod (`scheduler.manifest.Where.avoid`): its GPU would be held
where nothing can use it, and with an autoscaler a pending one is a node bought. Two
systems read that requirement besides kube-scheduler, and they disagree on how it may be
written:

- **Karpenter** ignores outright every pod whose required node affinity names
  `kubernetes.io/hostname` (a restricted label), before it simulates anything: no node
  is ever bought for it. A `NotIn` on a label no NodePool defines it accepts, and the
  nodes it buys for such a pod satisfy it.
- **Cluster Autoscaler** simulates the pod on a copy of an existing node of each node
  group, with every label of that node but a new hostname: `hostname NotIn` passes there,
  while a label naming the copied node would fail it whenever that node is excluded.

So with Karpenter the nodes are named by gpupack's own node label, `gpupack.io/node`,
which `NodeLabels` writes once on every GPU node (its value, `node_label_value`, is
never changed after); without it, by hostname. `--autoscaler auto` asks the API server
whether Karpenter's API is served.

Nodes the capacity pod's own inherited constraints already keep it off (a node selector
for another GPU model, a required node affinity, a taint it does not tolerate) are not
named at all (`already_excluded`): kube-scheduler and both autoscalers judge those from
the constraints themselves, so the list is short and often empty.
"""

import enum
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Final

from gpupack import keys
from gpupack.objects import JSON, labels_of, selects
from gpupack.runtime.api import ApiError
from scheduler.kube import MERGE_PATCH, Kube

log = logging.getLogger(__name__)

KARPENTER_API: Final = "/apis/karpenter.sh/v1"
RECHECK: Final = 10.0  # seconds between two looks at whether Karpenter's API is served
# Taints Kubernetes sets and lifts by itself (a node not ready, cordoned, being
# removed): a node they exclude now may take the capacity pod a minute later, so it is
# still named.
TRANSIENT_TAINTS: Final = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
TRANSIENT_TAINT_KEYS: Final = frozenset(
    {"DeletionCandidateOfClusterAutoscaler", *keys.AUTOSCALER_REMOVAL_TAINTS}
)


class Autoscaler(enum.StrEnum):
    """What buys nodes in the cluster (`--autoscaler`)."""

    AUTO = "auto"  # Karpenter when its API is served, else as cluster-autoscaler
    KARPENTER = "karpenter"
    CLUSTER_AUTOSCALER = "cluster-autoscaler"
    NONE = "none"  # as cluster-autoscaler: hostnames, no node labels written


# Taints a node carries until it takes pods (one an autoscaler just added registers,
# its cloud provider initializes it, its kubelet turns Ready): kube-scheduler refuses
# every pod there meanwhile, which says nothing about the pod.
STARTING_TAINTS: Final = frozenset(
    {
        "karpenter.sh/unregistered",
        "node.cloudprovider.kubernetes.io/uninitialized",
        "node.kubernetes.io/not-ready",
    }
)


# Seconds a node still counts as starting once it takes pods, as this process saw it
# begin: kube-scheduler may have judged a pod against its view of the node from before
# (its snapshot is taken when a scheduling cycle starts, and on a busy machine the
# extender hears of the node first).
SETTLING: Final = 10.0


def starting(node: JSON | None) -> bool:
    """Whether `node` does not take pods yet for being new (or not ready): a taint of
    `STARTING_TAINTS`. A pod kube-scheduler found infeasible there meanwhile may well
    run there once it is ready."""
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    return any(t.get("key") in STARTING_TAINTS for t in taints)


# Node selection.


def already_excluded(scheduling: JSON, node: JSON | None) -> bool:
    """Whether a capacity pod with the inherited `scheduling` metadata (nodeSelector,
    affinity, tolerations) can never be placed on `node` by those alone: kube-scheduler
    refuses it there without being told. Sound, not complete: an expression it cannot
    judge, an empty term or a transient taint counts as no exclusion."""
    if node is None:
        return False
    labels = labels_of(node)
    selector = scheduling.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return True
    node_affinity = (scheduling.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    name = str(node["metadata"].get("name", ""))
    if terms and not any(_term_may_match(term, labels, name) for term in terms):
        return True
    taints = (node.get("spec") or {}).get("taints") or []
    tolerations = scheduling.get("tolerations") or []
    return any(_repels(taint, tolerations) for taint in taints)


def _term_may_match(term: JSON, labels: dict[str, str], name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return True  # kube-scheduler matches nothing with it; not ours to say
    # In, NotIn, Exists, DoesNotExist read as a label selector reads them; an operator
    # it does not know selects.
    if not selects({"matchExpressions": expressions}, labels):
        return False
    if not all(_bounded(e, labels.get(str(e.get("key")))) for e in expressions):
        return False
    named = [f for f in fields if f.get("key") == "metadata.name"]
    return selects({"matchExpressions": named}, {"metadata.name": name})


def _bounded(expression: JSON, value: str | None) -> bool:
    """Gt and Lt, which a label selector does not know; anything else passes."""
    operator = expression.get("operator")
    if operator not in ("Gt", "Lt"):
        return True
    values = [str(v) for v in expression.get("values") or []]
    if value is None or len(values) != 1:
        return False
    try:
        have, bound = int(value), int(values[0])
    except ValueError:
        return True  # not ours to judge
    return have > bound if operator == "Gt" else have < bound


def _repels(taint: JSON, tolerations: Sequence[JSON]) -> bool:
    effect = taint.get("effect")
    key = str(taint.get("key", ""))
    if effect not in ("NoSchedule", "NoExecute"):
        return False
    if key.startswith(TRANSIENT_TAINTS) or key in TRANSIENT_TAINT_KEYS:
        return False
    return not any(_tolerates(t, taint) for t in tolerations)


def _tolerates(toleration: JSON, taint: JSON) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and str(toleration.get("value") or "") == str(
        taint.get("value") or ""
    )


# Naming the nodes.


def node_label_value(name: str) -> str:
    """The `gpupack.io/node` label gpupack-scheduler writes on node `name` where none is:
    the name itself when it is a valid label value (at most 63 characters), else its
    first 40 characters, `_` and 16 hex digits of its SHA-256. A node name never holds
    `_`, so a shortened value is never another node's name. Once written it is the
    node's for good: a value already there, whoever wrote it, is what capacity pods
    name."""
    if len(name) <= 63 and _LABEL_VALUE.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    prefix = re.sub(r"[^A-Za-z0-9_.-]", "-", name[:40]).lstrip("-_.")
    return f"{prefix}_{digest}" if prefix else digest


_LABEL_VALUE: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


class NodeLabels:
    """Whether capacity pods name the nodes they avoid by `gpupack.io/node` (`by_label`),
    and the writes that make every such node carry it (`ensure`, `label_missing`).

    A node's label is written once, when absent, with a resourceVersion precondition,
    and never changed: a pending capacity pod that names a value keeps excluding that
    node. The chart's admission policy lets gpupack-scheduler change nothing else on a
    node."""

    def __init__(
        self,
        kube: Kube,
        autoscaler: Autoscaler = Autoscaler.AUTO,
        clock: Callable[[], float] = time.monotonic,
        recheck: float = RECHECK,
        written: Callable[[str], None] = lambda result: None,
    ) -> None:
        self._kube = kube
        self.autoscaler = autoscaler
        self._clock = clock
        self._recheck = recheck
        self._written = written  # counts writes by result: "labelled", "failed"
        self._lock = threading.Lock()
        self._karpenter: tuple[float, bool] | None = None  # (checked at, served)
        self._in_flight: set[str] = set()

    def by_label(self) -> bool:
        """Name avoided nodes by label: Karpenter runs, or `auto` finds its API (blocking:
        one discovery read at most every `recheck` seconds; while the API server cannot
        say, the last answer, or yes: Cluster Autoscaler still evaluates the label)."""
        if self.autoscaler == Autoscaler.KARPENTER:
            return True
        if self.autoscaler != Autoscaler.AUTO:
            return False
        now = self._clock()
        with self._lock:
            known = self._karpenter
        if known is not None and now - known[0] < self._recheck:
            return known[1]
        try:
            self._kube.get(KARPENTER_API)
            served = True
        except ApiError as error:
            if error.status != 404:
                log.warning("could not tell whether Karpenter runs: %s", error)
                served = known[1] if known is not None else True
                with self._lock:  # asked again after `recheck`, not at every call
                    self._karpenter = (now, served)
                return served
            served = False
        with self._lock:
            if known is None or known[1] != served:
                log.info(
                    "Karpenter's API is %s: capacity pods name the nodes they avoid by %s",
                    "served" if served else "not served",
                    keys.NODE if served else "kubernetes.io/hostname",
                )
            self._karpenter = (now, served)
        return served

    def may_label(self) -> bool:
        """Whether GPU nodes may need the label (not blocking): Karpenter runs, or `auto`
        has not asked yet, found Karpenter's API, or asks again now (`by_label`)."""
        if self.autoscaler != Autoscaler.AUTO:
            return self.autoscaler == Autoscaler.KARPENTER
        with self._lock:
            known = self._karpenter
        return known is None or known[1] or self._clock() - known[0] >= self._recheck

    def ensure(self, names: Collection[str], known: Mapping[str, str]) -> dict[str, str]:
        """Each node's `gpupack.io/node` label, written where it has none (blocking).
        `known` holds the values the caller's informer shows. A node that is gone is
        left out (it can take no pod). Raises ApiError when a node cannot be labelled:
        the capacity pod must then not be made, or it could land there."""
        labels: dict[str, str] = {}
        for name in names:
            value = known.get(name) or self._label(name)
            if value is not None:
                labels[name] = value
        return labels

    def _label(self, name: str, attempts: int = 3) -> str | None:
        """The node's label, written if absent; None when the node is gone."""
        path = f"/api/v1/nodes/{name}"
        for attempt in range(attempts):
            try:
                node = self._kube.get(path)
            except ApiError as error:
                if error.status == 404:
                    return None
                raise
            meta = node.get("metadata") or {}
            value = (meta.get("labels") or {}).get(keys.NODE)
            if value:
                return str(value)
            value = node_label_value(name)
            body = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "labels": {keys.NODE: value},
                }
            }
            try:
                self._kube.patch(path, body, MERGE_PATCH)
            except ApiError as error:
                if error.status == 409 and attempt + 1 < attempts:
                    continue  # the node changed meanwhile: read it again
                if error.status == 404:
                    return None
                self._written("failed")
                raise
            self._written("labelled")
            log.info("labelled node %s %s=%s", name, keys.NODE, value)
            return value
        return None

    def label_missing(self, names: Iterable[str], limit: int = 20) -> list[str]:
        """Claim up to `limit` of `names` (GPU nodes without the label) for `write`, which
        the caller runs off its lock; names already claimed are skipped."""
        with self._lock:
            claimed = [n for n in sorted(names) if n not in self._in_flight][:limit]
            self._in_flight.update(claimed)
        return claimed

    def write(self, names: Sequence[str]) -> None:
        """Label the claimed nodes (blocking), when capacity pods name nodes by label."""
        try:
            if not self.by_label():
                return
            for name in names:
                try:
                    self._label(name)
                except ApiError as error:
                    log.warning("could not label node %s %s: %s", name, keys.NODE, error)
        finally:
            with self._lock:
                self._in_flight.difference_update(names)
