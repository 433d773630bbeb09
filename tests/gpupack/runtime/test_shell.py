"""The process shell's sequence and exit codes, the same for every long-running binary."""

import argparse
import socket
import threading
from collections.abc import Iterator, Mapping

import pytest

from gpupack.objects import JSON
from gpupack.runtime import leader, shell
from gpupack.runtime.api import ApiError, WatchStream
from gpupack.runtime.informer import Informer

pytestmark = pytest.mark.usefixtures("restore_logging")  # shell.run configures logging


class _NoServer:
    """A ListWatch whose server never answers."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        raise ApiError(0, "ConnectionError", "connection refused")

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream:
        raise ApiError(0, "ConnectionError", "connection refused")


class _Empty:
    """A ListWatch with nothing in it; its watches end at once."""

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    def watch(self, path: str, params: Mapping[str, str]) -> WatchStream:
        return _Closed()


class _Closed:
    def __iter__(self) -> Iterator[JSON]:
        threading.Event().wait(0.05)
        return iter(())

    def close(self) -> None:
        pass


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="gpupack-test")
    shell.add_arguments(built)
    return built


def test_bad_input_from_start_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
        raise ValueError("--interval must be positive")

    assert shell.run(parser(), [], start) == shell.EXIT_USAGE
    err = capsys.readouterr().err
    assert "gpupack-test: error: --interval must be positive" in err
    assert "usage: gpupack-test" in err


def test_a_missing_kubeconfig_exits_2_naming_the_file(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
        process.connect(args.kubeconfig, "gpupack-test")
        return shell.Service()

    assert shell.run(parser(), ["--kubeconfig=/nonexistent/kc"], start) == shell.EXIT_USAGE
    assert "kubeconfig /nonexistent/kc (from --kubeconfig): no such file" in capsys.readouterr().err


def test_a_cache_that_never_syncs_exits_1_and_undoes_everything() -> None:
    undone: list[str] = []

    def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
        process.defer(lambda: undone.append("first"))
        process.add(Informer(_NoServer(), "/api/v1/pods", name="pods"))
        process.defer(lambda: undone.append("second"))
        return shell.Service(work=lambda stop: undone.append("worked"))

    assert shell.run(parser(), [], start, sync_timeout=0.3) == shell.EXIT_FAILED
    assert undone == ["second", "first"]  # never worked; cleanups last-in, first-out


def test_a_cache_not_waited_for_does_not_hold_the_service_back() -> None:
    ran = threading.Event()

    def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
        process.add(Informer(_NoServer(), "/api/v1/pods", name="pods"), wait=False)

        def work(stop: threading.Event) -> None:
            ran.set()
            process.stop.set()

        return shell.Service(work=work)

    assert shell.run(parser(), [], start, sync_timeout=0.3) == shell.EXIT_OK
    assert ran.is_set()


def test_work_that_fails_exits_1() -> None:
    def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
        def work(stop: threading.Event) -> None:
            raise RuntimeError("bug")

        return shell.Service(work=work)

    assert shell.run(parser(), [], start) == shell.EXIT_FAILED


def test_a_stop_tells_the_work_to_stop_and_exits_0() -> None:
    seen: list[str] = []

    def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
        informer = process.add(Informer(_Empty(), "/api/v1/pods", name="pods"))

        def work(stop: threading.Event) -> None:
            seen.append(f"synced={informer.synced}")
            process.stop.set()  # as the SIGTERM handler does
            assert stop.wait(5)
            seen.append("stopped")

        return shell.Service(work=work)

    assert shell.run(parser(), ["--log-level=DEBUG"], start) == shell.EXIT_OK
    assert seen == ["synced=True", "stopped"]


class _Leases:
    """A Lease API in memory: get, create, update with resourceVersions."""

    def __init__(self) -> None:
        self.lease: JSON | None = None
        self.version = 0

    def get(self, path: str) -> JSON:
        if self.lease is None:
            raise ApiError(404, "NotFound", "no lease")
        return self.lease

    def create(self, path: str, body: JSON) -> JSON:
        return self.update(path, body)

    def update(self, path: str, body: JSON) -> JSON:
        self.version += 1
        self.lease = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": str(self.version)},
        }
        return self.lease


def test_a_leader_whose_work_fails_exits_1_and_gives_the_lease_up() -> None:
    leases = _Leases()

    def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
        def work(stop: threading.Event) -> None:
            raise RuntimeError("bug")

        return shell.Service(work=work, election=process.election(args, leases, "gpupack-system"))

    built = parser()
    leader.add_arguments(built, "gpupack-test")

    assert shell.run(built, ["--retry-period=0.1"], start) == shell.EXIT_FAILED
    assert leases.lease is not None
    assert leases.lease["spec"]["holderIdentity"] == ""  # released, not left to expire


def test_a_busy_port_exits_2_naming_what_and_the_port(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        def start(args: argparse.Namespace, process: shell.Process) -> shell.Service:
            with shell.listening("metrics", port), socket.socket() as again:
                again.bind(("127.0.0.1", port))
            return shell.Service()

        assert shell.run(parser(), [], start) == shell.EXIT_USAGE
    assert f"gpupack-test: error: cannot serve metrics on port {port}: " in capsys.readouterr().err
