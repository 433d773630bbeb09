"""One scheduling decision: snapshot + pod -> a placement, or why it fits nowhere.

Pure, and the same code the extender runs and the trace benchmark replays. Filter, then
score:

- **Filter** a node. In the cluster, kube-scheduler has already filtered the nodes with
  every rule a pod can carry (affinity, spread, taints, ports, volumes, resources) and
  passes the feasible ones (`nodes`); the snapshot does not check the node again
  (`Ledger.check_hosts` is off). The trace replay has no kube-scheduler, so there the
  node is checked here: ready, schedulable, CPU, memory and pod count. Then each GPU of
  a node holding GPUs of the pod's pool (`PlacementMemo.eligible`): running (not coming),
  healthy, not over-committed (`Gpu.over`), allowed model, compute and memory fit, and
  `real-time-mps` exclusivity (an MPS workload's GPU takes only its own pods; an MPS
  pod takes only a GPU nobody else uses).
- **Score** with a `Scorer`: it sees a node that passed and the GPUs that fit, and
  returns the best GPUs there with a cost (lower is better). The lowest cost wins; ties
  go to the node met first, so a decision is deterministic for a given snapshot.

Speed. A decision must not visit every node (12,000 of them in a large cluster):

- A scorer whose cost depends only on the node's state says so (`by_state`); then
  nodes in equal state (`PlacementMemo.state_of`: capacity, usage, each GPU's kind and
  usage) share one answer per pod shape (numbered by `PlacementMemo.shape_of`), and what
  a decision needs of each state is its first node (ties go to the node met first). The
  memo keeps the live states and their nodes by position (`PlacementMemo.states`, updated from
  the nodes that changed), so a decision works on states, never on nodes.
- Each shape keeps a frontier over the states (`PlacementMemo.frontier`): a heap of (cost or
  lower bound, position of the state's first node). A decision takes in only the states
  that appeared since the shape's last decision, at their lower bound when the scorer
  can bound its cost cheaply (`profile` per state, `bounder` per pod; an infinite bound
  means the pod cannot fit there) or else to be scored, then pops entries, scoring a
  state only when it reaches the top with a bound, until a cost is on top: no state can
  beat it, or tie it at an earlier node. The cost picks the node; the winner alone is
  then scored on its own for its GPUs (same state, same cost). Why a node state's GPUs
  refuse a GPU demand is kept too (`PlacementMemo.refusals`), so a state whose GPUs cannot
  take the pod leaves its shape's frontier for good at the cost of a lookup.
- kube-scheduler's feasible nodes (`nodes`) are honoured by letting a state whose first
  node is not among them compete, for this decision, at its first node that is; when
  fewer than half the eligible nodes are feasible, the decision walks those nodes
  instead, one answer per state.
- real-time-mps pods, and scorers whose cost depends on more than the state, are scored
  node by node, each node's answer for a shape memoised on it until it changes.
- What a scoring derives from the node alone (the GPUs a GPU demand may take, the
  scorer's view of them) is kept on the node until it changes (`Node.derived`): pod
  shapes that differ only in CPU or memory ask the same of its GPUs.
"""

import heapq
import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, cast

from scheduler.ledger import Gpu, Ledger, Node, NodeAnswer, Request, StateAnswer
from scheduler.memo import memo_of
from scheduler.state_index import Entry, Frontier

BOUND_FROM: Final = 8  # new states that placement scores outright, without bounding first


class Scorer(Protocol):
    """Chooses GPUs on one node: what placement asks of a scorer. A scorer subclasses it
    and keeps the defaults it does not need.

    - `generation` changes when its answers would.
    - `by_state`: its cost depends only on what `memo.state_key` reads of the node (not
      its name, labels or GPU UUIDs), so equal nodes share it.
    - Such a scorer may also bound its costs: `profile(node, pool)` summarises a node
      state, and `bounder(request)` returns a function from a profile to a lower bound
      on the cost `choose` would give (see `_best_bounded`), or None (the default: no
      bounds, every state is scored)."""

    by_state: bool = False

    @property
    def generation(self) -> int: ...

    def choose(
        self, node: Node, request: Request, fits: Sequence[Gpu]
    ) -> tuple[float, tuple[Gpu, ...]] | None:
        """The best `request.gpus` of `fits` (the node's GPUs that `gpu_rejects` lets take
        the pod, as this version of the node has them) and their cost; None if none will
        do."""
        ...

    def bounder(self, request: Request) -> Callable[[object], float] | None:
        return None

    def profile(self, node: Node, pool: str) -> object:
        return None


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    gpus: tuple[str, ...]  # UUIDs
    cost: float


