"""The extender keeps house only while the kube-scheduler beside it holds a live Lease."""

from gpupack.objects import JSON
from gpupack.runtime.api import ApiError
from scheduler.leadership import Follower


class Leases:
    def __init__(self) -> None:
        self.lease: JSON | None = None

    def get(self, path: str) -> JSON:
        if self.lease is None:
            raise ApiError(404, "NotFound", "no lease")
        return self.lease

    def hold(self, holder: str, version: str) -> None:
        self.lease = {
            "metadata": {"resourceVersion": version},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
        }


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def follower() -> tuple[Follower, Leases, Clock]:
    leases, clock = Leases(), Clock()
    return Follower(leases, "gpupack-system", "gpupack-scheduler", "pod-a", clock), leases, clock


def test_the_kube_scheduler_beside_it_holding_the_lease_leads() -> None:
    f, leases, _ = follower()
    assert not f.check()  # no Lease yet
    leases.hold("pod-a_0f3c", "1")
    assert f.check()
    leases.hold("pod-ab_77e1", "2")  # a prefix of another pod's name is not ours
    assert not f.check()


def test_a_holder_that_stopped_renewing_no_longer_leads() -> None:
    f, leases, clock = follower()
    leases.hold("pod-a_0f3c", "1")
    assert f.check()
    clock.now += 14
    assert f.check()
    clock.now += 2  # the record has not changed for the Lease's 15 s
    assert not f.check()
    leases.hold("pod-a_0f3c", "2")  # renewed
    assert f.check()
