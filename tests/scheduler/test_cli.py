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
        key = tmp_path / "key"
        key.write_text("k" * 32)
        argv = [
            f"--kubeconfig={kubeconfig}",
            f"--decision-key-file={key}",
            f"--metrics-port={port}",
            "--metrics-address=127.0.0.1",
        ]

        assert main(argv) == EXIT_USAGE
    assert (
        f"cannot serve /metrics, /healthz and /readyz on port {port}: " in capsys.readouterr().err
    )


@pytest.mark.parametrize(("content", "why"), [(None, "No such file"), ("short", "at least 32")])
def test_a_missing_or_short_decision_key_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, why: str
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "config", "http://127.0.0.1:1")  # never reached
    key = tmp_path / "key"
    if content is not None:
        key.write_text(content)

    assert main([f"--kubeconfig={kubeconfig}", f"--decision-key-file={key}"]) == EXIT_USAGE
    assert why in capsys.readouterr().err
