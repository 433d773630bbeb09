"""One scheduling decision: snapshot + pod -> a placement, or why it fits nowhere.

Pure, and the same code the extender runs and the trace benchmark replays. Filter, then
score:

- **Filter** a node. In the cluster, kube-scheduler has already filtered the nodes with
  every rule a pod can carry (affinity, spread, taints, ports, volumes, resources) and
  passes the feasible ones (`nodes`); the snapshot does not check the node again
  (`Snapshot.check_hosts` is off). The trace replay has no kube-scheduler, so there the
  node is checked here: ready, schedulable, CPU, memory and pod count. Then each GPU of
  a node holding GPUs of the pod's pool (`Snapshot.eligible`): running (not coming),
  healthy, not over-committed (`Gpu.over`), allowed model, compute and memory fit, and
  `real-time-mps` exclusivity (an MPS workload's GPU takes only its own pods; an MPS
  pod takes only a GPU nobody else uses).
- **Score** with a `Scorer`: it sees a node that passed and the GPUs that fit, and
  returns the best GPUs there with a cost (lower is better). The lowest cost wins; ties
  go to the node met first, so a decision is deterministic for a given snapshot.

Speed. A decision visits every eligible node, so per node it must cost a dictionary
lookup, not a scoring:

- A node's answer for a pod shape (numbered by `Snapshot.shape_of`, so keys hash fast)
  is memoised on the node until the node changes (any booking, label or GPU change
  clears it) or placement runs with another scorer or generation.
- A scorer whose cost depends only on the node's state says so (`by_state`); then
  nodes in equal state (`Snapshot.state_of`: capacity, usage, each GPU's kind and usage)
  share one answer per shape, so a new pod shape costs one scoring per distinct state,
  not per node. The cost picks the node; the winner alone is then scored on its own for
  its GPUs (same state, same cost). real-time-mps pods, and nodes with a GPU held by one,
  are scored per node (their answers depend on the owner).
- A pod shape met after many nodes changed (or for the first time) still meets hundreds
  of new states. A scorer that can bound its cost from below cheaply (`profile` per
  state, `bounder` per pod) lets placement score only the states that could still win:
  by bound, then node order, stopping at the first whose bound exceeds the best cost
  found (or equals it at a later node, since ties go to the first node). Same decision,
  a few scorings instead of hundreds. Why a node state's GPUs refuse a GPU demand is
  kept too (`Snapshot.refusals`), so a pod that fits nowhere costs a lookup per state.
"""

import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from scheduler.snapshot import Gpu, Node, Request, Snapshot

BOUND_FROM: Final = 8  # new states that placement scores outright, without bounding first


class Scorer(Protocol):
    """Chooses GPUs on one node. `generation` changes when its answers would. A scorer
    may also set `by_state = True`: its cost depends only on what `snapshot.state_key`
    reads of the node (not its name, labels or GPU UUIDs), so equal nodes share it. Such a
    scorer may also bound its costs: `profile(node, pool) -> object` summarises a node
    state, and `bounder(request)` returns None or a function from a profile to a lower
    bound on the cost `choose` would give (see `_best_bounded`)."""

    @property
    def generation(self) -> int: ...

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        """The best `request.gpus` of `fits` and their cost; None if none will do."""
        ...


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    gpus: tuple[str, ...]  # UUIDs
    cost: float


@dataclass(frozen=True, slots=True)
class Unfit:
    """No node fits. `reasons` counts why, per node ("3 nodes: insufficient cpu")."""

    reasons: tuple[tuple[str, int], ...]
    coming: bool = False  # a GPU that is coming could take the pod once it runs

    @property
    def message(self) -> str:
        if not self.reasons:
            return "no GPU of the pod's pool exists yet"
        parts = [f"{count} node{'s' if count > 1 else ''}: {why}" for why, count in self.reasons]
        return "0 GPUs fit; " + ", ".join(parts)


def gpu_rejects(gpu: Gpu, request: Request) -> str | None:
    """Why one GPU cannot take the pod, or None."""
    if gpu.pool != request.pool:
        return "GPUs of another pool"
    if request.models is not None and gpu.model not in request.models:
        return "GPU model not allowed"
    if gpu.coming:
        return "GPU not running yet"
    if not gpu.healthy:
        return "GPU unhealthy"
    if gpu.draining:
        return "GPU draining (consolidation is emptying it)"
    if gpu.over:
        return "GPU over-committed (pods run on it that its books cannot hold)"
    if gpu.free_compute < request.compute:
        return "insufficient GPU compute"
    free_memory = gpu.free_memory
    if free_memory is not None and free_memory < request.gpu_memory:
        return "insufficient GPU memory"
    # An MPS workload's GPU takes only that workload's MPS pods. The answer for a
    # non-exclusive pod must not depend on its owner: placement memoises it per shape,
    # and the shape of a non-exclusive pod leaves the owner out.
    if gpu.exclusive_owner and (not request.exclusive or gpu.exclusive_owner != request.owner):
        return "GPU held by a real-time-mps workload"
    if request.exclusive and any(owner != request.owner for owner in gpu.owners):
        return "GPU shared with other workloads (real-time-mps needs its own)"
    return None


