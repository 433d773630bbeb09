"""The API server's wall clock, as one process can tell it from the answers it gets.

A time that another process reads, or that is compared with one the API server wrote
(a pod's creationTimestamp), must not depend on this node's clock: replicas run on nodes
whose clocks disagree, and the one that wrote a time is not the one that reads it (a
drain's start, a seal's issue time, a rollout's). The API server is the clock every
replica talks to. Each answer carries its time in `Date` (RFC 9110, whole seconds),
written between the moment the request went out and the moment the answer came back;
each such answer bounds the server's time against this process's monotonic clock, and
`ServerClock` keeps the intersection of those bounds, so it is exact to well under a
second after a few answers and unmoved by steps of this node's wall clock. Until an
answer has carried a `Date`, it is this node's wall clock.
"""

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Final

log = logging.getLogger(__name__)

MAX_ROUND_TRIP: Final = 5.0  # seconds: a slower answer bounds the server's time too loosely
WARN_OFFSET: Final = 30.0  # seconds between this node's clock and the server's worth a warning


class ServerClock:
    """`now()`: the API server's time in Unix seconds. Thread-safe."""

    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # Bounds of (server time - monotonic time): every answer so far agrees with both.
        self._low: float | None = None
        self._high: float | None = None
        self._warned = False
        # The last Date read and its Unix seconds: answers come many to the second (every
        # bind, every patch), and parsing one costs more than all the rest of `observe`.
        self._parsed: tuple[str, float] = ("", 0.0)

    def observe(self, date: str | None, sent: float, received: float) -> None:
        """One answer: its `Date` header, and this process's monotonic clock when the
        request went out and when the answer came. Ignored without a readable `Date` or
        after `MAX_ROUND_TRIP`."""
        if not date or received - sent > MAX_ROUND_TRIP or received < sent:
            return
        last, server = self._parsed
        if date != last:
            try:
                moment = parsedate_to_datetime(date)
                if moment.tzinfo is None:  # "-0000": UTC, of unknown origin (RFC 5322)
                    moment = moment.replace(tzinfo=UTC)
                server = moment.timestamp()
            except (TypeError, ValueError, IndexError, OverflowError):
                return
            self._parsed = (date, server)
        low, high = server - received, server + 1.0 - sent
        with self._lock:
            if self._low is None or self._high is None or low > self._high or high < self._low:
                self._low, self._high = low, high  # the first, or a clock stepped: start over
            else:
                self._low, self._high = max(self._low, low), min(self._high, high)
            offset = (self._low + self._high) / 2 + self._monotonic() - self._wall()
            warn = not self._warned and abs(offset) > WARN_OFFSET
            self._warned = self._warned or warn
        if warn:
            log.warning(
                "this node's clock is %+.0f s off the API server's; gpupack keeps the times "
                "other replicas read by the API server's clock (check the node's time sync)",
                -offset,
            )

    def now(self) -> float:
        with self._lock:
            low, high = self._low, self._high
        if low is None or high is None:
            return self._wall()
        return (low + high) / 2 + self._monotonic()
