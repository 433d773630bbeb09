"""The webhook's HTTP protocol, bounded against hostile clients.

Anything in the cluster network can reach the webhook's port, and uvicorn's httptools
protocol bounds none of this: a request's headers (it keeps every header it is sent),
how long a request may take to arrive, how long a connection may sit idle before its
first request, how many connections may be open. `GuardedProtocol` is that protocol
with `ConnectionLimits`:

- **Header block:** at most `header_bytes` of request line and headers, and at most
  `header_count` headers; beyond either the client gets `431` and the connection is
  closed, before the parser has buffered more than one read past the limit.
- **Request time:** a request must arrive whole (headers and body) within
  `request_seconds` of its first byte; a slow one gets `408` and is closed.
- **Closing:** a connection the server closes (a refusal, a timeout, an eviction) has
  its TLS session ended at once and its TCP connection dropped `CLOSE_LINGER` seconds
  later unless the client closed it first, as nginx and Go's server close theirs;
  asyncio would otherwise keep it open, and counted, up to 30 s for the client's
  close_notify.
- **Idle connections:** a connection that sends nothing for `idle_seconds` after its
  handshake is closed (uvicorn arms no timer before a first answer); one idle for
  `keep_alive_seconds` after an answer is closed too. That is longer than the API
  server keeps an idle connection (Go's 90 s), so the client closes first: a server
  closing a kept-alive connection races the client's next request on it, which fails
  with EOF (the API server does not retry a POST), and with `failurePolicy: Ignore`
  that pod escapes gpupack.
- **Draining:** while `Drain.active` (the server is stopping), every answer carries
  `Connection: close`, so clients stop reusing their connections and dial again, to a
  replica that is not stopping.
- **Open connections:** at most `connections`. One more closes the connection that
  has been idle (no request being answered) the longest, so a flood of idle or
  trickling connections cannot lock the API server out; if every connection is busy,
  the newcomer is closed.

- **Memory after a flood:** every TLS connection leaves OpenSSL's freed state in the C
  heap, which glibc keeps; without giving it back, each burst of a few thousand
  connections grew the process by tens of MB for good. After every `TRIM_AFTER`
  closed connections the heap is trimmed (`malloc_trim`, at most once per
  `TRIM_DELAY` seconds; a no-op where the C library has none).

The API server sends an AdmissionReview in one write over a kept-alive connection, so
none of these limits touches it. TLS handshakes themselves are bounded by the event
loop's handshake timeout (60 s).
"""

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_BYTES: Final = 32 * 1024
HEADER_COUNT: Final = 100
REQUEST_SECONDS: Final = 10.0
IDLE_SECONDS: Final = 5.0
KEEP_ALIVE_SECONDS: Final = 120.0
CONNECTIONS: Final = 512
# Seconds between closing a connection (its TLS session: close_notify sent) and
# dropping its TCP connection, unless the client closes first; asyncio would otherwise
# wait up to 30 s for the client's close_notify, the connection open and counted.
CLOSE_LINGER: Final = 1.0
TRIM_AFTER: Final = 64
TRIM_DELAY: Final = 1.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_bytes: int = HEADER_BYTES
    header_count: int = HEADER_COUNT
    request_seconds: float = REQUEST_SECONDS
    idle_seconds: float = IDLE_SECONDS
    keep_alive_seconds: float = KEEP_ALIVE_SECONDS
    connections: int = CONNECTIONS


@dataclass(slots=True)
class Drain:
    """Set when the server starts stopping: connections are closed after each answer."""

    active: bool = False


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (AttributeError, OSError, TypeError):  # not glibc
        return None
    return trim


