"""The live node states and the nodes in each, so a decision costs O(states), not O(nodes).

Placement's answers depend on a node only through its state (`memo.state_key`), and
ties go to the node met first. So what a decision needs of the cluster is, per distinct
state, its first node: `StateIndex` keeps that, updated from the nodes that changed since
the last decision (`Node.touch` reports them to `note`), never by walking every node.

A `Frontier` is one pod shape's view of the states: a heap of (cost or lower bound,
position of the state's first node, state) that placement pops until an exact cost is
on top, which is then the lowest (cost, position) of all, so the same node wins as if
every node had been scored. It is kept from decision to decision: a decision only
takes in the states that appeared (or gained an earlier first node) since the shape's
last one, from the index's append-only `log`. Entries go stale instead of being removed
(a state whose last node left, an entry superseded by a newer one for its state) and are
dropped when they reach the top.

Pure bookkeeping: which entries placement pushes, and why, is `scheduler.placement`'s.
"""

import heapq
from collections.abc import Callable, Iterable, KeysView
from dataclasses import dataclass, field
from typing import Final

from scheduler.ledger import UNKNOWN, Node

LOG_MIN: Final = 4_096  # log entries kept at least before its older half is dropped
COMPACT_SLACK: Final = 256  # stale heap entries a frontier tolerates beyond its live ones

Entry = tuple[float, int, int]  # cost or bound, the first node's position, state


class StateIndex:
    """States with at least one node holding GPUs, and those nodes by position."""

    def __init__(self) -> None:
        self._changed: set[Node] = set()  # reported by `note`
        self._members: dict[int, dict[int, Node]] = {}  # state -> position -> node
        self._order: dict[int, list[int]] = {}  # state -> positions, a heap (lazy)
        self._pools: dict[int, frozenset[str]] = {}  # state -> its GPUs' pools
        self.log: list[int] = []  # states that appeared or gained an earlier first node
        self.base = 0  # how many entries were dropped from the log's front
        self.dead: list[int] = []  # states their last node left (the snapshot forgets them)

    def note(self, node: Node) -> None:
        """A node changed (`Node.touch`): `refresh` moves it."""
        self._changed.add(node)

    def refresh(self, nodes: dict[str, Node], state_of: Callable[[Node], int]) -> None:
        """Move the nodes that changed to their current state (or out: removed nodes,
        nodes without GPUs)."""
        if not self._changed:
            return
        changed = list(self._changed)
        self._changed.clear()
        for node in changed:
            old = node.indexed
            if old != UNKNOWN:
                members = self._members.get(old)
                if members is not None and members.get(node.position) is node:
                    del members[node.position]
                    if not members:
                        del self._members[old], self._order[old], self._pools[old]
                        self.dead.append(old)
                node.indexed = UNKNOWN
            if not node.gpus or nodes.get(node.name) is not node:
                continue
            state = state_of(node)
            members = self._members.get(state)
            if members is None:
                members = self._members[state] = {}
                self._order[state] = []
                self._pools[state] = frozenset(g.pool for g in node.gpus)
                self.log.append(state)
            elif node.position < self._first_position(state):
                self.log.append(state)  # frontiers hold it at a later position
            members[node.position] = node
            heapq.heappush(self._order[state], node.position)
            node.indexed = state
        if len(self.log) > max(LOG_MIN, 2 * len(self._members)):
            half = len(self.log) // 2  # a frontier that has not read it takes in every state
            del self.log[:half]
            self.base += half

    def live(self) -> KeysView[int]:
        return self._members.keys()

    def members(self, state: int) -> "dict[int, Node] | None":
        """The state's nodes by position; None when no node is in it any more."""
        return self._members.get(state)

    def pools(self, state: int) -> frozenset[str]:
        return self._pools.get(state, frozenset())

    def first(self, state: int) -> "Node | None":
        """The state's node met first (lowest position); None when it has none."""
        members = self._members.get(state)
        return None if members is None else members[self._first_position(state)]

    def first_position(self, state: int) -> int:
        """The position of the state's first node; -1 when it has none."""
        return self._first_position(state) if state in self._members else -1

    def first_allowed(self, state: int, excluded: frozenset[str] | set[str]) -> "Node | None":
        """The state's first node whose name is not `excluded`; None if there is none."""
        members = self._members.get(state)
        if members is None:
            return None
        for position in sorted(members):
            node = members[position]
            if node.name not in excluded:
                return node
        return None

    def _first_position(self, state: int) -> int:
        order, members = self._order[state], self._members[state]
        while order[0] not in members:
            heapq.heappop(order)
        return order[0]


@dataclass(slots=True, eq=False)
class Frontier:
    """One pod shape's heap over the live states (see the module docstring)."""

    heap: list[Entry] = field(default_factory=list)
    current: dict[int, Entry] = field(default_factory=dict)  # state -> its valid entry
    read: int = -1  # how far into the index's log (counting dropped entries) it has read

    def news(self, index: StateIndex) -> Iterable[int]:
        """The states to take in: those logged since the last call, or every live state
        the first time and when the log has dropped entries it had not read (a shape
        not met for a long time: taking in every state costs no more than its news)."""
        end = index.base + len(index.log)
        if self.read < index.base:
            self.read = end
            self.heap.clear()
            self.current.clear()
            return list(index.live())
        news = index.log[self.read - index.base :]
        self.read = end
        return news

    def push(self, entry: Entry) -> None:
        self.current[entry[2]] = entry
        heapq.heappush(self.heap, entry)
        if len(self.heap) > 2 * len(self.current) + COMPACT_SLACK:  # mostly stale: rebuild
            self.heap = list(self.current.values())
            heapq.heapify(self.heap)

    def drop(self, state: int) -> None:
        """The state can never win for this shape (its GPUs refuse the pod)."""
        self.current.pop(state, None)

    def __len__(self) -> int:
        return len(self.current)
