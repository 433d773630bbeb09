"""Leader election over an in-memory Lease store with the API server's optimistic
concurrency (a write with a stale resourceVersion is a 409 Conflict)."""

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from gpupack.runtime.api import ApiError, WatchStream
from gpupack.runtime.leader import Elector, Timing

JSON = dict[str, Any]
PATH = "/apis/coordination.k8s.io/v1/namespaces/gpupack-system/leases/gpupack-scheduler"


class Leases:
    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self.version = 0
        self.lock = threading.Lock()

    def _store(self, path: str, body: JSON) -> JSON:
        self.version += 1
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        self.objects[path] = stored
        return stored

    def get(self, path: str) -> JSON:
        with self.lock:
            if path not in self.objects:
                raise ApiError(404, "NotFound", path)
            return self.objects[path]

    def create(self, path: str, body: JSON) -> JSON:
        with self.lock:
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                raise ApiError(409, "AlreadyExists", target)
            return self._store(target, body)

    def update(self, path: str, body: JSON) -> JSON:
        with self.lock:
            current = self.objects.get(path)
            if current is None:
                raise ApiError(404, "NotFound", path)
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
            return self._store(path, body)

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        raise NotImplementedError

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream:
        raise NotImplementedError

    def patch(self, path: str, body: JSON, content_type: str = "") -> JSON:
        raise NotImplementedError

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


TIMING = Timing(lease_duration=15, renew_deadline=10, retry_period=2)


def elector(leases: Leases, identity: str, clock: Clock) -> Elector:
    return Elector(leases, "gpupack-system", "gpupack-scheduler", identity, TIMING, clock)


def holder(leases: Leases) -> str:
    return str(leases.get(PATH)["spec"]["holderIdentity"])


def test_the_first_candidate_creates_the_lease_and_the_second_waits() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)

    assert a.try_acquire()
    assert not b.try_acquire()
    assert holder(leases) == "a"


def test_a_lease_that_stops_changing_expires_by_the_candidates_own_clock() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    a.try_acquire()
    assert not b.try_acquire()  # b starts watching the record now

    clock.now = 14.9
    assert not b.try_acquire()
    clock.now = 15.0
    assert b.try_acquire()
    assert holder(leases) == "b"
    assert leases.get(PATH)["spec"]["leaseTransitions"] == 1


def test_a_renewing_leader_keeps_the_lease() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    a.try_acquire()
    for step in range(1, 20):
        clock.now = step * 2.0
        assert a.try_acquire()
        assert not b.try_acquire()


def test_two_candidates_racing_for_an_expired_lease_produce_one_winner() -> None:
    leases, clock = Leases(), Clock()
    elector(leases, "old", clock).try_acquire()
    b, c = elector(leases, "b", clock), elector(leases, "c", clock)
    b.try_acquire(), c.try_acquire()  # both start watching the record
    clock.now = 20.0  # expired for both
    update = leases.update

    def c_wins_between_bs_read_and_write(path: str, body: JSON) -> JSON:
        leases.update = update  # type: ignore[method-assign]
        assert c.try_acquire()  # c reads, writes and wins first
        return update(path, body)  # b's write carries the version it read: Conflict

    leases.update = c_wins_between_bs_read_and_write  # type: ignore[method-assign]

    assert not b.try_acquire()
    assert holder(leases) == "c"


def test_release_lets_a_standby_take_over_without_waiting_for_expiry() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)
    a.try_acquire()
    a.release()

    assert b.try_acquire()


def test_run_stops_leading_when_renewals_fail_past_the_deadline() -> None:
    leases, clock = Leases(), Clock()
    lost_seen = threading.Event()
    original = leases.update

    def lead(lost: threading.Event) -> None:
        # Leading: from now on etcd is down, and each failed renewal costs a second.
        def failing_update(path: str, body: JSON) -> JSON:
            clock.now += 1
            raise ApiError(500, "InternalError", "etcd is down")

        leases.update = failing_update  # type: ignore[method-assign]
        lost.wait(5)
        lost_seen.set()

    timing = Timing(lease_duration=3, renew_deadline=2, retry_period=0.01)
    candidate = Elector(leases, "gpupack-system", "gpupack-scheduler", "a", timing, clock)

    assert candidate.run(lead, threading.Event()) is False
    assert lost_seen.is_set()
    leases.update = original  # type: ignore[method-assign]


def test_inconsistent_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="retry-period < renew-deadline < lease-duration"):
        Timing(lease_duration=5, renew_deadline=10, retry_period=2)


def test_clocks_that_disagree_by_an_hour_still_give_one_leader() -> None:
    """The leader's machine runs an hour behind, so every renewTime it writes looks an
    hour stale to the standby's clock; the standby, an hour ahead, still waits as long
    as the record keeps changing, and takes over only once it stops."""
    leases, leader_clock, standby_clock = Leases(), Clock(), Clock()
    standby_clock.now = 3600.0
    a, b = elector(leases, "a", leader_clock), elector(leases, "b", standby_clock)
    update = leases.update

    def written_an_hour_behind(path: str, body: JSON) -> JSON:
        spec = body["spec"]
        spec["renewTime"] = "2020-01-01T00:00:00.000000Z"  # long past by anyone's clock
        return update(path, body)

    leases.update = written_an_hour_behind  # type: ignore[method-assign]
    assert a.try_acquire()
    for step in range(1, 20):
        leader_clock.now = step * 2.0
        standby_clock.now = 3600.0 + step * 2.0
        assert a.try_acquire()
        assert not b.try_acquire()
    standby_clock.now += TIMING.lease_duration  # the leader stops renewing
    assert b.try_acquire()
    assert holder(leases) == "b"
