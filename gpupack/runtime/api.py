"""The shape of every Kubernetes API call the components make, without the transport.

Standard library only, so every component shares one error type, one watch protocol and
one retry helper (STYLE: "one retry helper with bounded backoff for API calls"), while
each keeps its own transport (the webhook's and the scheduler's `kube` modules) that
rides on the `kubernetes` package's configuration loading.

Every failure becomes `ApiError(status, reason, message)`: the HTTP status and the
Status object's reason (`AlreadyExists`, `Gone`, `Forbidden`, `Conflict`, ...), or status
0 with reason `ConnectionError` when the server could not be reached.
"""

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from gpupack.kube import JSON

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_STATUSES: Final = frozenset({0, 429, 500, 502, 503, 504})


class ApiError(Exception):
    """A failed API call: HTTP status (0 when the server was not reached), reason, message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def gone(self) -> bool:
        """410: the resourceVersion (or continue token) is too old; list again."""
        return self.status == 410

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_STATUSES


class WatchStream(Protocol):
    """Watch events (`{"type": ..., "object": ...}`) until the server ends the stream.

    `close` may be called from another thread and makes a blocked iteration end promptly.
    """

    def __iter__(self) -> Iterator[JSON]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Bounded exponential backoff: base, 2*base, 4*base, ... capped at `cap` seconds."""

    base: float = 0.2
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        """The pause before retry number `attempt` (1 for the first retry)."""
        return float(min(self.cap, self.base * 2 ** max(0, min(attempt - 1, 30))))


def retry(
    call: Callable[[], T],
    *,
    attempts: int = 3,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
    retryable: Callable[[ApiError], bool] = lambda error: error.retryable,
) -> T:
    """Call, retrying ApiErrors that `retryable` accepts, at most `attempts` calls in all.

    Conflicts (409) and client errors are not retryable by default: they fail fast.
    """
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except ApiError as error:
            if attempt == attempts or not retryable(error):
                raise
            pause = (backoff or Backoff()).delay(attempt)
            log.info("retrying in %.2fs after %s", pause, error)
            sleep(pause)
    raise AssertionError("unreachable: attempts must be at least 1")


class ListWatch(Protocol):
    """What an informer needs. Paths are absolute (`/api/v1/pods`)."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON: ...

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream: ...


def status_error(status: int, reason: str, body: bytes) -> ApiError:
    """An ApiError from a non-2xx response, preferring the Status object's reason."""
    message = body.decode("utf-8", errors="replace")[:2000]
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        reason = str(doc.get("reason") or reason)
        message = str(doc.get("message") or message)
    return ApiError(status, reason or "Unknown", message)


def parse_event(line: bytes) -> JSON:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise ApiError(0, "BadWatchEvent", f"not JSON: {line[:200]!r}") from exc
    if not isinstance(event, dict):
        raise ApiError(0, "BadWatchEvent", f"not an object: {line[:200]!r}")
    return event


def watch_events(chunks: Iterable[bytes]) -> Iterator[JSON]:
    """Watch events from a response body that arrives in arbitrary chunks, one JSON
    object per line (the API server's watch framing)."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield parse_event(line)
    if buffer.strip():
        yield parse_event(buffer)
