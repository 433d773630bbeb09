"""A list-then-watch cache of one kind of object, kept current by a daemon thread.

The reflector loop client-go and kopf use: list (every page), remember the list's
resourceVersion, watch from it, apply ADDED/MODIFIED/DELETED to a store keyed by
`namespace/name` (or `name` for cluster-scoped objects), follow BOOKMARKs, and list
again when the server says the resourceVersion is gone (HTTP 410 or an ERROR event with
code 410). Other failures back off (bounded) and resume. `synced` becomes true after the
first complete list; readers get snapshots under a lock and never see a half-applied list.
`on_change` hears the key of every changed object, and "" after each (re)list, when any
object may have changed: a consumer keeps a dirty set instead of rescanning the store.

Objects are stored as `keep` makes them: by default without `metadata.managedFields`,
the API server's record of which client set which field (server-side apply's
bookkeeping), which no gpupack component reads and which is about a third of a pod
several controllers wrote, kept for every pod the cluster runs (client-go's informers drop
it the same way, `TransformStripManagedFields`). A component that reads a few fields of
many objects keeps only those (the webhook's pod caches). A merge or JSON patch built
from a stored object leaves the server's copy of the rest as it is; nothing may send a
stored object back whole.

An `optional` informer is over an API the cluster may not serve (a resource group of a
newer release): while a list answers 404 its store is empty and synced, with no error,
and it asks again every `NOT_SERVED_RECHECK` seconds (a cluster upgraded meanwhile).

Indexers map an object to the values it is found under (`by_index("pool", key)`), so a
reader asks for one pool's pods without scanning every pod in the cluster.

Lists are served from the API server's watch cache where that is safe, as client-go's
reflector asks: the first with `resourceVersion=0` (any version the cache has), later
ones with the last version seen and `resourceVersionMatch=NotOlderThan` (never older than
what the store already showed); only a list the server answered with 410 is repeated as
a consistent read from etcd. After an API server restart every exporter of a large
cluster relists at once; from the cache and at jittered moments (`Backoff.jitter`, and up
to the backoff's base before the first relist) that is no storm on etcd.
"""

import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from gpupack.objects import JSON
from gpupack.runtime.api import ApiError, Backoff, ListWatch, WatchStream

log = logging.getLogger(__name__)

Indexer = Callable[[JSON], Iterable[str]]

WATCH_TIMEOUT_SECONDS: Final = 300
PAGE_SIZE: Final = 500
NOT_SERVED_RECHECK: Final = 300.0  # seconds between lists of an API not served (optional)


def trimmed(obj: JSON) -> JSON:
    """`obj` as the store keeps it: without `metadata.managedFields` (changed in place:
    the object is the informer's own, parsed from the API server's answer)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def object_key(obj: JSON) -> str:
    """`namespace/name`, or `name` for a cluster-scoped object."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


class _GoneError(Exception):
    """The watch's resourceVersion is too old: list again."""


