"""The consolidation loop over an in-memory cache: what it evicts, what it never touches,
the budget it keeps, and how it finishes or gives up a drain."""

import json
from collections.abc import Callable
from typing import Any

import pytest

from gpupack import keys
from gpupack.policy import (
    BUILTIN,
    ConsolidationMode,
    PolicySet,
    effective_policies,
    policy_spec,
)
from gpupack.runtime.api import ApiError
from scheduler.drain import Drainer
from scheduler.ledger import Request
from scheduler.lifecycle import Lifecycle
from scheduler.placement import Placement, place, why_unfit
from scheduler.score import PackingScorer
from scheduler.settings import Settings
from scheduler.translate import capacity_gpu
from tests.scheduler.test_cache import POOL, UUIDS, cache_with, capacity, fractional

JSON = dict[str, Any]
WINDOW = 600
BUDGETS = "gpupack-scheduler-consolidation"


class Kube:
    """Records the writes; evictions of `refuse` answer 429 as a PodDisruptionBudget does."""

    def __init__(self, refuse: frozenset[str] = frozenset(), budgets: JSON | None = None) -> None:
        self.refuse = refuse
        self.budgets = budgets  # the ConfigMap of consolidation budgets; None: absent
        self.calls: list[tuple[str, str, JSON | None]] = []

    def patch(self, path: str, body: JSON, content_type: str = "") -> JSON:
        self.calls.append(("patch", path, body))
        return body

    def create(self, path: str, body: JSON) -> JSON:
        if path.endswith("/eviction") and path.split("/")[6] in self.refuse:
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the PDB")
        self.calls.append(("create", path, body))
        return body

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        self.calls.append(("delete", path, body))
        return {}

    def get(self, path: str) -> JSON:
        assert path == f"/api/v1/namespaces/{keys.SYSTEM_NAMESPACE}/configmaps/{BUDGETS}"
        if self.budgets is None:
            raise ApiError(404, "NotFound", f'configmaps "{BUDGETS}" not found')
        return self.budgets

    def saved(self) -> JSON:
        """The budgets last written to the ConfigMap."""
        written = [b for verb, p, b in self.calls if verb == "patch" and p.endswith(BUDGETS)]
        assert written
        assert written[-1] is not None
        ledger: JSON = json.loads(written[-1]["data"]["evictions"])
        return ledger

    def watch(self, path: str, params: Any) -> Any:
        raise NotImplementedError

    def evicted(self) -> list[str]:
        return [p.split("/")[6] for verb, p, _ in self.calls if p.endswith("/eviction")]

    def events(self) -> list[JSON]:
        return [b for verb, p, b in self.calls if verb == "create" and "/events" in p and b]

    def list(self, path: str, params: Any) -> JSON:
        raise NotImplementedError


def policies(mode: ConsolidationMode = ConsolidationMode.ON, **budget: Any) -> PolicySet:
    spec = policy_spec(BUILTIN["batch"])
    spec["consolidation"] = {"mode": mode.value, "windowSeconds": WINDOW, **budget}
    return effective_policies([{"metadata": {"name": "batch"}, "spec": spec}])


def running(
    name: str, compute: str, gpu: int, owner: str = "ReplicaSet", workload: str = "", **extra: str
) -> JSON:
    """A running pod of a controller of kind `owner` named `workload` (else its own)."""
    pod = fractional(name, compute, gpu=gpu)
    pod["status"]["phase"] = "Running"
    pod["metadata"]["annotations"] |= {keys.POLICY: "batch", **extra}
    pod["metadata"]["ownerReferences"] = [
        {"kind": owner, "name": workload or f"{name}-owner", "controller": True}
    ]
    return pod


def drainer(
    *pods: JSON, kube: Kube | None = None, policy_set: PolicySet | None = None, **settings: Any
) -> tuple[Drainer, Kube, Callable[[float], list[str]]]:
    cache, _ = cache_with(capacity(0), capacity(1), capacity(2), *pods)
    kube = kube or Kube()
    chosen = policy_set or policies()
    made = Drainer(
        kube,
        cache,
        lambda: chosen,
        Settings(consolidation_interval=1.0, **settings),
        lambda f, *a: f(*a),
        wall=lambda: 1_800_000_000.0,
    )

    def round_at(now: float) -> list[str]:
        return [m.gpu for m in made.round(now)]

    made.round(0.0)  # this leader's budgets begin
    return made, kube, round_at


