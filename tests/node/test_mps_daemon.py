"""gpupack-mps-daemon: the MPS daemon's lifecycle in a capacity pod, with a stand-in
control binary (`mps_standin.py`) in place of NVIDIA's, as real processes."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node import mps_daemon

STANDIN = Path(__file__).with_name("mps_standin.py")


@pytest.fixture
def control(tmp_path: Path) -> Path:
    """An executable named like NVIDIA's binary that runs the stand-in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = bin_dir / "nvidia-cuda-mps-control"
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def environ(tmp_path: Path, control: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{control.parent}:{os.environ['PATH']}",
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps" / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps" / "log"),
    }


def run(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.mps_daemon", "--log-format=text", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def start(environ: dict[str, str]) -> subprocess.Popen[str]:
    """gpupack-mps-daemon, once the stand-in daemon has opened its pipe."""
    process = subprocess.Popen(
        [sys.executable, "-m", "node.mps_daemon", "--log-format=text"],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    control_socket = Path(environ["CUDA_MPS_PIPE_DIRECTORY"]) / "control"
    deadline = time.monotonic() + 30
    while not control_socket.exists() and process.poll() is None:
        assert time.monotonic() < deadline, "the stand-in daemon never opened its pipe"
        time.sleep(0.05)
    return process


@pytest.fixture
def supervisor(environ: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = start(environ)
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


def test_the_daemon_answers_its_probe_and_quits_on_sigterm(
    supervisor: subprocess.Popen[str], environ: dict[str, str]
) -> None:
    check = run(environ, "--check")
    assert check.returncode == 0, check.stderr
    assert "default active thread percentage 100.0" in check.stdout

    supervisor.send_signal(signal.SIGTERM)
    output, _ = supervisor.communicate(timeout=30)
    assert supervisor.returncode == 0, output
    log = (Path(environ["CUDA_MPS_LOG_DIRECTORY"]) / "control.log").read_text()
    assert "[stand-in] quit" in log  # asked to quit, not killed
    assert "control daemon stopped" in log
    assert run(environ, "--check").returncode == 1  # nothing answers any more


def test_a_daemon_that_dies_fails_the_container_with_its_log(
    environ: dict[str, str], tmp_path: Path
) -> None:
    environ["STANDIN_CRASH_AFTER"] = "1"
    process = start(environ)
    assert run(environ, "--check").returncode == 0  # the one command it serves

    output, _ = process.communicate(timeout=30)
    assert process.returncode == 1  # the kubelet restarts the container
    assert "exited with status 3" in output
    assert "fatal: the control daemon crashed" in output  # the end of control.log


def test_check_without_a_daemon_fails_and_says_so(environ: dict[str, str]) -> None:
    check = run(environ, "--check")
    assert check.returncode == 1
    assert "Cannot find MPS control daemon process" in check.stderr


def test_without_the_nvidia_runtime_it_says_what_is_missing(
    environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    environ["PATH"] = "/nonexistent"
    environ["NVIDIA_DRIVER_CAPABILITIES"] = "utility"
    assert mps_daemon.main(["--log-format=text"], environ) == 1
    error = capsys.readouterr().err
    assert "nvidia-cuda-mps-control not found on PATH" in error
    assert "'compute'" in error
    assert "'utility'" in error


def test_a_bad_duration_is_a_usage_error(environ: dict[str, str]) -> None:
    done = run(environ, "--stop-timeout=soon")
    assert done.returncode == 2
    assert "--stop-timeout" in done.stderr
