"""Placement's speed caches over the GPU ledger (`scheduler.ledger`): what placement
remembers between decisions so that a decision costs O(node states), not O(nodes).

Placement's answers depend on a node only through its *state* (`state_key`: capacity,
usage and each GPU's kind and usage, but not names), and busy clusters hold many nodes
in equal state. So the memo numbers states (`state_of`, cached on the node until it
changes) and request shapes (`shape_of`), and keeps a bounded table of answers per
shape and state (`answers`) that placement fills: equal nodes are scored once. States it
proved could not win it keeps only a lower bound for (`bounds`), computed from the
scorer's summary of the state (`profiles`), and why a state's GPUs refuse a GPU demand
(`refusals`). The nodes of a pool (`eligible`), the GPUs coming and the nodes holding
GPUs are kept until the ledger's topology changes.

Every entry is derived from the ledger and may be dropped at any time; nothing here is
the ledger's truth. Pure, and not thread-safe, like the ledger.
"""

from itertools import count
from typing import Any, Final, cast

from scheduler.ledger import UNKNOWN, Gpu, Ledger, Node, Request, StateAnswer
from scheduler.state_index import Frontier, StateIndex

STATE_LIMIT: Final = 100_000  # numbered node states kept before the table starts over
SHAPE_LIMIT: Final = 4_096  # numbered request shapes kept before the table starts over
ANSWER_LIMIT: Final = 1_000_000  # shared answers kept before the least used shapes lose theirs
DEAD_BATCH: Final = 32  # states left by every node, forgotten together
GONE_MIN: Final = 4_096  # gone states logged at least before the log's older half is dropped


def memo_of(ledger: Ledger) -> "PlacementMemo":
    """The ledger's caches, attached to it on first use."""
    memo = ledger.caches
    if memo is None:
        memo = ledger.caches = PlacementMemo(ledger)
    return cast(PlacementMemo, memo)