def test_the_emptiest_gpus_are_marked_draining_and_their_pods_evicted_with_an_event() -> None:
    """The pool needs one GPU and holds three on one node: the two emptiest are emptied
    in one round, onto the third."""
    _, kube, round_at = drainer(
        running("a", "600m", 0), running("b", "100m", 1), running("c", "200m", 2)
    )

    assert round_at(WINDOW) == [UUIDS[1], UUIDS[2]]

    marks = [b for verb, p, b in kube.calls if verb == "patch" and b is not None]
    assert len(marks) == 2
    assert all(keys.DRAINING in mark["metadata"]["annotations"] for mark in marks)
    assert sorted(kube.evicted()) == ["b", "c"]
    events = kube.events()
    assert [e["reason"] for e in events] == ["GPUConsolidation"] * 2
    assert all("holds 3 GPUs where its shares need 1" in e["note"] for e in events)


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        pytest.param(running("b", "100m", 1, owner="Job"), "a Job's pod", id="job"),
        pytest.param(
            running("b", "100m", 1, **{keys.KARPENTER_DO_NOT_DISRUPT: "true"}),
            "asks to stay",
            id="do-not-disrupt",
        ),
        pytest.param(
            running("b", "100m", 1, **{keys.POLICY: "training"}), "policy Off", id="policy-off"
        ),
    ],
)
def test_pods_that_must_not_move_keep_their_gpu(pod: JSON, why: str) -> None:
    _, kube, round_at = drainer(running("a", "950m", 0), pod)  # a fits nowhere else

    assert round_at(WINDOW) == [], why
    assert kube.calls == []


WALL = 1_800_000_000.0


def test_a_new_leader_spends_what_the_last_one_spent() -> None:
    """The last leader moved workload w 100 s ago (WINDOW is longer): this leader reads
    that from the ConfigMap and leaves w alone, but moves x at once, then writes both."""
    ledger = {"ml/ReplicaSet/w": [WALL - 100.0]}
    kube = Kube(budgets={"data": {"evictions": json.dumps(ledger)}})
    drainer(  # its first round, at once
        running("a", "600m", 0),
        running("b", "100m", 1, workload="w"),
        running("c", "100m", 2, workload="x"),
        kube=kube,
        budgets_configmap=BUDGETS,
    )
    assert kube.evicted() == ["c"]  # b's GPU would empty too, but w's budget is spent
    saved = kube.saved()
    assert saved["ml/ReplicaSet/w"] == [WALL - 100.0]
    assert saved["ml/ReplicaSet/x"] == [pytest.approx(WALL, abs=2)]


@pytest.mark.parametrize(
    "budgets",
    [
        pytest.param(None, id="absent"),
        pytest.param({"data": {"evictions": "[not json"}}, id="unreadable"),
    ],
)
def test_a_leader_that_cannot_read_the_budgets_waits_a_window(budgets: JSON | None) -> None:
    _, _kube, round_at = drainer(
        running("a", "600m", 0),
        running("b", "100m", 1),
        kube=Kube(budgets=budgets),
        budgets_configmap=BUDGETS,
    )
    assert round_at(WINDOW - 1) == []
    assert round_at(WINDOW) == [UUIDS[1]]


def test_a_new_leader_moves_nothing_until_a_budget_window_has_passed() -> None:
    _, _kube, round_at = drainer(running("a", "600m", 0), running("b", "100m", 1))

    assert round_at(WINDOW - 1) == []
    assert round_at(WINDOW) == [UUIDS[1]]


def test_a_workload_is_moved_at_most_its_budget_per_window() -> None:
    one = {"workload": "w"}
    _, kube, round_at = drainer(
        running("a", "600m", 0, **one),
        running("b", "100m", 1, **one),
        running("c", "100m", 2, **one),
    )
    assert round_at(WINDOW) == [UUIDS[1]]  # c's GPU too would empty, but w spent its budget

    assert round_at(WINDOW + 1) == []  # w spent its one eviction of this window
    assert round_at(2 * WINDOW) != []
    assert kube.evicted() == ["b", "b"]  # this cache never sees b leave


def test_idle_gpus_mode_moves_only_pods_off_gpus_that_hold_little() -> None:
    chosen = policies(ConsolidationMode.IDLE, idleBelow=0.15)
    _, _kube, round_at = drainer(
        running("a", "300m", 0),
        running("b", "200m", 1),
        running("c", "100m", 2),
        policy_set=chosen,
    )

    assert round_at(WINDOW) == [UUIDS[2]]  # 0.1 GPU held: idle; b's 0.2 is not


def test_a_refused_eviction_gives_the_gpu_back_to_placement_at_once() -> None:
    _, kube, round_at = drainer(
        running("a", "600m", 0), running("b", "100m", 1), kube=Kube(refuse=frozenset({"b"}))
    )

    round_at(WINDOW)

    marks = [
        b["metadata"]["annotations"][keys.DRAINING]
        for verb, _, b in kube.calls
        if verb == "patch" and b
    ]
    assert marks[0]
    assert marks[-1] is None
    assert kube.evicted() == []
    (blocked,) = kube.events()
    assert blocked["reason"] == "GPUConsolidationBlocked"
    assert "PodDisruptionBudget" in blocked["note"]


