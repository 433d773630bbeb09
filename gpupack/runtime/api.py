"""The shape of every Kubernetes API call the components make, without the transport.

Standard library only, so every component shares one error type, one watch protocol and
one retry helper with bounded backoff, whatever carries the request: the one transport
(`gpupack.runtime.transport`) in every binary, an in-memory fake in tests.

Every failure becomes `ApiError(status, reason, message)`: the HTTP status and the
Status object's reason (`AlreadyExists`, `Gone`, `Forbidden`, `Conflict`, ...), or status
0 with reason `ConnectionError` when the server could not be reached, and how long the
server asked to be left alone (`Retry-After`, which API Priority and Fairness sends with
its 429s).

Retries wait as client-go's do: exponentially longer, with random jitter so that the
clients a restart failed together do not all come back in the same instant, and never
less than the server's `Retry-After` (at most `RETRY_AFTER_MAX`).
"""

import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

import orjson

from gpupack.objects import JSON

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_STATUSES: Final = frozenset({0, 429, 500, 502, 503, 504})
RETRY_AFTER_MAX: Final = 60.0  # seconds of a server's Retry-After a retry honours at most


class ApiError(Exception):
    """A failed API call: HTTP status (0 when the server was not reached), reason, message."""

    def __init__(
        self, status: int, reason: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after  # seconds the server asked for (Retry-After)

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
    """Bounded exponential backoff: base, 2*base, 4*base, ... capped at `cap` seconds,
    each stretched by up to `jitter` of itself at random (client-go's wait.Backoff)."""

    base: float = 0.2
    cap: float = 5.0
    jitter: float = 0.5

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """The pause before retry number `attempt` (1 for the first retry); `draw` is a
        random number in [0, 1)."""
        plain = min(self.cap, self.base * 2 ** max(0, min(attempt - 1, 30)))
        return float(min(self.cap, plain * (1.0 + self.jitter * draw())))


def retry(
    call: Callable[[], T],
    *,
    attempts: int = 3,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
    retryable: Callable[[ApiError], bool] = lambda error: error.retryable,
    draw: Callable[[], float] = random.random,
) -> T:
    """Call, retrying ApiErrors that `retryable` accepts, at most `attempts` calls in all,
    after the backoff's pause or the server's Retry-After, whichever is longer.

    Conflicts (409) and client errors are not retryable by default: they fail fast.
    """
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except ApiError as error:
            if attempt == attempts or not retryable(error):
                raise
            pause = (backoff or Backoff()).delay(attempt, draw)
            if error.retry_after is not None:
                pause = max(pause, min(error.retry_after, RETRY_AFTER_MAX))
            log.info("retrying in %.2fs after %s", pause, error)
            sleep(pause)
    raise AssertionError("unreachable: attempts must be at least 1")


class ListWatch(Protocol):
    """What an informer needs. Paths are absolute (`/api/v1/pods`)."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON: ...

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream: ...


def retry_after(value: str | None) -> float | None:
    """Seconds in a `Retry-After` header (a number of seconds; the HTTP-date form, which
    the API server does not send, counts as none)."""
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())


def status_error(
    status: int, reason: str, body: bytes, headers: Mapping[str, str] | None = None
) -> ApiError:
    """An ApiError from a non-2xx response, preferring the Status object's reason, with
    the response's Retry-After (or the Status details' retryAfterSeconds)."""
    message = body.decode("utf-8", errors="replace")[:2000]
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    wait = retry_after((headers or {}).get("Retry-After"))
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        reason = str(doc.get("reason") or reason)
        message = str(doc.get("message") or message)
        details = doc.get("details")
        seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
        if wait is None and isinstance(seconds, int) and not isinstance(seconds, bool):
            wait = float(max(seconds, 0))
    return ApiError(status, reason or "Unknown", message, wait)


def parse_event(line: bytes) -> JSON:
    try:
        event = orjson.loads(line)
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
