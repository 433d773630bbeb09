"""Turning a plan into capacity pods, the one way the webhook and the scheduler both do:
claimed names count until the informer shows them, AlreadyExists is success, a failure
releases what was not created."""

from gpupack.capacity import capacity_name
from gpupack.objects import JSON
from gpupack.runtime.api import ApiError
from scheduler.capacity_pods import CapacityCreator, Created

POOL = "abc123"
SCHEDULING: JSON = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}


class Pods:
    """Creates pods by name; answers with the errors queued for a name first."""

    def __init__(self, existing: tuple[str, ...] = ()) -> None:
        self.stored: dict[str, JSON] = {name: {} for name in existing}
        self.errors: dict[str, list[ApiError]] = {}
        self.calls: list[str] = []

    def get(self, path: str) -> JSON:
        name = path.rsplit("/", 1)[1]
        if name not in self.stored:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        return self.stored[name]

    def create(self, path: str, body: JSON) -> JSON:
        name = body["metadata"]["name"]
        self.calls.append(name)
        if self.errors.get(name):
            raise self.errors[name].pop(0)
        if name in self.stored:
            raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists')
        self.stored[name] = body
        return body


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def creator(pods: Pods, clock: Clock) -> CapacityCreator:
    return CapacityCreator(
        pods, namespace="gpupack-system", ttl=60, clock=clock, sleep=lambda _: None
    )


def names(*indices: int) -> tuple[str, ...]:
    return tuple(capacity_name(POOL, i) for i in indices)


def test_claims_take_the_lowest_free_names_and_count_until_seen_or_expired() -> None:
    clock = Clock()
    made = creator(Pods(), clock)

    first = made.claim(POOL, 2, used=names(0))
    second = made.claim(POOL, 1, used=names(0))  # the first claim is still in flight

    assert (first, second) == (names(1, 2), names(3))
    assert made.in_flight(POOL, seen=names(1)) == names(2, 3)  # 1 is shown: forgotten
    clock.now = 61
    assert made.in_flight(POOL) == ()


def test_names_in_flight_are_told_apart_by_the_placement_they_were_claimed_for() -> None:
    """A GPU coming for pods that may only run on one node is no GPU for others; the names
    stay taken for every claim all the same."""
    made = creator(Pods(), Clock())

    near = made.claim(POOL, 1, used=(), placement="near-db")
    anywhere = made.claim(POOL, 1, used=())

    assert (near, anywhere) == (names(0), names(1))
    assert made.in_flight(POOL, placement="near-db") == names(0)
    assert made.in_flight(POOL, placement="") == names(1)
    assert made.in_flight(POOL) == names(0, 1)


def test_created_pods_carry_the_pool_and_its_scheduling_metadata() -> None:
    pods = Pods()
    made = creator(pods, Clock())
    claimed = made.claim(POOL, 1, used=())

    result = made.create(POOL, claimed, SCHEDULING, created_for="ml/Deployment/serve")

    assert result == Created(created=names(0))
    body = pods.stored[names(0)[0]]
    assert body["metadata"]["labels"]["gpupack.io/pool"] == POOL
    assert body["spec"]["nodeSelector"] == SCHEDULING["nodeSelector"]
    assert made.in_flight(POOL) == names(0)  # until the informer shows it


def test_already_exists_is_success_another_writer_made_the_same_gpu() -> None:
    made = creator(Pods(existing=names(0)), Clock())

    result = made.create(POOL, made.claim(POOL, 2, used=()), SCHEDULING, "ml/Job/train")

    assert result == Created(created=names(1), existing=names(0))


def test_a_name_held_by_a_capacity_pod_on_its_way_out_is_created_again_once_it_is_gone() -> None:
    """A GPU node deleted: the pod garbage collector marks its capacity pods Failed and
    deletes them. A create racing that deletion met AlreadyExists from a pod that is no
    GPU; counting it as one left the pool's pods waiting for a GPU that never came."""
    pods, clock = Pods(), Clock()
    dying = names(0)[0]
    pods.stored[dying] = {"metadata": {"name": dying}, "status": {"phase": "Failed"}}
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the garbage collector's delete lands meanwhile
        waits.append(seconds)
        clock.now += seconds
        if len(waits) == 2:
            del pods.stored[dying]

    made = CapacityCreator(pods, namespace="gpupack-system", clock=clock, sleep=sleep)
    result = made.create(POOL, made.claim(POOL, 1, used=()), SCHEDULING, "ml/Job/train")

    assert result == Created(created=names(0))
    assert pods.stored[dying]["metadata"]["labels"]["gpupack.io/pool"] == POOL  # the new one
    assert made.in_flight(POOL) == names(0)


def test_a_name_that_stays_held_by_a_pod_on_its_way_out_is_released_with_the_reason() -> None:
    pods, clock = Pods(), Clock()
    dying = names(0)[0]
    pods.stored[dying] = {"metadata": {"name": dying, "deletionTimestamp": "2026-11-27T20:53:03Z"}}

    def sleep(seconds: float) -> None:
        clock.now += seconds

    made = CapacityCreator(pods, namespace="gpupack-system", clock=clock, sleep=sleep)
    result = made.create(POOL, made.claim(POOL, 1, used=()), SCHEDULING, "ml/Job/train")

    assert result.created == ()
    assert result.failure is not None
    assert "still on its way out" in result.failure
    assert made.in_flight(POOL) == ()  # the next plan asks again


def test_retryable_errors_are_retried_and_a_refusal_releases_what_was_not_created() -> None:
    pods = Pods()
    pods.errors[names(0)[0]] = [ApiError(503, "ServiceUnavailable", "etcd leader change")]
    pods.errors[names(1)[0]] = [ApiError(403, "Forbidden", "exceeded quota")]
    made = creator(pods, Clock())

    result = made.create(POOL, made.claim(POOL, 3, used=()), SCHEDULING, "ml/Job/train")

    assert result.created == names(0)
    assert result.failure is not None
    assert "gpupack-capacity-abc123-1 failed: 403 Forbidden" in result.failure
    assert pods.calls == [*names(0, 0, 1)]  # 2 was never tried
    assert made.in_flight(POOL) == names(0)  # 1 and 2 are free for the next plan
