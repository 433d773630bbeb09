"""TEST INFRASTRUCTURE: a network partition between one client and the API server.

`Partition` relays TCP between a local port and an upstream address. Cut, it forwards
nothing in either direction and opens nothing new: connections hang rather than being
refused, as when a partition drops packets. Healed, what waited flows on, as TCP
retransmits once the network is back. A component given a kubeconfig whose server is
`Partition.url` is cut off from the API server while everything else reaches it. Reset,
every connection relayed so far ends (the client's next request opens a new one), as
when a connection is re-established between two requests of the API server to a webhook.
"""

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import yaml


class Partition:
    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1") -> None:
        self._upstream = upstream
        self.host = host
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.relayed = 0  # connections relayed so far

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        threading.Thread(target=self._accept, name="partition-accept", daemon=True).start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        with self._lock:
            self._closed.set()
            sockets = list(self._sockets)
        self._flowing.set()  # release the waiting pumps; their sockets close next
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def reset(self) -> None:
        """End every connection relayed so far, both ways, as when a connection is
        re-established (a load balancer's, or a node's, restart): a client opens a new one
        for its next request. New connections are relayed as before."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def kubeconfig(self, original: Path, into: Path) -> Path:
        """`original` with its cluster's server replaced by this relay."""
        config = yaml.safe_load(original.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = self.url
        into.write_text(yaml.safe_dump(config))
        return into

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            if not self._closed.is_set():
                self._sockets.append(sock)
                return sock
        sock.close()  # came in as the relay closed: nobody would close it
        raise OSError("the partition is closed")

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                self._track(client)
            except OSError:
                return
            threading.Thread(
                target=self._relay, args=(client,), name="partition-relay", daemon=True
            ).start()

    def _relay(self, client: socket.socket) -> None:
        self._flowing.wait()  # a connection opened while cut hangs before reaching upstream
        if self._closed.is_set():
            return
        try:
            upstream = self._track(socket.create_connection(self._upstream, timeout=10))
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        self.relayed += 1
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(
                target=self._pump, args=(source, sink), name="partition-pump", daemon=True
            ).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        for data in _chunks(source):
            self._flowing.wait()  # held while cut, delivered once healed
            if self._closed.is_set():
                return
            try:
                sink.sendall(data)
            except OSError:
                return
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _chunks(sock: socket.socket) -> Iterator[bytes]:
    while True:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        yield data
