"""MPS daemons as the scheduler sees them: ready or not, restarted or not."""

from typing import Any

from scheduler.mps_health import MpsHealth, daemon_ready, last_exit, note


def capacity(uid: str, restarts: int = 0, ready: bool = True, mps: bool = True) -> Any:
    labels = {"gpupack.io/role": "capacity", **({"gpupack.io/sharing": "mps"} if mps else {})}
    return {
        "metadata": {
            "name": f"cap-{uid}",
            "namespace": "gpupack-system",
            "uid": uid,
            "labels": labels,
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "capacity", "ready": ready, "restartCount": restarts}],
        },
    }


def test_the_first_sight_of_a_daemon_is_its_baseline_and_each_restart_is_reported_once() -> None:
    health = MpsHealth()
    assert health.restarted([capacity("a", restarts=2)]) == []  # before this scheduler
    assert health.restarted([capacity("a", restarts=2)]) == []
    (restart,) = health.restarted([capacity("a", restarts=3)])
    assert restart.count == 3
    assert health.restarted([capacity("a", restarts=3)]) == []


def test_pods_of_shared_pools_are_not_watched_and_gone_pods_are_forgotten() -> None:
    health = MpsHealth()
    assert health.restarted([capacity("a", mps=False), capacity("b")]) == []
    assert health.restarted([capacity("a", restarts=5, mps=False)]) == []
    # b left and came back with the same UID: a fresh baseline, no stale report.
    assert health.restarted([capacity("b", restarts=4)]) == []


def test_only_an_mps_daemon_that_answers_is_ready() -> None:
    assert daemon_ready(capacity("a"))
    assert not daemon_ready(capacity("a", ready=False))
    pending = capacity("a")
    pending["status"] = {"phase": "Pending"}
    assert not daemon_ready(pending)
    assert daemon_ready(capacity("a", ready=False, mps=False))  # not a daemon at all


def test_the_event_says_how_the_daemon_ended_and_whom_it_cost() -> None:
    pod = capacity("a", restarts=1)
    pod["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"reason": "OOMKilled", "exitCode": 137}
    }
    text = note(pod, ["ml/b", "ml/a"])
    assert "OOMKilled with status 137" in text
    assert "2 pods on its GPU (ml/a, ml/b) lost their MPS server" in text
    assert "kubectl logs -n gpupack-system cap-a --previous" in text
    assert last_exit(capacity("b")) == "its end was not reported"