def node_rejects(node: Node, request: Request) -> str | None:
    if not node.ready:
        return "node not ready"
    if not node.schedulable:
        return "node unschedulable"
    if node.free_cpu < request.cpu:
        return "insufficient cpu"
    if node.free_memory < request.memory:
        return "insufficient memory"
    if node.used_pods >= node.max_pods:
        return "too many pods"
    return None


def _evaluate(
    node: Node,
    request: Request,
    scorer: Scorer,
    refused: dict[int, str] | None = None,
    hosts: bool = True,
) -> tuple[float, tuple[Gpu, ...]] | str:
    """The node's answer: its cost and GPUs, or why it does not fit. `refused`
    (`Snapshot.refusals`) remembers, per node state, why its GPUs do not fit; `hosts`
    says whether the node itself is checked (`Snapshot.check_hosts`)."""
    why = node_rejects(node, request) if hosts else None
    if why is not None:
        return why
    if refused is not None:
        why = refused.get(node.state)
        if why is not None:
            return why
    fits: list[Gpu] = []
    reasons: Counter[str] = Counter()
    for gpu in node.gpus:
        rejected = gpu_rejects(gpu, request)
        if rejected is None:
            fits.append(gpu)
        else:
            reasons[rejected] += 1
    if len(fits) < request.gpus:
        why = reasons.most_common(1)[0][0] if reasons else f"fewer than {request.gpus} GPUs"
        if refused is not None:
            refused[node.state] = why
        return why
    chosen = scorer.choose(node, request, fits)
    return chosen if chosen is not None else "no GPU combination the scorer accepts"


def place(
    snapshot: Snapshot,
    request: Request,
    scorer: Scorer,
    nodes: Collection[str] | None = None,
) -> Placement | Unfit:
    """Where `request` should go. Does not book it: the caller `assume`s the result.
    `nodes`: the only nodes it may go to (those kube-scheduler found feasible); None:
    every node of the snapshot (the trace replay, which has no kube-scheduler)."""
    shape = snapshot.shape_of(request)
    epoch = snapshot.scorer_epoch(scorer, scorer.generation)
    hosts = snapshot.check_hosts
    candidates = snapshot.eligible(request)
    if nodes is not None:
        allowed = frozenset(nodes)
        candidates = [n for n in candidates if n.name in allowed]
    shared: dict[int, object] | None = None
    if getattr(scorer, "by_state", False) and not request.exclusive:
        shared = snapshot.answers(shape)
        best_node = _best_shared(snapshot, request, scorer, shape, shared, candidates)
    else:
        best_node = _best_own(request, scorer, shape, epoch, candidates, hosts)
    if best_node is not None:
        answer = _own(best_node, request, scorer, shape, epoch, hosts)
        if type(answer) is tuple:
            return Placement(best_node.name, tuple(g.uuid for g in answer[1]), answer[0])
    return _unfit(snapshot, request, candidates, shape, shared)


def refusal(snapshot: Snapshot, request: Request, name: str) -> str:
    """Why the node `name` cannot take `request` (after `place` found no room): the
    same checks, read for a person. Not memoised: it runs only when a pod fits nowhere."""
    node = snapshot.nodes.get(name)
    if node is None:
        return "node not known to gpupack yet"
    if snapshot.check_hosts:
        why = node_rejects(node, request)
        if why is not None:
            return why
    if not any(g.pool == request.pool for g in node.gpus):
        return "no GPU of the pod's pool on the node"
    reasons: Counter[str] = Counter()
    for gpu in node.gpus:
        if gpu.pool == request.pool:
            reasons[gpu_rejects(gpu, request) or "fits, but another node was chosen"] += 1
    return reasons.most_common(1)[0][0]


def _own(
    node: Node, request: Request, scorer: Scorer, shape: int, epoch: int, hosts: bool
) -> object:
    """The node's answer for the shape, memoised on the node."""
    memo = node.memo
    if node.memo_generation != epoch:
        memo.clear()
        node.memo_generation = epoch
    answer = memo.get(shape)
    if answer is None:
        answer = memo[shape] = _evaluate(node, request, scorer, None, hosts)
    return answer


def _best_own(
    request: Request,
    scorer: Scorer,
    shape: int,
    epoch: int,
    candidates: list[Node],
    hosts: bool,
) -> Node | None:
    """The first node with the lowest cost, every node scored on its own (memoised)."""
    best: float | None = None
    best_node: Node | None = None
    for node in candidates:
        answer = _own(node, request, scorer, shape, epoch, hosts)
        if type(answer) is tuple and (best is None or answer[0] < best):
            best, best_node = answer[0], node
    return best_node


