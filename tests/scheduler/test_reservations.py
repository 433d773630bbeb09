"""The reservation state machine on a real cache: reserve → (binding) → confirm, or back
to pending by release or expiry; the snapshot's booking follows each step."""

from scheduler.cache import Cache
from scheduler.ledger import Request
from scheduler.placement import Placement, place
from scheduler.reservations import Reservations
from scheduler.score import PackingScorer
from scheduler.translate import request_of
from tests.scheduler.test_cache import UUIDS, cache_with, capacity, fractional

KEY = "ml/a"


def reserved() -> tuple[Reservations, Cache, Placement]:
    pod = fractional("a", "600m")
    cache, _ = cache_with(capacity(0), pod)
    request = request_of(pod)
    assert isinstance(request, Request)
    placement = place(cache.ledger, request, PackingScorer())
    assert isinstance(placement, Placement)
    assert KEY in cache.pending
    reservations = Reservations(cache)
    reservations.reserve(KEY, pod, request, placement, now=100.0)
    return reservations, cache, placement


def used(cache: Cache) -> int:
    return cache.ledger.gpus[UUIDS[0]].used_compute


def test_a_reserved_share_counts_at_once_and_the_pod_is_no_longer_pending() -> None:
    reservations, cache, placement = reserved()

    assert reservations[KEY].gpu == placement.gpus[0] == UUIDS[0]
    assert reservations.booked(KEY)
    assert used(cache) == 600
    assert KEY not in cache.pending


def test_a_released_share_is_free_again_and_the_pod_pending_again() -> None:
    reservations, cache, _ = reserved()

    assert reservations.release(KEY, "filtered again")
    cache.refresh()

    assert dict(reservations) == {}
    assert not reservations.booked(KEY)
    assert used(cache) == 0
    assert KEY in cache.pending
    assert not reservations.release(KEY, "twice")  # nothing left to give back


def test_a_confirmed_share_stays_booked_until_the_informer_shows_the_pod() -> None:
    reservations, cache, _ = reserved()

    reservations.confirm(KEY, reservations[KEY])

    assert dict(reservations) == {}
    assert reservations.booked(KEY)
    assert used(cache) == 600


def test_expiry_releases_only_what_is_not_binding_past_the_timeout() -> None:
    reservations, cache, _ = reserved()

    assert reservations.expire(now=105.0, timeout=10.0) == []
    reservations[KEY].binding = True
    assert reservations.expire(now=200.0, timeout=10.0) == []  # the writes are running
    reservations[KEY].binding = False
    assert reservations.expire(now=200.0, timeout=10.0) == [KEY]
    assert used(cache) == 0
