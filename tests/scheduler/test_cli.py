"""`gpupack-scheduler`'s command line: clear errors with exit code 2, before any API call."""

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupack.runtime.shell import EXIT_USAGE
from scheduler.cli import main
from tests.apistub import write_kubeconfig


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() configures the root logger; leave it as the other tests expect it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_busy_metrics_port_is_a_usage_error_naming_the_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "config", "http://127.0.0.1:1")  # never reached
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [
            f"--kubeconfig={kubeconfig}",
            f"--metrics-port={port}",
            "--metrics-address=127.0.0.1",
        ]

        assert main(argv) == EXIT_USAGE
    assert f"cannot serve metrics on port {port}: " in capsys.readouterr().err
