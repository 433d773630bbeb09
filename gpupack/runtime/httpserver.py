"""The one plain-HTTP server every gpupack binary serves its own endpoints with: the
metrics and probe endpoints (`gpupack.runtime.endpoints`), the exporter's scrapes, the
extender's verbs.

Anything that can reach a port can send it anything, and `http.server` bounds little:
it starts a thread per connection and waits forever for bytes that never come, keeps
up to a hundred 64 KiB header lines, and a client can hold its threads and memory with
idle or trickling connections until the pod is OOM-killed or its probes fail. Here
every connection is held to `ClientLimits`:

- **Whole requests in time:** a request (line, headers, body) must arrive within
  `request_seconds` of its first byte, whatever pace its bytes come at; a late one gets
  408 and the connection is closed. An answer that the client does not read within
  that time is dropped the same way.
- **Idle connections:** one that sends nothing for `idle_seconds` (before its first
  request or between two) is closed.
- **Sizes:** request line and headers at most `header_bytes` (else 431), a body at most
  `body_bytes` (else 413), and only with a `Content-Length` (no chunked uploads: 411).
- **Open connections:** at most `connections`. One more closes the connection that has
  been idle longest, so a flood of idle connections cannot lock the kubelet's probes
  out; if every connection is in a request, the newcomer gets 503 and is closed.

Bad input gets a 4xx with a one-line reason, never a 5xx; a handler that raises gets
500 and its traceback in the log. HTTP/1.1 with keep-alive; listeners are dual-stack
(`gpupack.runtime.endpoints.listening_socket`).
"""

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

log = logging.getLogger(__name__)

MAX_HEADERS: Final = 64  # header lines in one request
LINGER_SECONDS: Final = 1.0  # after refusing a request, how long what follows is read
LINGER_BYTES: Final = 1024 * 1024  # ... and how much of it


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What one client may hold of a server (see the module docstring)."""

    request_seconds: float = 10.0
    idle_seconds: float = 60.0
    header_bytes: int = 16 * 1024
    body_bytes: int = 1024 * 1024
    connections: int = 64

    def __post_init__(self) -> None:
        for name in ("request_seconds", "idle_seconds"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(
                    f"ClientLimits.{name} must be a positive, finite number of seconds"
                )
        for name in ("header_bytes", "body_bytes", "connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"ClientLimits.{name} must be at least 1")


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str  # without the query
    query: str
    headers: Mapping[str, str]  # names in lower case
    body: bytes


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"


def text(status: int, message: str) -> Response:
    return Response(status, (message.rstrip("\n") + "\n").encode())


Handler = Callable[[HttpRequest], Response]
Routes = Mapping[tuple[str, str], Handler]  # (method, path) -> handler


class BadRequest(Exception):
    """The request cannot be served: answered with `status` and `message`, then closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    idle_since: float | None = None  # None while a request is being read or answered

    def end(self) -> None:
        """End the connection from another thread: its own thread, blocked in recv or send
        or about to be, wakes to an ended socket and closes it. Closing the descriptor
        here instead could leave that thread polling the number after a new connection
        reused it: it then hung on someone else's socket."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class Server:
    """Serves `routes` on a listening socket, a thread per connection, within `limits`."""

    def __init__(
        self,
        sock: socket.socket,
        routes: Routes,
        *,
        limits: ClientLimits | None = None,
        name: str = "http",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sock = sock
        self._routes = routes
        self._paths = {path for _, path in routes}
        self.limits = limits or ClientLimits()
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._open: set[_Connection] = set()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.port = int(sock.getsockname()[1])

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def start(self) -> "Server":
        self._thread = threading.Thread(target=self.serve, name=f"{self._name} :{self.port}")
        self._thread.daemon = True
        self._thread.start()
        return self

    def serve(self) -> None:
        """Accept connections until `close`."""
        self._sock.settimeout(0.5)  # to notice `close`
        while not self._stopping.is_set():
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.05)  # e.g. EMFILE: the connections are bounded, this passes
                continue
            self._admit(sock)

    def close(self) -> None:
        self._stopping.set()
        self._sock.close()
        with self._lock:
            connections = list(self._open)
        for connection in connections:
            connection.end()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _admit(self, sock: socket.socket) -> None:
        connection = _Connection(sock, idle_since=self._clock())
        with self._lock:
            victim: _Connection | None = None
            if len(self._open) >= self.limits.connections:
                idle = [c for c in self._open if c.idle_since is not None]
                if not idle:
                    victim = connection  # every connection is in a request
                else:
                    victim = min(idle, key=lambda c: c.idle_since or 0.0)
                    self._open.discard(victim)
            if victim is not connection:
                self._open.add(connection)
        if victim is connection:
            self._refuse(sock)
            return
        if victim is not None:
            victim.end()
        thread = threading.Thread(
            target=self._serve_connection, args=(connection,), name=f"{self._name} connection"
        )
        thread.daemon = True
        thread.start()

    def _refuse(self, sock: socket.socket) -> None:
        """503 and close, on the accepting thread: nothing here may wait on the client.
        What it already sent is read first, so the close does not reset the answer."""
        with contextlib.suppress(OSError):
            _drain(sock, wait=0.0)
            sock.settimeout(1.0)
            sock.sendall(_encode(text(503, "too many connections; try again"), close=True))
            sock.shutdown(socket.SHUT_WR)
            _drain(sock, wait=0.0)
        sock.close()

    def _serve_connection(self, connection: _Connection) -> None:
        reader = _Reader(connection.sock, self.limits, self._clock)
        try:
            while not self._stopping.is_set():
                connection.idle_since = self._clock()
                if not reader.wait_for_request():
                    return  # closed by the client, idle too long, or evicted
                connection.idle_since = None
                try:
                    request, keep_alive = reader.read_request()
                except BadRequest as bad:
                    reader.send(_encode(text(bad.status, bad.message), close=True))
                    connection.sock.shutdown(socket.SHUT_WR)
                    _drain(connection.sock, wait=LINGER_SECONDS)  # else the close resets it
                    return
                response = self._answer(request)
                reader.send(_encode(response, close=not keep_alive))
                if not keep_alive:
                    return
        except OSError:
            return  # reset, timed out while answering, or closed under us
        finally:
            with self._lock:
                self._open.discard(connection)
            connection.sock.close()

    def _answer(self, request: HttpRequest) -> Response:
        handler = self._routes.get((request.method, request.path))
        if handler is None:
            if request.path in self._paths:
                allowed = sorted(m for m, p in self._routes if p == request.path)
                return text(405, f"{request.method} {request.path}: use {', '.join(allowed)}")
            paths = ", ".join(sorted(self._paths))
            return text(404, f"not found: {request.path[:200]!r}; this server serves {paths}")
        try:
            return handler(request)
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return text(500, f"{request.method} {request.path} failed; see the server's log")


class _Reader:
    """Reads requests off one connection within `ClientLimits`, buffering what came early."""

    def __init__(
        self, sock: socket.socket, limits: ClientLimits, clock: Callable[[], float]
    ) -> None:
        self._sock = sock
        self._limits = limits
        self._clock = clock
        self._buffer = b""
        self._deadline = 0.0

    def wait_for_request(self) -> bool:
        """Wait up to `idle_seconds` for a request's first byte; False if none came."""
        if self._buffer:
            self._deadline = self._clock() + self._limits.request_seconds
            return True
        try:
            self._sock.settimeout(self._limits.idle_seconds)
            chunk = self._sock.recv(65536)
        except (TimeoutError, OSError):
            return False
        if not chunk:
            return False
        self._buffer = chunk
        self._deadline = self._clock() + self._limits.request_seconds
        return True

    def read_request(self) -> tuple[HttpRequest, bool]:
        limits = self._limits
        while b"\r\n\r\n" not in self._buffer:
            if len(self._buffer) > limits.header_bytes:
                raise BadRequest(
                    431, f"request line and headers exceed {limits.header_bytes} bytes"
                )
            self._receive()
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        if len(head) > limits.header_bytes:
            raise BadRequest(431, f"request line and headers exceed {limits.header_bytes} bytes")
        method, target, version, headers = _parse_head(head)
        if "transfer-encoding" in headers:
            raise BadRequest(411, "chunked or encoded bodies are not accepted: send Content-Length")
        length_text = headers.get("content-length", "0")
        if not length_text.isascii() or not length_text.isdigit():
            raise BadRequest(400, f"Content-Length {length_text[:40]!r} is not a byte count")
        length = int(length_text)
        if length > limits.body_bytes:
            raise BadRequest(413, f"the body is {length} bytes; the limit is {limits.body_bytes}")
        while len(self._buffer) < length:
            self._receive()
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        path, _, query = target.partition("?")
        connection = headers.get("connection", "").lower()
        keep_alive = (
            "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
        )
        return HttpRequest(method, path, query, headers, body), keep_alive

    def send(self, data: bytes) -> None:
        """Send an answer; the client has `request_seconds` to take it."""
        self._sock.settimeout(self._limits.request_seconds)
        self._sock.sendall(data)

    def _receive(self) -> None:
        left = self._deadline - self._clock()
        if left <= 0:
            raise BadRequest(
                408, f"the request did not arrive within {self._limits.request_seconds:g} s"
            )
        try:
            self._sock.settimeout(left)
            chunk = self._sock.recv(65536)
        except TimeoutError:
            raise BadRequest(
                408, f"the request did not arrive within {self._limits.request_seconds:g} s"
            ) from None
        if not chunk:
            raise OSError("the client closed the connection mid-request")
        self._buffer += chunk