@dataclass(frozen=True, slots=True)
class Unfit:
    """No node fits. Why, node by node, is `why_unfit`'s to say: it visits every node, so
    a decision does not pay for it (the extender says why per node with `refusal`)."""

    coming: bool = False  # a GPU that is coming could take the pod once it runs


@dataclass(frozen=True, slots=True)
class Reasons:
    """Why no node takes a pod, counted per reason, most common first."""

    counts: tuple[tuple[str, int], ...]

    @property
    def message(self) -> str:
        if not self.counts:
            return "no GPU of the pod's pool exists yet"
        parts = [f"{count} node{'s' if count > 1 else ''}: {why}" for why, count in self.counts]
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
    if gpu.removing:
        return "GPU on a node an autoscaler is removing"
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
) -> NodeAnswer:
    """The node's answer: its cost and GPUs, or why it does not fit. `refused`
    (`PlacementMemo.refusals`) remembers, per node state, why its GPUs do not fit; `hosts`
    says whether the node itself is checked (`Ledger.check_hosts`)."""
    why = node_rejects(node, request) if hosts else None
    if why is not None:
        return why
    if refused is not None:
        why = refused.get(node.state)
        if why is not None:
            return why
    key = ("fits", request.gpu_demand)
    fits = cast("list[Gpu] | None", node.derived.get(key))
    if fits is None:
        fits = node.derived[key] = [g for g in node.gpus if gpu_rejects(g, request) is None]
    if len(fits) < request.gpus:  # why, counted only here: memoised per state in `refused`
        reasons = Counter(
            why for gpu in node.gpus if (why := gpu_rejects(gpu, request)) is not None
        )
        why = reasons.most_common(1)[0][0] if reasons else f"fewer than {request.gpus} GPUs"
        if refused is not None:
            refused[node.state] = why
        return why
    chosen = scorer.choose(node, request, fits)
    return chosen if chosen is not None else "no GPU combination the scorer accepts"


def place(
    snapshot: Ledger,
    request: Request,
    scorer: Scorer,
    nodes: Collection[str] | None = None,
) -> Placement | Unfit:
    """Where `request` should go. Does not book it: the caller `assume`s the result.
    `nodes`: the only nodes it may go to (those kube-scheduler found feasible); None:
    every node of the snapshot (the trace replay, which has no kube-scheduler)."""
    memo = memo_of(snapshot)
    shape = memo.shape_of(request)
    epoch = memo.scorer_epoch(scorer, scorer.generation)
    hosts = snapshot.check_hosts
    eligible = memo.eligible(request)
    excluded: frozenset[str] = frozenset()
    if nodes is not None:
        allowed = nodes if isinstance(nodes, (set, frozenset)) else frozenset(nodes)
        excluded = memo.eligible_names(request) - allowed
    by_state = scorer.by_state and not request.exclusive
    if by_state and 2 * len(excluded) <= len(eligible):
        answers = memo.answers(shape)
        best_node = _best_indexed(snapshot, request, scorer, shape, answers, excluded)
        if best_node is None:
            return _unfit(snapshot, request)
    else:
        candidates = [n for n in eligible if n.name not in excluded] if excluded else eligible
        if by_state:
            answers = memo.answers(shape)
            best_node = _best_shared(snapshot, request, scorer, answers, candidates)
        else:
            best_node = _best_own(request, scorer, shape, epoch, candidates, hosts)
        if best_node is None:
            return _unfit(snapshot, request)
    answer = _own(best_node, request, scorer, shape, epoch, hosts)
    if type(answer) is tuple:
        return Placement(best_node.name, tuple(g.uuid for g in answer[1]), answer[0])
    raise AssertionError(f"{best_node.name} won without fitting: {answer}")  # pragma: no cover


