"""A fake kubelet pod-resources API for tests: real gRPC on a unix socket, same codec.

One `PodResourcesServer` plays one node's kubelet. It answers `List` with `pods` and
`GetAllocatableResources` with `allocatable`, both read afresh on every call, so a test
changes what kubelet reports by assigning them (never mutate a list in place while a
client may be calling). `pods` may also be a function returning the pods, for a fake
kubelet that follows some other fake state::

    with PodResourcesServer(sock, pods=[PodResources("cap-0", "gpupack", ...)]) as kubelet:
        client = PodResourcesClient(sock)
        kubelet.pods = []                                   # the pod went away
        kubelet.error = (grpc.StatusCode.INTERNAL, "boom")  # answer with a status instead
        kubelet.delay = 1.0                                 # answer late (or not at all)
        kubelet.stop()                                      # kubelet down: socket removed
        kubelet.start()                                     # back, on the same path

Unix socket paths are limited to about 107 bytes, and pytest's tmp_path can be longer:
put the socket under `short_tempdir()`.
"""

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc

from exporter.podresources import (
    SERVICE,
    ContainerDevices,
    PodResources,
    decode_empty,
    encode_allocatable_response,
    encode_list_response,
)

Pods = Sequence[PodResources] | Callable[[], Sequence[PodResources]]


@contextmanager
def short_tempdir() -> Iterator[Path]:
    """A fresh directory under /tmp, short enough for unix sockets; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="pr", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class PodResourcesServer:
    """A kubelet's `v1.PodResourcesLister` on `socket_path`; a context manager that starts it."""

    def __init__(
        self,
        socket_path: Path,
        pods: Pods = (),
        *,
        allocatable: Sequence[ContainerDevices] = (),
    ) -> None:
        self.socket_path = socket_path
        self.pods: Pods = pods
        self.allocatable: Sequence[ContainerDevices] = allocatable
        self.error: tuple[grpc.StatusCode, str] | None = None  # answer every call with this
        self.delay = 0.0  # seconds to wait before answering; stop() cuts the wait short
        self.calls = 0  # calls received, both methods, since construction
        self._calls_lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._stopping = threading.Event()

    def start(self) -> Self:
        """Listen on `socket_path` (a stale socket there is replaced, as kubelet does)."""
        if self._server is not None:
            raise RuntimeError(f"pod-resources server at {self.socket_path} already started")
        self._stopping.clear()
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=decode_empty,
                    response_serializer=encode_list_response,
                ),
                "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                    self._allocatable,
                    request_deserializer=decode_empty,
                    response_serializer=encode_allocatable_response,
                ),
            },
        )
        executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-kubelet")
        server = grpc.server(executor, handlers=[handler])
        try:
            server.add_insecure_port(f"unix://{self.socket_path.absolute()}")
            server.start()
        except BaseException:
            server.stop(None)
            executor.shutdown(wait=True)
            raise
        self._server, self._executor = server, executor
        return self

    def stop(self) -> None:
        """Stop at once, cancelling calls in flight; grpc removes the socket file."""
        server, executor = self._server, self._executor
        self._server = self._executor = None
        self._stopping.set()
        if server is not None:
            server.stop(None).wait()
        if executor is not None:
            executor.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _answer(self, context: grpc.ServicerContext) -> None:
        with self._calls_lock:
            self.calls += 1
        if self.delay:
            self._stopping.wait(self.delay)
        if self.error is not None:
            context.abort(*self.error)  # raises

    def _list(self, request: tuple[()], context: grpc.ServicerContext) -> Sequence[PodResources]:
        self._answer(context)
        pods = self.pods
        return tuple(pods() if callable(pods) else pods)

    def _allocatable(
        self, request: tuple[()], context: grpc.ServicerContext
    ) -> Sequence[ContainerDevices]:
        self._answer(context)
        return tuple(self.allocatable)
