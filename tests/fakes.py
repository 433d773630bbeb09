"""An in-memory Kubernetes API behind the `webhook.kube.KubeClient` Protocol.

A real little object store, not a script of canned answers: every write bumps a global
resourceVersion and is recorded, lists honour label and field selectors and pagination,
watches replay history after a resourceVersion and then stream later writes (an object
that stops matching a selector arrives as DELETED, one that starts matching as ADDED, as
the API server does), duplicate names are AlreadyExists, and compacted history is
410 Gone. Tests inject faults per verb (`fail`) and drive watches (`end_watches`,
`expire_watches`, `bookmark`). Paths are the core/v1 ones the webhook uses:
`/api/v1/namespaces`, `/api/v1/pods`, `/api/v1/namespaces/{ns}/pods`.
"""

import builtins
import copy
import itertools
import queue
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpupack.objects import JSON
from gpupack.runtime.api import ApiError

_PATH: Final = re.compile(r"^/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[a-z]+)$")
_CLUSTER_SCOPED: Final = frozenset({"namespaces", "nodes"})
_KINDS: Final = {"pods": "Pod", "namespaces": "Namespace", "nodes": "Node"}
_END: Final = object()


def _parse_path(path: str) -> tuple[str, str | None]:
    """(resource, namespace or None for all namespaces / cluster-scoped)."""
    match = _PATH.match(path)
    if match is None:
        raise ApiError(404, "NotFound", f"the fake serves no path {path!r}")
    resource, namespace = match["resource"], match["ns"]
    if resource in _CLUSTER_SCOPED and namespace is not None:
        raise ApiError(404, "NotFound", f"{resource} are cluster-scoped: {path!r}")
    if resource not in _KINDS:
        raise ApiError(404, "NotFound", f"the fake serves no resource {resource!r}")
    return resource, namespace