def refusal(snapshot: Ledger, request: Request, name: str) -> str:
    """Why the node `name` cannot take `request` (after `place` found no room): the
    same checks, read for a person. Not memoised: it runs only when a pod fits nowhere
    (`refusals` asks it once per node state)."""
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


def refusals(snapshot: Ledger, request: Request, names: Collection[str]) -> dict[str, str]:
    """`refusal` for each of `names`, worked out once per node state: nodes in equal
    state refuse for the same reason (the state holds all it reads, as it holds all
    `place` reads), and a pod refused everywhere is asked about every node kube-scheduler
    passed, thousands in a large cluster. A real-time-mps pod's reason reads which
    workloads a GPU holds, which the state leaves out: its nodes are asked one by one."""
    if request.exclusive:
        return {name: refusal(snapshot, request, name) for name in names}
    state_of = memo_of(snapshot).state_of
    nodes = snapshot.nodes
    by_state: dict[int, str] = {}
    out: dict[str, str] = {}
    for name in names:
        node = nodes.get(name)
        if node is None:
            out[name] = refusal(snapshot, request, name)
            continue
        state = state_of(node)
        why = by_state.get(state)
        if why is None:
            why = by_state[state] = refusal(snapshot, request, name)
        out[name] = why
    return out


def _own(
    node: Node, request: Request, scorer: Scorer, shape: int, epoch: int, hosts: bool
) -> NodeAnswer:
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
    snapshot: Ledger,
    request: Request,
    scorer: Scorer,
    answers: dict[int, StateAnswer],
    candidates: list[Node],
) -> Node | None:
    """`_best_own` for a scorer whose cost depends only on the node's state, over a few
    candidates: one answer (cost or reason) per state in `answers`, shared by the nodes
    in that state."""
    get = answers.get
    state_of = memo_of(snapshot).state_of
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
        if not isinstance(answer, str) and (best is None or answer < best):
            best, best_node = answer, node
    return best_node


def _best_indexed(
    snapshot: Ledger,
    request: Request,
    scorer: Scorer,
    shape: int,
    answers: dict[int, StateAnswer],
    excluded: frozenset[str],
) -> Node | None:
    """The first node with the lowest cost, from the live node states
    (`PlacementMemo.states`) and the shape's frontier over them (`PlacementMemo.frontier`): the
    states that appeared since the shape's last decision are taken in with their cost,
    a lower bound on it (a scorer with `profile` and `bounder`, see `_bound_all`), or
    -inf; then entries are popped in (cost or bound, position) order, each bound turned
    into a cost, until a cost is on top: no other state can beat it or tie it at an
    earlier node. A state whose GPUs refuse the pod leaves the frontier for good; one
    whose first node is `excluded` competes at its first node that is not, for this
    decision only."""
    memo = memo_of(snapshot)
    index = memo.states()
    frontier = memo.frontier(shape)
    bounds = memo.bounds(shape)
    pool = request.pool
    unknown: list[int] = []
    pools = index.pools
    for state in frontier.news(index):
        if pool not in pools(state):  # no GPU of the pool, or no node any more
            continue
        answer = answers.get(state)
        if isinstance(answer, str):
            frontier.drop(state)
            continue
        key = answer if answer is not None else bounds.get(state)
        if key is None:
            unknown.append(state)
        elif key != math.inf:
            frontier.push((key, index.first_position(state), state))
    if unknown:
        _bound_all(snapshot, request, scorer, bounds, frontier, unknown)
    heap, current = frontier.heap, frontier.current
    refused = memo.refusals(request)
    hosts = snapshot.check_hosts
    aside: list[int] = []  # states whose first node is excluded
    own: list[Entry] = []  # their entries at their first allowed node, this decision only
    try:
        while heap or own:
            mine = bool(own) and (not heap or own[0] < heap[0])
            entry = own[0] if mine else heap[0]
            key, position, state = entry
            members = index.members(state)
            if not mine:
                if current.get(state) is not entry:  # superseded
                    heapq.heappop(heap)
                    continue
                if members is None:  # its last node left
                    heapq.heappop(heap)
                    frontier.drop(state)
                    continue
                first = index.first_position(state)
                if first != position:  # its first node left: it competes at the next
                    heapq.heappop(heap)
                    frontier.push((key, first, state))
                    continue
                if excluded and members[position].name in excluded:
                    heapq.heappop(heap)
                    aside.append(state)
                    other = index.first_allowed(state, excluded)
                    if other is not None:
                        heapq.heappush(own, (key, other.position, state))
                    continue
            assert members is not None  # an entry of `own` is for a live state
            node = members[position]
            answer = answers.get(state)
            if answer is None:
                known = refused.get(state)  # its GPUs are known not to fit
                found = (
                    _evaluate(node, request, scorer, refused, hosts)
                    if known is None
                    else (node_rejects(node, request) if hosts else None) or known
                )
                answer = answers[state] = found if type(found) is str else found[0]
                bounds.pop(state, None)
            if isinstance(answer, str):
                heapq.heappop(own if mine else heap)
                frontier.drop(state)
                continue
            if key != answer:  # a bound: compete with the cost
                exact: Entry = (answer, position, state)
                if mine:
                    heapq.heapreplace(own, exact)
                else:
                    heapq.heappop(heap)
                    frontier.push(exact)
                continue
            return node
        return None
    finally:
        for state in aside:  # back in the frontier at its first node, cost if known
            held = current.get(state)
            if held is not None:
                answer = answers.get(state)
                key = answer if type(answer) is float else held[0]
                frontier.push((key, index.first_position(state), state))