class PlacementMemo:
    """The caches of one ledger (`memo_of`)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._eligible: dict[tuple[object, ...], tuple[int, list[Node]]] = {}
        self._eligible_names: dict[tuple[object, ...], tuple[int, frozenset[str]]] = {}
        self._states: dict[tuple[object, ...], int] = {}
        self._numbers = count()  # state numbers are never reused
        self._shapes: dict[tuple[object, ...], int] = {}
        self._answers: dict[int, dict[int, StateAnswer]] = {}  # shape -> state -> answer
        self._bounds: dict[int, dict[int, float]] = {}  # shape -> state -> cost bound
        self._profiles: dict[int, object] = {}  # state -> what the scorer bounds with
        self._refusals: dict[tuple[object, ...], dict[int, str]] = {}  # see `refusals`
        self._frontiers: dict[int, Frontier] = {}  # shape -> its heap over the states
        self._used: dict[int, int] = {}  # shape -> the `answers` call that last used it
        # States no node is in any more, in the order they went (`_forget_dead`), and how
        # far into that log (counting dropped entries) each shape's tables are purged.
        self._gone: list[int] = []
        self._gone_base = 0
        self._purged: dict[int, int] = {}
        self._index = StateIndex()
        # What a node of the ledger calls when it changes (`Node.on_change`): the index's
        # own method, one call on every booking's path.
        self.note = self._index.note
        self._coming: tuple[int, list[Gpu]] | None = None  # (topology, GPUs coming)
        self._gpu_nodes: tuple[int, int] | None = None  # (topology, nodes holding GPUs)
        self._answers_of: tuple[object, int] | None = None  # (scorer, its generation)
        self._answer_calls = 0
        self._epoch = 0
        ledger.listen(self.note)

    def eligible(self, request: Request) -> list[Node]:
        """Nodes that hold GPUs of the pod's pool (cached until the topology changes).
        Which of them the pod may go to is kube-scheduler's to say (`place`'s `nodes`)."""
        key = (request.models, request.pool)
        cached = self._eligible.get(key)
        if cached is not None and cached[0] == self._ledger.topology:
            return cached[1]
        nodes = [
            n for n in self._ledger.nodes.values() if any(g.pool == request.pool for g in n.gpus)
        ]
        self._eligible[key] = (self._ledger.topology, nodes)
        return nodes

    def eligible_names(self, request: Request) -> frozenset[str]:
        """The names of `eligible(request)` (cached until the topology changes)."""
        key = ("names", request.models, request.pool)
        cached = self._eligible_names.get(key)
        if cached is None or cached[0] != self._ledger.topology:
            names = frozenset(n.name for n in self.eligible(request))
            cached = self._eligible_names[key] = (self._ledger.topology, names)
        return cached[1]

    def coming(self) -> list[Gpu]:
        """The GPUs whose capacity pod is not running yet (cached until the topology
        changes: a GPU stops coming only by being added again)."""
        cached = self._coming
        if cached is None or cached[0] != self._ledger.topology:
            cached = self._coming = (
                self._ledger.topology,
                [g for g in self._ledger.gpus.values() if g.coming],
            )
        return cached[1]

    def gpu_nodes(self) -> int:
        """How many nodes hold GPUs (cached until the topology changes)."""
        cached = self._gpu_nodes
        if cached is None or cached[0] != self._ledger.topology:
            cached = self._gpu_nodes = (
                self._ledger.topology,
                sum(1 for n in self._ledger.nodes.values() if n.gpus),
            )
        return cached[1]

    # Numbered states and shapes, for placement's shared answers.

    def state_of(self, node: Node) -> int:
        """The number of the node's current state; nodes in equal state share it. A node
        with a GPU held by a real-time-mps workload gets a number of its own (its answers
        depend on the pod's owner, which the shape leaves out). Numbers are never reused."""
        if node.state != UNKNOWN:
            return node.state
        key = state_key(node)
        number = None if key is None else self._states.get(key)
        if number is None:
            number = next(self._numbers)
            if key is not None:
                if len(self._states) >= STATE_LIMIT:
                    self._states.clear()  # equal states met later get new numbers
                self._states[key] = number
        node.state = number
        return number

    def states(self) -> StateIndex:
        """The live node states and their nodes, brought up to date with the nodes that
        changed since the last call."""
        self._index.refresh(self._ledger.nodes, self.state_of)
        self._forget_dead()
        return self._index

    def frontier(self, shape: int) -> Frontier:
        """One shape's heap over the node states (`scheduler.state_index`); kept and
        dropped with `answers`."""
        frontier = self._frontiers.get(shape)
        if frontier is None:
            frontier = self._frontiers[shape] = Frontier()
        return frontier

    def shape_of(self, request: Request) -> int:
        """A small number for the request's shape (memo and answer keys hash fast)."""
        shape = request.shape
        number = self._shapes.get(shape)
        if number is None:
            if len(self._shapes) >= SHAPE_LIMIT:  # numbers are reused: drop what used them
                self._shapes.clear()
                self._answers.clear()
                self._bounds.clear()
                self._frontiers.clear()
                self._used.clear()
                self._purged.clear()
                for node in self._ledger.nodes.values():
                    node.memo.clear()
            number = self._shapes[shape] = len(self._shapes)
        return number

    def scorer_epoch(self, scorer: object, generation: int) -> int:
        """A number that moves whenever placement runs with another scorer or the
        scorer's generation moves; answers kept under an older one are dropped."""
        owner = self._answers_of
        if owner is None or owner[0] is not scorer or owner[1] != generation:
            self._answers.clear()
            self._bounds.clear()
            self._profiles.clear()
            self._frontiers.clear()
            self._used.clear()
            self._purged.clear()
            self._answers_of = (scorer, generation)
            self._epoch += 1
        return self._epoch

    def answers(self, shape: int) -> dict[int, StateAnswer]:
        """Placement's answers for one shape by state number, under the current
        `scorer_epoch`. Bounded: what the shape keeps of states no node is in any more is
        dropped now (`_purge`), and past `ANSWER_LIMIT` answers, bounds, frontier entries,
        profiles and refusals together (checked every 64 calls) the shapes used least
        recently lose theirs (`_shrink`)."""
        self._answer_calls += 1
        self._used[shape] = self._answer_calls
        if self._answer_calls % 64 == 0:
            self._shrink()
        self._purge(shape)
        answers = self._answers.get(shape)
        if answers is None:
            answers = self._answers[shape] = {}
        return answers

    def _held(self, shape: int) -> int:
        frontier = self._frontiers.get(shape)
        return (
            len(self._answers.get(shape, ()))
            + len(self._bounds.get(shape, ()))
            + (len(frontier.heap) if frontier is not None else 0)
        )

    def _shrink(self) -> None:
        """Past `ANSWER_LIMIT`, drop the tables of the shapes used least recently (a shape
        met again takes in every state anew) until half of it is left; then profiles and
        refusals, which every shape shares, if they alone are past it."""
        shapes = sum(map(self._held, self._used))
        shared = len(self._profiles) + sum(map(len, self._refusals.values()))
        if shapes + shared <= ANSWER_LIMIT:
            return
        for shape in sorted(self._used, key=self._used.__getitem__):
            if shapes <= ANSWER_LIMIT // 2:
                break
            shapes -= self._held(shape)
            self._answers.pop(shape, None)
            self._bounds.pop(shape, None)
            self._frontiers.pop(shape, None)
            self._purged.pop(shape, None)
            del self._used[shape]
        if shared > ANSWER_LIMIT // 2:
            self._profiles.clear()
            self._refusals.clear()

    def _forget_dead(self) -> None:
        """Drop what every shape shares (profiles, refusals) for the states no node is in
        any more, in batches of `DEAD_BATCH`, and log them for each shape's own tables,
        which `_purge` clears when the shape is next used: a decision pays for the shape it
        places, not for every shape met so far. (A node that enters such a state again
        gets its number again, and the index takes it in as new.)"""
        dead = self._index.dead
        if len(dead) < DEAD_BATCH:
            return
        gone = [state for state in dead if self._index.members(state) is None]
        dead.clear()
        shared: list[dict[int, Any]] = [*self._refusals.values(), self._profiles]
        for table in shared:
            if table:
                for state in gone:
                    table.pop(state, None)
        self._gone.extend(gone)
        if len(self._gone) > GONE_MIN:
            half = len(self._gone) // 2  # a shape that has not read it is purged in full
            del self._gone[:half]
            self._gone_base += half

    def _purge(self, shape: int) -> None:
        """Drop the shape's answers, bounds and frontier entries of the states gone since
        its last purge (`_forget_dead`), or of all its states, when that is fewer to look
        at or the log has dropped entries it had not read; only of states still without
        a node (a state a node enters again keeps its number, and its frontier entry)."""
        end = self._gone_base + len(self._gone)
        read = self._purged.get(shape, 0)
        if read == end:
            return
        self._purged[shape] = end
        frontier = self._frontiers.get(shape)
        gone = self._gone[read - self._gone_base :] if read >= self._gone_base else None
        members = self._index.members
        for table in (
            self._answers.get(shape),
            self._bounds.get(shape),
            None if frontier is None else frontier.current,
        ):
            if not table:
                continue
            if gone is None or len(gone) > len(table):
                dead = [state for state in table if members(state) is None]
            else:
                dead = [state for state in gone if state in table and members(state) is None]
            for state in dead:
                table.pop(state, None)  # a state may go, come back and go again

    def bounds(self, shape: int) -> dict[int, float]:
        """Lower bounds on the cost of one shape by state number, for states placement
        has not scored yet (see placement); kept and dropped with `answers`."""
        bounds = self._bounds.get(shape)
        if bounds is None:
            bounds = self._bounds[shape] = {}
        return bounds

    def refusals(self, request: Request) -> dict[int, str]:
        """Why no GPU of a node state takes a pod with the GPU demand of `request`
        (`Request.gpu_demand`, and how many GPUs), by state number, for the states placement
        found so; not for real-time-mps pods. A state's GPUs never change, so the reasons
        hold for every shape and scorer; kept and dropped with `answers`."""
        key = (request.gpu_demand, request.gpus)
        refused = self._refusals.get(key)
        if refused is None:
            refused = self._refusals[key] = {}
        return refused

    def profiles(self) -> dict[int, object]:
        """What the scorer bounds costs with, by state number (for every shape); kept and
        dropped with `answers`."""
        return self._profiles


def state_key(node: Node) -> tuple[object, ...] | None:
    """Everything placement and the state-sharing scorers read of a node, in GPU order;
    None when a GPU is held by a real-time-mps workload."""
    gpus: list[tuple[object, ...]] = []
    for g in node.gpus:
        if g.exclusive_owner:
            return None
        hosts_pods = bool(g.owners) or g.over > 0
        gpus.append(
            (
                g.pool,
                g.model,
                g.coming,
                g.compute,
                g.used_compute,
                g.memory,
                g.used_memory,
                hosts_pods,
                g.healthy,
                g.over > 0,
                g.draining,
                g.removing,
            )
        )
    return (
        node.ready,
        node.schedulable,
        node.cpu,
        node.memory,
        node.used_cpu,
        node.used_memory,
        node.used_pods > 0,
        node.used_pods >= node.max_pods,
        tuple(gpus),
    )