def _drain(sock: socket.socket, *, wait: float) -> None:
    """Read and drop what the client sends, for up to `wait` seconds (0: what has come
    already) and `LINGER_BYTES`: closing a socket with unread bytes resets the connection,
    and the client may lose the answer it was sent."""
    deadline = time.monotonic() + wait
    taken = 0
    with contextlib.suppress(OSError):
        while taken < LINGER_BYTES:
            left = deadline - time.monotonic()
            if left > 0:
                sock.settimeout(left)
                chunk = sock.recv(65536)
            else:
                chunk = sock.recv(65536, socket.MSG_DONTWAIT)
            if not chunk:
                return
            taken += len(chunk)


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    try:
        lines = head.decode("latin-1").split("\r\n")
    except UnicodeDecodeError:  # latin-1 decodes every byte; kept for clarity
        raise BadRequest(400, "the request head is not text") from None
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/"):
        raise BadRequest(400, f"malformed request line {lines[0][:100]!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(400, f"unsupported protocol {version[:20]!r}: HTTP/1.1 or HTTP/1.0")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(431, f"more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or " " in name:
            raise BadRequest(400, f"malformed header line {line[:100]!r}")
        key = name.lower()
        if key in ("content-length", "transfer-encoding") and key in headers:
            raise BadRequest(400, f"{name} given twice")
        headers[key] = value.strip()
    return method, target, version, headers


def _encode(response: Response, *, close: bool) -> bytes:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Status"
    head = (
        f"HTTP/1.1 {response.status} {reason}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        + ("Connection: close\r\n" if close else "")
        + "\r\n"
    )
    return head.encode("latin-1") + response.body