def _bound_all(
    snapshot: Ledger,
    request: Request,
    scorer: Scorer,
    bounds: dict[int, float],
    frontier: Frontier,
    states: list[int],
) -> None:
    """Put `states` (none scored or bounded for this shape yet) in the frontier: at
    their lower bound when the scorer bounds and there are more than `BOUND_FROM` (a
    bound is kept in `bounds` for the next pod of this shape; an infinite one means the
    pod cannot fit there and the state is left out), else at -inf (scored when popped)."""
    memo = memo_of(snapshot)
    index = memo.states()
    bound: Callable[[object], float] | None = None
    if len(states) > BOUND_FROM:
        bound = scorer.bounder(request)
    if bound is None:
        for state in states:
            frontier.push((-math.inf, index.first_position(state), state))
        return
    profile = scorer.profile
    profiles = memo.profiles()
    for state in states:
        summary = profiles.get(state)
        if summary is None:
            first = index.first(state)
            assert first is not None
            summary = profiles[state] = profile(first, request.pool)
        low = bound(summary)
        if low != math.inf:  # else the pod cannot fit there: nothing to keep
            bounds[state] = low
            frontier.push((low, index.first_position(state), state))


def why_unfit(
    snapshot: Ledger,
    request: Request,
    scorer: Scorer,
    nodes: Collection[str] | None = None,
) -> Reasons:
    """Why each node (those of `nodes`, when given) does not take `request`, counted: the
    checks `place` makes, node by node (nodes without a GPU of the pod's pool count as
    that). For people and tests; nothing on the scheduling path calls it."""
    allowed = None if nodes is None else frozenset(nodes)
    reasons: Counter[str] = Counter()
    candidates = 0
    memo = memo_of(snapshot)
    for node in memo.eligible(request):
        if allowed is not None and node.name not in allowed:
            continue
        candidates += 1
        answer = _evaluate(node, request, scorer, None, snapshot.check_hosts)
        if type(answer) is str:
            reasons[answer] += 1
    excluded = memo.gpu_nodes() - candidates
    if excluded > 0:
        reasons["no GPU of the pod's pool"] += excluded
    return Reasons(tuple(sorted(reasons.items(), key=lambda r: (-r[1], r[0]))))


def _unfit(snapshot: Ledger, request: Request) -> Unfit:
    coming = any(
        gpu.pool == request.pool
        and gpu.compute >= request.compute
        and (not gpu.memory or gpu.memory >= request.gpu_memory)
        for gpu in memo_of(snapshot).coming()
    )
    return Unfit(coming)
