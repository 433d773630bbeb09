"""The list-then-watch informer against the in-memory API server."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpupack.objects import JSON
from gpupack.runtime.api import ApiError
from gpupack.runtime.informer import NOT_SERVED_RECHECK, Informer, object_key
from tests.fakes import FakeKube

WAIT = 10.0  # a deadline for the informer's thread, never a measured duration
PODS = "/api/v1/namespaces/gpupack-system/pods"


def pod(name: str, namespace: str = "gpupack-system", **labels: str) -> JSON:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Pending"},
    }


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make(kube: FakeKube, sleeps: list[float]) -> Iterator[Callable[..., Informer]]:
    started: list[Informer] = []

    def make(path: str = PODS, params: dict[str, str] | None = None, **kwargs: Any) -> Informer:
        kwargs.setdefault("draw", lambda: 0.0)  # no jitter: pauses are exact
        informer = Informer(kube, path, params, sleep=sleeps.append, **kwargs)
        informer.start()
        started.append(informer)
        return informer

    yield make
    for informer in started:
        informer.stop()


def names(informer: Informer) -> list[str]:
    return sorted(obj["metadata"]["name"] for obj in informer.items())


def test_lists_then_watches_from_the_lists_resource_version(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    kube.put(pod("a"))
    kube.put(pod("b"))

    informer = make()

    assert informer.wait_synced(WAIT)
    assert informer.synced
    assert names(informer) == ["a", "b"]
    assert kube.wait_for(lambda: kube.open_watches == 1, WAIT)
    list_call, watch_call = kube.calls[:2]
    assert (list_call.verb, watch_call.verb) == ("list", "watch")
    assert watch_call.params["resourceVersion"] == "2"
    assert watch_call.params["allowWatchBookmarks"] == "true"
    assert int(watch_call.params["timeoutSeconds"]) > 0


def test_store_follows_added_modified_and_deleted(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    informer = make()
    assert informer.wait_synced(WAIT)
    assert informer.items() == []

    kube.put(pod("a", app="x"))
    assert informer.wait_for(lambda i: i.get("gpupack-system/a") is not None, WAIT)

    kube.put(pod("a", app="y"))
    assert informer.wait_for(
        lambda i: (i.get("gpupack-system/a") or {})["metadata"]["labels"] == {"app": "y"}, WAIT
    )

    kube.delete("pods", "gpupack-system", "a")
    assert informer.wait_for(lambda i: i.get("gpupack-system/a") is None, WAIT)
    assert informer.resource_version == "3"


def test_selectors_apply_to_the_list_and_the_watch(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    kube.put(pod("capacity-0", role="capacity"))
    kube.put(pod("other"))
    informer = make(params={"labelSelector": "role=capacity"})
    assert informer.wait_synced(WAIT)
    assert names(informer) == ["capacity-0"]

    kube.put(pod("capacity-1", role="capacity"))
    kube.put(pod("capacity-0"))  # no longer matches: arrives as DELETED

    assert informer.wait_for(lambda i: names(i) == ["capacity-1"], WAIT)


def test_error_event_410_lists_again(kube: FakeKube, make: Callable[..., Informer]) -> None:
    kube.put(pod("a"))
    informer = make()
    assert informer.wait_synced(WAIT)
    assert kube.wait_for(lambda: kube.open_watches == 1, WAIT)

    kube.expire_watches()
    kube.put(pod("b"))

    assert informer.wait_for(lambda i: i.lists == 2 and names(i) == ["a", "b"], WAIT)


def test_http_410_on_watch_lists_again(
    kube: FakeKube, make: Callable[..., Informer], sleeps: list[float]
) -> None:
    informer = make()
    assert informer.wait_synced(WAIT)
    assert kube.wait_for(lambda: kube.open_watches == 1, WAIT)

    kube.fail("watch", ApiError(410, "Expired", "too old resource version"))
    kube.end_watches()

    assert informer.wait_for(lambda i: i.lists == 2, WAIT)
    kube.put(pod("after"))
    assert informer.wait_for(lambda i: names(i) == ["after"], WAIT)


def test_repeated_410s_back_off_after_the_first(
    kube: FakeKube, make: Callable[..., Informer], sleeps: list[float]
) -> None:
    kube.fail("watch", ApiError(410, "Expired", "too old resource version"), times=3)

    informer = make()

    assert kube.wait_for(lambda: kube.count("list") == 4 and kube.open_watches == 1, WAIT)
    assert informer.synced
    assert sleeps == [0.5, 1.0]  # the first 410 re-lists at once


def test_a_watch_from_a_compacted_version_lists_again(make: Callable[..., Informer]) -> None:
    kube = FakeKube(gone_as_event=False)
    kube.put(pod("a"))
    informer = Informer(kube, PODS, sleep=lambda _: None)
    blocked: list[int] = []
    original_watch = kube.watch

    def watch_after_compaction(path: str, params: Any) -> Any:
        if not blocked:  # history is compacted between the list and the first watch
            blocked.append(1)
            kube.put(pod("b"))
            kube.compact()
            kube.put(pod("c"))
        return original_watch(path, params)

    kube.watch = watch_after_compaction  # type: ignore[method-assign]
    informer.start()
    try:
        assert informer.wait_for(lambda i: i.lists == 2 and names(i) == ["a", "b", "c"], WAIT)
    finally:
        informer.stop()


def test_server_closing_the_watch_resumes_without_listing(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    informer = make()
    assert informer.wait_synced(WAIT)
    assert kube.wait_for(lambda: kube.open_watches == 1, WAIT)
    kube.put(pod("a"))
    assert informer.wait_for(lambda i: names(i) == ["a"], WAIT)

    kube.end_watches()
    assert kube.wait_for(lambda: kube.count("watch") == 2 and kube.open_watches == 1, WAIT)
    kube.put(pod("b"))

    assert informer.wait_for(lambda i: names(i) == ["a", "b"], WAIT)
    assert informer.lists == 1
    assert kube.calls[-1].params["resourceVersion"] == "1"


def test_bookmarks_advance_the_resource_version(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    informer = make(params={"labelSelector": "role=capacity"})
    assert informer.wait_synced(WAIT)
    assert kube.wait_for(lambda: kube.open_watches == 1, WAIT)
    kube.put(pod("unrelated"))  # not delivered: the selector does not match

    kube.bookmark()

    assert informer.wait_for(lambda i: i.resource_version == "1", WAIT)
    assert informer.items() == []


def test_failures_back_off_boundedly_then_recover(
    kube: FakeKube, make: Callable[..., Informer], sleeps: list[float]
) -> None:
    kube.put(pod("a"))
    kube.fail("list", ApiError(0, "ConnectionError", "connection refused"), times=3)
    kube.fail("list", ApiError(403, "Forbidden", "pods is forbidden"), times=5)

    informer = make()

    assert informer.wait_synced(WAIT)
    assert names(informer) == ["a"]
    assert sleeps[:8] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_a_failing_watch_is_retried_from_the_same_version(
    kube: FakeKube, make: Callable[..., Informer], sleeps: list[float]
) -> None:
    kube.fail("watch", ApiError(500, "InternalError", "etcd timeout"))
    informer = make()
    assert informer.wait_synced(WAIT)

    kube.put(pod("a"))

    assert informer.wait_for(lambda i: names(i) == ["a"], WAIT)
    assert informer.lists == 1
    assert sleeps == [0.5]


def test_lists_every_page(kube: FakeKube, make: Callable[..., Informer]) -> None:
    for i in range(5):
        kube.put(pod(f"p{i}"))

    informer = make(page_size=2)

    assert informer.wait_synced(WAIT)
    assert names(informer) == ["p0", "p1", "p2", "p3", "p4"]
    assert [c.params.get("continue", "") != "" for c in kube.calls if c.verb == "list"] == [
        False,
        True,
        True,
    ]


def test_indexes_follow_changes(kube: FakeKube, make: Callable[..., Informer]) -> None:
    def by_pool(obj: JSON) -> list[str]:
        pool = obj["metadata"]["labels"].get("pool")
        return [pool] if pool else []

    kube.put(pod("a", pool="p1"))
    informer = make(indexers={"pool": by_pool})
    assert informer.wait_synced(WAIT)
    assert [object_key(o) for o in informer.by_index("pool", "p1")] == ["gpupack-system/a"]

    kube.put(pod("a", pool="p2"))
    kube.put(pod("b", pool="p2"))
    assert informer.wait_for(lambda i: len(i.by_index("pool", "p2")) == 2, WAIT)
    assert informer.by_index("pool", "p1") == []

    kube.delete("pods", "gpupack-system", "a")
    assert informer.wait_for(lambda i: names(i) == ["b"], WAIT)
    assert [object_key(o) for o in informer.by_index("pool", "p2")] == ["gpupack-system/b"]


def test_a_failing_indexer_does_not_break_the_cache(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    def fragile(obj: JSON) -> list[str]:
        return [obj["metadata"]["labels"]["pool"]]  # KeyError without the label

    kube.put(pod("a"))
    informer = make(indexers={"pool": fragile})
    assert informer.wait_synced(WAIT)

    kube.put(pod("b", pool="p"))

    assert informer.wait_for(lambda i: names(i) == ["a", "b"], WAIT)
    assert [object_key(o) for o in informer.by_index("pool", "p")] == ["gpupack-system/b"]


def test_cluster_scoped_objects_are_keyed_by_name(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    kube.put({"kind": "Namespace", "metadata": {"name": "ml", "labels": {"x": "y"}}})

    informer = make("/api/v1/namespaces")

    assert informer.wait_synced(WAIT)
    assert informer.keys() == ["ml"]
    assert (informer.get("ml") or {})["metadata"]["labels"] == {"x": "y"}


def test_stop_ends_the_thread_and_closes_the_watch(kube: FakeKube) -> None:
    informer = Informer(kube, PODS)
    informer.start()
    assert informer.wait_synced(WAIT)
    assert kube.wait_for(lambda: kube.open_watches == 1, WAIT)

    informer.stop(timeout=WAIT)

    assert not informer.running
    assert kube.open_watches == 0


def test_stop_interrupts_a_backoff_pause(kube: FakeKube) -> None:
    kube.fail("list", ApiError(503, "ServiceUnavailable", "starting"), times=100)
    informer = Informer(kube, PODS)  # the real pause: waits on the stop signal
    informer.start()
    assert kube.wait_for(lambda: kube.count("list") >= 1, WAIT)

    informer.stop(timeout=WAIT)

    assert not informer.running
    assert not informer.synced


def test_the_last_failure_is_visible_until_the_cache_is_current_again(kube: FakeKube) -> None:
    kube.put(pod("a"))
    kube.fail("list", ApiError(0, "ConnectionError", "connection refused"), times=2)
    seen: list[str] = []
    holder: list[Informer] = []

    def pause(_: float) -> None:  # what a reader sees while the informer backs off
        seen.append(holder[0].error)

    informer = Informer(kube, "/api/v1/pods", name="pods", sleep=pause)
    holder.append(informer)
    assert informer.error == ""
    informer.start()
    try:
        assert informer.wait_synced(WAIT)
        assert seen == ["0 ConnectionError: connection refused"] * 2
        assert informer.error == ""
    finally:
        informer.stop()


def lists(kube: FakeKube) -> list[dict[str, str]]:
    return [call.params for call in kube.calls if call.verb == "list"]


def test_the_first_list_is_served_from_the_watch_cache(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    informer = make()
    assert informer.wait_synced(WAIT)

    assert lists(kube)[0]["resourceVersion"] == "0"
    assert "resourceVersionMatch" not in lists(kube)[0]


def test_a_relist_asks_the_cache_for_nothing_older_than_what_was_seen(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    kube.put(pod("a"))
    informer = make()
    assert informer.wait_synced(WAIT)
    assert kube.wait_for(lambda: kube.open_watches == 1, WAIT)
    seen = informer.resource_version

    kube.fail("watch", ApiError(410, "Expired", "too old resource version"))
    kube.end_watches()

    assert informer.wait_for(lambda i: i.lists == 2, WAIT)
    relist = lists(kube)[1]
    assert (relist["resourceVersion"], relist["resourceVersionMatch"]) == (seen, "NotOlderThan")


def test_a_list_refused_as_too_old_is_read_consistently_from_etcd(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    kube.fail("list", ApiError(410, "Expired", "too old resource version"))

    informer = make()

    assert informer.wait_synced(WAIT)
    first, second = lists(kube)[:2]
    assert first["resourceVersion"] == "0"
    assert "resourceVersion" not in second
    assert "resourceVersionMatch" not in second


def test_continued_pages_carry_their_token_and_no_resource_version(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    for index in range(5):
        kube.put(pod(f"p{index}"))

    informer = make(page_size=2)

    assert informer.wait_synced(WAIT)
    pages = lists(kube)
    assert len(pages) == 3
    assert pages[0]["resourceVersion"] == "0"
    assert all("continue" in p and "resourceVersion" not in p for p in pages[1:])


def test_after_a_410_watchers_relist_at_random_moments_within_the_backoffs_base(
    kube: FakeKube, make: Callable[..., Informer], sleeps: list[float]
) -> None:
    """An API server restart ends every watch of every exporter in the cluster at once;
    relisting in the same instant would be a storm."""
    kube.fail("watch", ApiError(410, "Expired", "too old resource version"))

    informer = make(draw=lambda: 0.5)

    assert informer.wait_for(lambda i: i.lists == 2, WAIT)
    assert sleeps[0] == pytest.approx(0.25)  # half of the 0.5 s base


def test_objects_are_kept_without_the_field_managers_bookkeeping(
    kube: FakeKube, make: Callable[..., Informer]
) -> None:
    """`metadata.managedFields` (about a third of a pod several controllers wrote) is
    read by no gpupack component: neither a listed nor a watched object keeps it."""
    managed = [{"manager": "kube-scheduler", "operation": "Update", "fieldsV1": {"f:status": {}}}]
    listed = pod("listed", app="x")
    listed["metadata"]["managedFields"] = managed
    kube.put(listed)
    informer = make()
    assert informer.wait_synced(WAIT)

    watched = pod("watched", app="y")
    watched["metadata"] |= {"managedFields": managed, "annotations": {"a": "b"}}
    kube.put(watched)
    assert informer.wait_for(lambda i: i.get("gpupack-system/watched") is not None, WAIT)

    kept = {obj["metadata"]["name"]: obj["metadata"] for obj in informer.items()}
    assert not any("managedFields" in meta for meta in kept.values())
    assert kept["listed"]["labels"] == {"app": "x"}
    assert kept["watched"]["annotations"] == {"a": "b"}


def test_an_optional_api_the_cluster_does_not_serve_is_an_empty_synced_cache_asked_again(
    kube: FakeKube, make: Callable[..., Informer], sleeps: list[float]
) -> None:
    """A resource group of a newer release (DRA's on a 1.32 cluster): nothing is wrong,
    the cache is empty, and an upgraded cluster is seen at the next look."""
    not_found = ApiError(404, "NotFound", "the server could not find the requested resource")
    kube.fail("list", not_found, times=2)
    changes: list[str] = []

    informer = make(optional=True, on_change=changes.append)

    assert informer.wait_synced(WAIT)
    assert informer.error == ""
    kube.put(pod("a"))
    assert informer.wait_for(lambda i: names(i) == ["a"], WAIT)
    assert informer.served
    assert sleeps[:2] == [NOT_SERVED_RECHECK, NOT_SERVED_RECHECK]
    assert changes[:2] == ["", ""]  # synced empty once; listed once served


def test_a_404_is_a_failure_for_an_informer_that_is_not_optional(
    kube: FakeKube, make: Callable[..., Informer], sleeps: list[float]
) -> None:
    kube.fail("list", ApiError(404, "NotFound", "no such resource"), times=1)

    informer = make()

    assert informer.wait_synced(WAIT)
    assert sleeps == [0.5]  # backed off as any failure, not the long look of optional