def _best_shared(
    snapshot: Snapshot,
    request: Request,
    scorer: Scorer,
    shape: int,
    answers: dict[int, object],
    candidates: list[Node],
) -> Node | None:
    """`_best_own` for a scorer whose cost depends only on the node's state: one answer
    (cost or reason) per state in `answers`, shared by the nodes in that state. With a
    scorer that bounds its costs, states are scored only while they could still win (see
    `_best_bounded`)."""
    if hasattr(scorer, "bounder") and hasattr(scorer, "profile"):
        return _best_bounded(snapshot, request, scorer, shape, answers, candidates)
    get = answers.get
    state_of = snapshot.state_of
    best: float | None = None
    best_node: Node | None = None
    for node in candidates:
        state = node.state
        if state < 0:
            state = state_of(node)
        answer = get(state)
        if answer is None:
            found = _evaluate(node, request, scorer, None, snapshot.check_hosts)
            answer = answers[state] = found if type(found) is str else found[0]
        if type(answer) is not str and (best is None or answer < best):  # type: ignore[operator]
            best, best_node = answer, node  # type: ignore[assignment]
    return best_node


def _best_bounded(
    snapshot: Snapshot,
    request: Request,
    scorer: Scorer,
    shape: int,
    answers: dict[int, object],
    candidates: list[Node],
) -> Node | None:
    """`_best_shared` for a scorer that also bounds its cost from below: `profile(node,
    pool)` summarises a node state (kept per state in `Snapshot.profiles`), and
    `bounder(request)(profile)` is at most the cost `choose` would give. A state whose bound
    exceeds the best cost found, or equals it at a later position, cannot win (ties go to
    the first node): it is not scored, and its bound is kept (`Snapshot.bounds`) for the
    next pod of this shape. The states that might win are scored by (bound, position), so
    the first that cannot win ends the search; the winner is the same node."""
    get = answers.get
    bounds = snapshot.bounds(shape)
    lower = bounds.get
    state_of = snapshot.state_of
    best: float | None = None
    best_node: Node | None = None
    best_at = -1
    fresh: dict[int, tuple[int, Node]] = {}  # states with neither answer nor bound
    order: list[tuple[float, int, int, Node]] = []  # bounded states that might win
    bounded: set[int] = set()
    for index, node in enumerate(candidates):
        state = node.state
        if state < 0:
            state = state_of(node)
        answer = get(state)
        if answer is None:
            low = lower(state)
            if low is None:
                if state not in fresh:
                    fresh[state] = (index, node)
            elif (best is None or low < best) and state not in bounded:
                bounded.add(state)
                order.append((low, index, state, node))
        elif type(answer) is not str and (best is None or answer < best):  # type: ignore[operator]
            best, best_node, best_at = answer, node, index  # type: ignore[assignment]
    if not fresh and not order:
        return best_node
    bound: Callable[[object], float] | None = None
    if len(fresh) > BOUND_FROM:  # too few to gain from bounding: score them all
        bound = scorer.bounder(request)  # type: ignore[attr-defined]
    if bound is None:
        order.extend((-math.inf, index, state, node) for state, (index, node) in fresh.items())
    else:
        profile: Callable[[Node, str], object] = scorer.profile  # type: ignore[attr-defined]
        profiles = snapshot.profiles()
        for state, (index, node) in fresh.items():
            summary = profiles.get(state)
            if summary is None:
                summary = profiles[state] = profile(node, request.pool)
            low = bounds[state] = bound(summary)
            if best is None or low <= best:  # else it cannot win
                order.append((low, index, state, node))
    order.sort()  # by bound, then position (distinct per state: nodes never compared)
    refused = snapshot.refusals(request)
    hosts = snapshot.check_hosts
    for low, index, state, node in order:
        if best is not None and (low > best or (low == best and index > best_at)):
            break
        known = refused.get(state)  # its GPUs are known not to fit
        found = (
            _evaluate(node, request, scorer, refused, hosts)
            if known is None
            else (node_rejects(node, request) if hosts else None) or known
        )
        answer = answers[state] = found if type(found) is str else found[0]
        bounds.pop(state, None)
        if type(answer) is not str and (
            best is None or answer < best or (answer == best and index < best_at)  # type: ignore[operator]
        ):
            best, best_node, best_at = answer, node, index  # type: ignore[assignment]
    return best_node


def _unfit(
    snapshot: Snapshot,
    request: Request,
    candidates: list[Node],
    shape: int,
    shared: dict[int, object] | None,
) -> Unfit:
    reasons: Counter[str] = Counter()
    if shared is None:
        for node in candidates:
            answer = node.memo.get(shape)
            if type(answer) is str:
                reasons[answer] += 1
    else:
        get = shared.get
        for node in candidates:
            answer = get(node.state)
            if type(answer) is str:
                reasons[answer] += 1
    excluded = sum(1 for n in snapshot.nodes.values() if n.gpus) - len(candidates)
    if excluded > 0:
        reasons["no GPU of the pod's pool"] += excluded
    coming = any(
        gpu.pool == request.pool
        and gpu.compute >= request.compute
        and (not gpu.memory or gpu.memory >= request.gpu_memory)
        for gpu in [g for g in snapshot.gpus.values() if g.coming]
    )
    return Unfit(tuple(sorted(reasons.items(), key=lambda r: (-r[1], r[0]))), coming)