def draining(index: int, since: str = "2026-11-25T00:00:00Z") -> JSON:
    pod = capacity(index)
    pod["metadata"]["annotations"][keys.DRAINING] = since
    return pod


def test_a_draining_gpu_takes_no_new_pod() -> None:
    gpu = capacity_gpu(draining(0), None)

    assert gpu is not None
    assert gpu.draining
    cache, _ = cache_with(draining(0))
    request = Request("ml/new", compute=100, pool=POOL)
    result = place(cache.ledger, request, PackingScorer())
    assert not isinstance(result, Placement)
    assert "draining" in why_unfit(cache.ledger, request, PackingScorer()).message


def test_an_emptied_draining_capacity_pod_is_deleted_and_a_stuck_one_given_back() -> None:
    kube = Kube()
    began = "2026-11-25T00:00:00Z"  # 1_795_564_800
    cache, _ = cache_with(draining(0, began), draining(1, began), running("a", "100m", 1))
    settings = Settings(consolidation_interval=1.0, drain_timeout=60.0)
    Lifecycle(kube, cache, settings, lambda f, *a: f(*a)).housekeeping(0.0, {})
    deleted = [p for verb, p, _ in kube.calls if verb == "delete"]
    assert deleted == [f"/api/v1/namespaces/{keys.SYSTEM_NAMESPACE}/pods/cap-0"]
    kube.calls.clear()

    def drain_at(wall: float) -> None:
        made = Drainer(kube, cache, policies, settings, lambda f, *a: f(*a), wall=lambda: wall)
        made.round(0.0)

    drain_at(1_795_564_800 + 59)
    assert [b for verb, _, b in kube.calls if verb == "patch"] == []  # not yet
    drain_at(1_795_564_800 + 60)
    (unmark,) = [b for verb, _, b in kube.calls if verb == "patch"]
    assert unmark == {"metadata": {"annotations": {keys.DRAINING: None}}}


def test_the_builtins_move_what_tolerates_a_restart_and_never_training_or_mps() -> None:
    modes = {
        name: (p.consolidation.mode, p.consolidation.min_replicas) for name, p in BUILTIN.items()
    }
    assert modes == {
        "real-time": (ConsolidationMode.ON, 2),
        "near-real-time": (ConsolidationMode.ON, 1),
        "batch": (ConsolidationMode.ON, 1),
        "build": (ConsolidationMode.ON, 1),
        "training": (ConsolidationMode.OFF, 1),
        "real-time-mps": (ConsolidationMode.OFF, 1),
    }
    moved = [
        p.consolidation for p in BUILTIN.values() if p.consolidation.mode is ConsolidationMode.ON
    ]
    assert {(c.evictions, c.window_seconds) for c in moved} == {(2, 600)}


def test_emptying_a_gpu_spends_the_budget_of_every_pod_of_the_workload_on_it() -> None:
    """Two pods of w share GPU 1; a budget of one eviction per window cannot move both, so
    the GPU stays; a budget of two moves them together."""
    w = {"workload": "w"}
    stays = {keys.KARPENTER_DO_NOT_DISRUPT: "true"}  # a's GPU is no candidate
    pods = (
        running("a", "600m", 0, **stays),
        running("b", "100m", 1, **w),
        running("c", "100m", 1, **w),
    )
    _, kube, round_at = drainer(*pods)
    assert round_at(WINDOW) == []
    assert kube.evicted() == []

    _, kube, round_at = drainer(*pods, policy_set=policies(evictionsPerWindow=2))
    assert round_at(WINDOW) == [UUIDS[1]]
    assert sorted(kube.evicted()) == ["b", "c"]


def test_a_real_time_server_moves_only_while_another_replica_of_it_serves() -> None:
    spec = policy_spec(BUILTIN["real-time"])
    spec["consolidation"] |= {"windowSeconds": WINDOW}
    chosen = effective_policies([{"metadata": {"name": "real-time"}, "spec": spec}])
    rt = {keys.POLICY: "real-time", "workload": "server"}

    _, kube, round_at = drainer(
        running("a", "950m", 0), running("b", "100m", 1, **rt), policy_set=chosen
    )
    assert round_at(WINDOW) == []  # one replica: moving it is an outage
    assert kube.calls == []

    _, kube, round_at = drainer(
        running("a", "600m", 0, **rt), running("b", "100m", 1, **rt), policy_set=chosen
    )
    assert round_at(WINDOW) == [UUIDS[1]]
    assert kube.evicted() == ["b"]