class _Trimmer:
    """Gives the C heap's free pages back to the OS after bursts of connections."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._closed = 0
        self._scheduled = False

    def closed(self, loop: asyncio.AbstractEventLoop) -> None:
        self._closed += 1
        if self._trim is not None and self._closed >= TRIM_AFTER and not self._scheduled:
            self._scheduled = True
            loop.call_later(TRIM_DELAY, self._run)

    def _run(self) -> None:
        self._closed, self._scheduled = 0, False
        if self._trim is not None:
            self._trim(0)


_TRIMMER = _Trimmer()


class _Refused(Exception):
    """Raised from a parser callback once the client was answered: parsing stops."""


def _answer(status: int, reason: str, detail: str) -> bytes:
    body = detail.encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under `limits` (see the module's docstring)."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    drain: ClassVar[Drain] = Drain()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_headers = False  # from a request's first byte to its last header
        self._header_bytes = 0
        self._header_count = 0
        # Before a first answer, or while a request arrives: ours. After an answer:
        # uvicorn's keep-alive timer (`timeout_keep_alive` = `keep_alive_seconds`).
        self._deadline: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._dropping: asyncio.TimerHandle | None = None  # `_close`'s

    @classmethod
    def with_limits(cls, limits: ConnectionLimits, drain: Drain) -> type["GuardedProtocol"]:
        return type("GuardedProtocol", (cls,), {"limits": limits, "drain": drain})

    # Connections.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.connections and not self._evict_idlest():
            transport.close()  # every open connection is answering a request
            self.loop.call_later(CLOSE_LINGER, transport.abort)
            return
        super().connection_made(transport)
        # uvicorn arms no timer before a first answer: a silent connection is closed as
        # an idle kept-alive one is.
        self._idle_since = self.loop.time()
        self._deadline = self.loop.call_later(
            self.limits.idle_seconds, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self._dropping is not None:
            self._dropping.cancel()
            self._dropping = None
        _TRIMMER.closed(self.loop)
        if self.transport is not None:  # None when refused in connection_made
            super().connection_lost(exc)

    def _evict_idlest(self) -> bool:
        """Close the connection idle the longest; False when none is idle."""
        idle = [c for c in self.connections if isinstance(c, GuardedProtocol) and c._is_idle()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._idle_since)
        oldest.connections.discard(oldest)  # counted out now, closed on the next turn
        oldest._close()
        return True

    def _close(self) -> None:
        """Close the connection: its TLS session now, its TCP connection `CLOSE_LINGER`
        seconds later at most (time for the client to read what it was sent)."""
        self.transport.close()
        if self._dropping is None:
            self._dropping = self.loop.call_later(CLOSE_LINGER, self.transport.abort)

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's (an idle connection is closed), with `_close`."""
        if not self.transport.is_closing():
            self._close()

    def _is_idle(self) -> bool:
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    # Timers.

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._reading_headers or self.cycle is None:
            seconds = self.limits.request_seconds
            self._refuse(408, "Request Timeout", f"the request did not arrive within {seconds}s")
        else:  # the app is reading the body: it sees the disconnect
            self._close()

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        self._cancel()
        self.transport.write(_answer(status, reason, detail))
        self._close()

    # Reading.

    def data_received(self, data: bytes) -> None:
        """uvicorn's, counting the bytes of a header block still incomplete after them."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if not self.transport.is_closing():  # else refused by a callback already
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return
        if not self._reading_headers:
            return
        self._header_bytes += len(data)
        if self._header_bytes > self.limits.header_bytes:
            self._refuse(
                431,
                "Request Header Fields Too Large",
                f"request headers exceed {self.limits.header_bytes} bytes",
            )

    def on_message_begin(self) -> None:
        """A request's first byte: from now on it has `request_seconds` to arrive."""
        super().on_message_begin()
        self._reading_headers, self._header_bytes, self._header_count = True, 0, 0
        self._cancel()
        self._deadline = self.loop.call_later(self.limits.request_seconds, self._too_slow)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.header_count:
            self._refuse(
                431,
                "Request Header Fields Too Large",
                f"more than {self.limits.header_count} request headers",
            )
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        super().on_headers_complete()
        if self.drain.active and self.cycle is not None:
            self.cycle.keep_alive = False  # answered with `Connection: close`

    def on_message_complete(self) -> None:
        self._cancel()  # arrived whole: the app has it now
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer when idle
        self._idle_since = self.loop.time()