def _split_outside_parens(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


@dataclass(frozen=True, slots=True)
class _Term:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def holds(self, value: str | None) -> bool:
        if self.op in ("=", "in"):
            return value in self.values
        if self.op in ("!=", "notin"):
            return value not in self.values
        return (value is not None) == (self.op == "exists")


def _terms(selector: str, *, set_based: bool) -> list[_Term]:
    terms = []
    for text in _split_outside_parens(selector):
        if set_based and (match := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", text)):
            values = frozenset(v.strip() for v in match[3].split(","))
            terms.append(_Term(match[1], match[2], values))
        elif match := re.fullmatch(r"([^=!]+)(!=|==|=)(.*)", text):
            op = "!=" if match[2] == "!=" else "="
            terms.append(_Term(match[1].strip(), op, frozenset({match[3].strip()})))
        elif set_based and re.fullmatch(r"!?[^=!\s]+", text):
            negated = text.startswith("!")
            terms.append(_Term(text.lstrip("!"), "!exists" if negated else "exists"))
        else:
            raise ApiError(400, "BadRequest", f"invalid selector term {text!r}")
    return terms


def label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """`a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`, comma-joined."""
    terms = _terms(selector, set_based=True)
    return lambda labels: all(term.holds(labels.get(term.key)) for term in terms)


def _field(obj: JSON, dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def field_selector(selector: str) -> Callable[[JSON], bool]:
    """`spec.schedulerName=x`, `status.phase!=Failed`, `metadata.name==y`, comma-joined.

    A missing field reads as "", as on the API server (`spec.nodeName=` = unscheduled).
    """
    terms = _terms(selector, set_based=False)
    return lambda obj: all(term.holds(_field(obj, term.key)) for term in terms)


@dataclass(frozen=True, slots=True)
class _Query:
    resource: str
    namespace: str | None
    labels: Callable[[Mapping[str, str]], bool]
    fields: Callable[[JSON], bool]

    @classmethod
    def of(cls, path: str, params: Mapping[str, str]) -> "_Query":
        resource, namespace = _parse_path(path)
        return cls(
            resource,
            namespace,
            label_selector(params.get("labelSelector", "")),
            field_selector(params.get("fieldSelector", "")),
        )

    def matches(self, resource: str, obj: JSON | None) -> bool:
        if obj is None or resource != self.resource:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels(meta.get("labels") or {}) and self.fields(obj)


@dataclass(frozen=True, slots=True)
class _Change:
    version: int
    resource: str
    old: JSON | None
    new: JSON | None  # None: deleted


class FakeWatch:
    """One open watch: a queue of events, ended by the server (`_END`) or by `close`."""

    def __init__(self, query: _Query, bookmarks: bool, on_close: Callable[["FakeWatch"], None]):
        self.query = query
        self.bookmarks = bookmarks
        self._events: queue.Queue[object] = queue.Queue()
        self._on_close = on_close
        self.closed = threading.Event()

    def push(self, event: JSON) -> None:
        self._events.put(event)

    def end(self) -> None:
        self._events.put(_END)

    def __iter__(self) -> Iterator[JSON]:
        while not self.closed.is_set():
            event = self._events.get()
            if event is _END:
                break
            assert isinstance(event, dict)
            yield event
        self.close()

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self._events.put(_END)
            self._on_close(self)


@dataclass
class Call:
    verb: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    body: JSON | None = None


class FakeKube:
    """An in-memory API server for the `KubeClient` Protocol (thread-safe)."""

    def __init__(self, *, gone_as_event: bool = True) -> None:
        self._lock = threading.Condition(threading.RLock())  # notified on every call
        self._version = 0
        self._objects: dict[tuple[str, str, str], JSON] = {}
        self._history: list[_Change] = []
        self._oldest = 0  # history before this version is compacted away
        self._watches: list[FakeWatch] = []
        self._faults: dict[str, list[ApiError]] = {}
        self._names = itertools.count(1)
        self.gone_as_event = gone_as_event  # like the API server: 200, then an ERROR event
        self.calls: list[Call] = []
        self.before_create: Callable[[JSON], None] | None = None

    # The KubeClient Protocol.

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        self._record("list", path, params)
        self._raise_fault("list")
        query = _Query.of(path, params)
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (resource, _, _), obj in sorted(self._objects.items())
                if query.matches(resource, obj)
            ]
            version = self._version
        meta: JSON = {"resourceVersion": str(version)}
        limit = int(params.get("limit", "0") or 0)
        token = params.get("continue")
        if token:
            at, offset = (int(part) for part in token.split(":"))
            if at < self._oldest:
                raise ApiError(410, "Expired", "the continue token has expired")
            meta["resourceVersion"] = str(at)
            items = items[offset:]
        else:
            offset = 0
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = f"{meta['resourceVersion']}:{offset + limit}"
        kind = _KINDS[query.resource] + "List"
        return {"kind": kind, "apiVersion": "v1", "metadata": meta, "items": items}

    def watch(self, path: str, params: Mapping[str, str]) -> FakeWatch:
        self._record("watch", path, params)
        self._raise_fault("watch")
        query = _Query.of(path, params)
        since = int(params.get("resourceVersion") or 0)
        stream = FakeWatch(query, params.get("allowWatchBookmarks") == "true", self._forget)
        with self._lock:
            if since and since < self._oldest:
                if not self.gone_as_event:
                    raise ApiError(410, "Expired", f"too old resource version: {since}")
                stream.push(_error_event(410, "Expired", f"too old resource version: {since}"))
                stream.end()
                return stream
            if not since:
                for (resource, _, _), obj in sorted(self._objects.items()):
                    if query.matches(resource, obj):
                        stream.push({"type": "ADDED", "object": copy.deepcopy(obj)})
            else:
                for change in self._history:
                    if change.version > since:
                        _deliver(stream, change)
            self._watches.append(stream)
            self._lock.notify_all()
        return stream

    def get(self, path: str, *, timeout: float | None = None) -> JSON:
        """One object by its path (`/api/v1/namespaces/NAME`, `.../pods/NAME`)."""
        self._record("get", path, {} if timeout is None else {"timeout": str(timeout)})
        self._raise_fault("get")
        parent, _, name = path.rstrip("/").rpartition("/")
        resource, namespace = _parse_path(parent)
        with self._lock:
            obj = self._objects.get((resource, namespace or "", name))
            if obj is None:
                raise ApiError(404, "NotFound", f"{resource} {name!r} not found")
            return copy.deepcopy(obj)

    def create(self, path: str, body: JSON) -> JSON:
        self._record("create", path, {}, body)
        self._raise_fault("create")
        resource, namespace = _parse_path(path)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if resource not in _CLUSTER_SCOPED:
            if namespace is None:
                raise ApiError(405, "MethodNotAllowed", f"create needs a namespace: {path}")
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "metadata.namespace does not match the path")
            meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "metadata.name or generateName is required")
            meta["name"] = f"{meta['generateName']}{next(self._names):05d}"
        if self.before_create is not None:
            self.before_create(obj)
        with self._lock:
            key = (resource, meta.get("namespace", ""), meta["name"])
            if key in self._objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists')
            if resource == "pods":
                obj.setdefault("status", {"phase": "Pending"})
            return copy.deepcopy(self._write(key, obj))

    def close(self) -> None:
        """End every open watch, as a client closing its connections would."""
        self.end_watches()

    # Test helpers (not part of the Protocol).

    def put(self, obj: JSON) -> JSON:
        """Create or replace an object as a controller would (ADDED or MODIFIED)."""
        resource = "namespaces" if obj.get("kind") == "Namespace" else "pods"
        meta = obj.setdefault("metadata", {})
        with self._lock:
            key = (resource, meta.get("namespace", ""), meta["name"])
            return copy.deepcopy(self._write(key, copy.deepcopy(obj)))

    def delete(self, resource: str, namespace: str, name: str) -> None:
        with self._lock:
            old = self._objects.pop((resource, namespace, name))
            self._version += 1
            self._publish(_Change(self._version, resource, old, None))

    def objects(self, resource: str = "pods", namespace: str | None = None) -> builtins.list[JSON]:
        with self._lock:
            return [
                copy.deepcopy(obj)
                for (kind, ns, _), obj in sorted(self._objects.items())
                if kind == resource and namespace in (None, ns)
            ]

    def fail(self, verb: str, error: ApiError, times: int = 1) -> None:
        """The next `times` calls of `verb` ("list", "watch", "get", "create") raise `error`."""
        with self._lock:
            self._faults.setdefault(verb, []).extend([error] * times)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until `predicate()` holds after some call or watch change, or `timeout`."""
        with self._lock:
            return self._lock.wait_for(predicate, timeout)

    def count(self, verb: str) -> int:
        with self._lock:
            return sum(call.verb == verb for call in self.calls)

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._watches)

    def end_watches(self) -> None:
        """The server closes every watch (its timeoutSeconds passed)."""
        with self._lock:
            for stream in list(self._watches):
                stream.end()

    def expire_watches(self) -> None:
        """Compact history and tell every watch its resourceVersion is gone (ERROR 410)."""
        with self._lock:
            self._oldest = self._version
            self._history.clear()
            for stream in list(self._watches):
                stream.push(_error_event(410, "Expired", "too old resource version"))
                stream.end()

    def compact(self) -> None:
        """Drop history: watches from any earlier resourceVersion get 410 Gone."""
        with self._lock:
            self._oldest = self._version
            self._history.clear()

    def bookmark(self) -> None:
        with self._lock:
            for stream in self._watches:
                if stream.bookmarks:
                    kind = _KINDS[stream.query.resource]
                    meta = {"resourceVersion": str(self._version)}
                    stream.push({"type": "BOOKMARK", "object": {"kind": kind, "metadata": meta}})

    # Internals.

    def _record(
        self, verb: str, path: str, params: Mapping[str, str], body: JSON | None = None
    ) -> None:
        with self._lock:
            self.calls.append(Call(verb, path, dict(params), copy.deepcopy(body)))
            self._lock.notify_all()

    def _raise_fault(self, verb: str) -> None:
        with self._lock:
            faults = self._faults.get(verb)
            error = faults.pop(0) if faults else None
        if error is not None:
            raise error

    def _write(self, key: tuple[str, str, str], obj: JSON) -> JSON:
        old = self._objects.get(key)
        self._version += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._version)
        meta.setdefault("uid", f"uid-{self._version}")
        meta.setdefault("creationTimestamp", "2025-01-01T00:00:00Z")
        obj.setdefault("kind", _KINDS[key[0]])
        obj.setdefault("apiVersion", "v1")
        self._objects[key] = obj
        self._publish(_Change(self._version, key[0], old, obj))
        return obj

    def _publish(self, change: _Change) -> None:
        self._history.append(change)
        for stream in self._watches:
            _deliver(stream, change)

    def _forget(self, stream: FakeWatch) -> None:
        with self._lock:
            if stream in self._watches:
                self._watches.remove(stream)
            self._lock.notify_all()


def _deliver(stream: FakeWatch, change: _Change) -> None:
    was = stream.query.matches(change.resource, change.old)
    now = stream.query.matches(change.resource, change.new)
    if now:
        kind = "MODIFIED" if was else "ADDED"
        stream.push({"type": kind, "object": copy.deepcopy(change.new)})
    elif was:
        gone = copy.deepcopy(change.new or change.old)
        assert gone is not None
        if change.new is None:
            gone["metadata"]["resourceVersion"] = str(change.version)
        stream.push({"type": "DELETED", "object": gone})


def _error_event(code: int, reason: str, message: str) -> JSON:
    status = {"kind": "Status", "status": "Failure", "code": code, "reason": reason}
    return {"type": "ERROR", "object": {**status, "message": message}}
