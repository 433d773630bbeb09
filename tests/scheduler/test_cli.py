"""`gpupack-scheduler`'s command line: clear errors with exit code 2, before any API call."""

import socket
from pathlib import Path

import pytest

from gpupack.runtime.shell import EXIT_USAGE
from scheduler.cli import main
from tests.apistub import write_kubeconfig

pytestmark = pytest.mark.usefixtures("restore_logging")


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