class Informer:
    """List, then watch `path` (with `params` such as labelSelector) into a local store."""

    def __init__(
        self,
        client: ListWatch,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        name: str = "",
        indexers: Mapping[str, Indexer] | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] | None = None,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
        page_size: int = PAGE_SIZE,
        on_change: Callable[[str], None] | None = None,
        draw: Callable[[], float] = random.random,
        keep: Callable[[JSON], JSON] = trimmed,
        optional: bool = False,
    ) -> None:
        self._client = client
        self._optional = optional
        self.served = True  # False while an optional informer's API answers 404
        self._draw = draw  # a random number in [0, 1), for jitter
        self._consistent_list = False  # the last list was refused with 410: read from etcd
        self._on_change = on_change
        self._keep = keep  # what of each object the store keeps
        self._path = path
        self._params = dict(params or {})
        self.name = name or path
        self._indexers = dict(indexers or {})
        self._backoff = backoff or Backoff(base=0.5, cap=30.0)
        self._sleep = sleep
        self._watch_timeout = watch_timeout_seconds
        self._page_size = page_size
        self._changed = threading.Condition()  # guards everything below
        self._store: dict[str, JSON] = {}
        self._index: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}
        self._resource_version = ""
        self._synced = threading.Event()
        self._stopped = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self.lists = 0  # completed lists, for tests and metrics
        self._error = ""  # the last list or watch failure, "" once one succeeds again

    # Readers.

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def error(self) -> str:
        """Why the last list or watch failed; "" while the cache is being kept current."""
        with self._changed:
            return self._error

    def _failed(self, error: str) -> None:
        with self._changed:
            self._error = error

    @property
    def resource_version(self) -> str:
        with self._changed:
            return self._resource_version

    def get(self, key: str) -> JSON | None:
        with self._changed:
            return self._store.get(key)

    def items(self) -> list[JSON]:
        """A snapshot list; the objects are shared with the store, so never mutate them."""
        with self._changed:
            return list(self._store.values())

    def keys(self) -> list[str]:
        with self._changed:
            return list(self._store)

    def by_index(self, index: str, value: str) -> list[JSON]:
        """The objects an indexer maps to `value` (KeyError for an unknown index)."""
        with self._changed:
            keys = self._index[index].get(value, ())
            return [self._store[key] for key in sorted(keys)]

    def wait_for(self, predicate: Callable[["Informer"], bool], timeout: float) -> bool:
        """Block until `predicate(self)` holds after a change, or `timeout` seconds pass."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    # Lifecycle.

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"informer {self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread: interrupt the open watch and wait for the loop to notice."""
        self._stopped.set()
        with self._changed:
            stream = self._stream
        if stream is not None:
            stream.close()
        self.join(timeout)

    def join(self, timeout: float) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # The loop.

    def _pause(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            self._stopped.wait(seconds)

    def _run(self) -> None:
        failures = 0  # consecutive failures of any kind but 410
        gone = 0  # consecutive 410s: the first re-lists at once, repeats back off
        need_list = True
        while not self._stopped.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                    failures = 0
                applied = self._watch()
                failures = 0
                if applied:
                    gone = 0
                elif not self._stopped.is_set():
                    self._pause(self._backoff.delay(1, self._draw))  # an empty watch must not spin
            except _GoneError:
                gone += 1
                need_list = True
                log.info("%s: resourceVersion expired, listing again", self.name)
                self._pause(self._relist_pause(gone))
            except ApiError as error:
                if self._stopped.is_set():
                    return
                if self._optional and need_list and error.status == 404:
                    self._not_served(error)
                    continue
                if error.gone:
                    gone += 1
                    self._consistent_list = need_list  # the list itself was too old
                    need_list = True
                    pause = self._relist_pause(gone)
                else:
                    failures += 1
                    pause = self._backoff.delay(failures, self._draw)
                if not error.gone:
                    self._failed(str(error))
                log.warning("%s: %s; retrying in %.1fs", self.name, error, pause)
                self._pause(pause)
            except Exception:  # a bug must not silently end the cache
                failures += 1
                need_list = True
                self._failed("unexpected failure (see the log)")
                log.exception("%s: unexpected failure; listing again", self.name)
                self._pause(self._backoff.delay(failures, self._draw))

    def _not_served(self, error: ApiError) -> None:
        """An optional informer's list answered 404: nothing to keep, and nothing wrong."""
        if self.served:
            log.info("%s: not served by this cluster (%s); asking again every %.0fs",
                     self.name, error, NOT_SERVED_RECHECK)  # fmt: skip
        self.served = False
        with self._changed:
            emptied = bool(self._store)
            self._store = {}
            self._index = {name: {} for name in self._indexers}
            self._error = ""
            self._changed.notify_all()
        first = not self._synced.is_set()
        self._synced.set()
        if (emptied or first) and self._on_change is not None:
            self._on_change("")
        self._pause(NOT_SERVED_RECHECK)

    def _relist_pause(self, gone: int) -> float:
        """Before relisting after the `gone`-th 410 in a row: up to the backoff's base at
        random the first time (every watcher of a restarted server got its 410 at once),
        then backing off."""
        if gone == 1:
            return self._backoff.base * self._draw()
        return self._backoff.delay(gone - 1, self._draw)

    def _list_params(self) -> dict[str, str]:
        """The first page's: from the watch cache unless a list was refused as too old."""
        params = {**self._params, "limit": str(self._page_size)}
        seen = self.resource_version
        if self._consistent_list:
            return params  # no resourceVersion: the latest, from etcd
        if not seen:
            return {**params, "resourceVersion": "0"}  # whatever the cache has
        return {**params, "resourceVersion": seen, "resourceVersionMatch": "NotOlderThan"}

    def _list(self) -> None:
        items: list[JSON] = []
        params = self._list_params()
        while True:
            page = self._client.list(self._path, params)
            items.extend(self._keep(obj) for obj in page.get("items") or [])  # page by page
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
            # A continue token carries its version; the server refuses both at once.
            params = {k: v for k, v in params.items() if not k.startswith("resourceVersion")}
            params["continue"] = str(token)
        self._consistent_list = False
        store = {object_key(obj): obj for obj in items}
        index: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}
        for key, obj in store.items():
            for name in self._indexers:
                for value in self._values(name, obj):
                    index[name].setdefault(value, set()).add(key)
        self.served = True
        with self._changed:
            self._store = store
            self._index = index
            self._resource_version = str(meta.get("resourceVersion", ""))
            self.lists += 1
            self._error = ""
            self._changed.notify_all()
        self._synced.set()
        if self._on_change is not None:
            self._on_change("")
        log.info("%s: listed %d objects at %s", self.name, len(store), self._resource_version)

    def _watch(self) -> int:
        """Watch until the stream ends; the number of events applied."""
        params = {
            **self._params,
            "resourceVersion": self.resource_version,
            "timeoutSeconds": str(self._watch_timeout),
            "allowWatchBookmarks": "true",
        }
        stream = self._client.watch(self._path, params)
        with self._changed:
            self._stream = stream
            self._error = ""
        if self._stopped.is_set():  # stop() ran before the stream was published
            stream.close()
        applied = 0
        try:
            for event in stream:
                if self._stopped.is_set():
                    break
                self._apply(event)
                applied += 1
        finally:
            with self._changed:
                self._stream = None
            stream.close()
        return applied

    def _apply(self, event: JSON) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise ApiError(0, "BadWatchEvent", f"{kind} event without an object")
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _GoneError
            raise ApiError(int(code or 0), str(obj.get("reason", "")), str(obj.get("message", "")))
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        key = object_key(obj)
        if kind in ("ADDED", "MODIFIED"):
            obj = self._keep(obj)
        with self._changed:
            if kind in ("ADDED", "MODIFIED"):
                self._remove_from_index(key)
                self._store[key] = obj
                self._add_to_index(key, obj)
            elif kind == "DELETED":
                self._remove_from_index(key)
                self._store.pop(key, None)
            elif kind != "BOOKMARK":
                log.warning("%s: ignoring watch event of type %r", self.name, kind)
            if version:
                self._resource_version = version
            self._changed.notify_all()
        if self._on_change is not None and kind in ("ADDED", "MODIFIED", "DELETED"):
            self._on_change(key)

    def _values(self, name: str, obj: JSON) -> Iterable[str]:
        try:
            return list(self._indexers[name](obj))
        except Exception:  # one malformed object must not break the cache
            log.exception("%s: index %r failed for %s", self.name, name, object_key(obj))
            return ()

    def _add_to_index(self, key: str, obj: JSON) -> None:
        for name in self._indexers:
            for value in self._values(name, obj):
                self._index[name].setdefault(value, set()).add(key)

    def _remove_from_index(self, key: str) -> None:
        old = self._store.get(key)
        if old is None:
            return
        for name in self._indexers:
            for value in self._values(name, old):
                keys = self._index[name].get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._index[name][value]
