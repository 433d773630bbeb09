"""`gpupack-mps-daemon`: the MPS control daemon of one GPU, in the capacity pod that holds it.

An MPS pool's capacity pod (`scheduler.manifest.mps_daemon_container`) runs this instead
of the pause container. It holds the GPU the same way, and supervises
`nvidia-cuda-mps-control -f` (which the NVIDIA container runtime mounts into the
container with the driver capability `compute`): the control daemon sees only this
pod's GPU, keeps its pipes in `CUDA_MPS_PIPE_DIRECTORY` and its logs in
`CUDA_MPS_LOG_DIRECTORY`, both on the GPU's MPS volume that the pods placed on the GPU
mount too (`gpupack.mps`).

- On SIGTERM (the capacity pod is deleted: its GPU is empty past its grace period) it
  asks the daemon to `quit`, waits `--stop-timeout`, then kills it; exit 0.
- When the daemon dies on its own, it logs the exit status and the end of `control.log`
  and exits 1, so the kubelet restarts the container: the restart is what the scheduler
  turns into an Event and a metric. The pods on the GPU lose their MPS server with it.
- `--check` asks the running daemon for its default thread percentage and exits 0 when
  it answers: the container's readiness and liveness probe.

Exit codes: 0 stopped by a signal, 1 the daemon failed (or could not start), 2 bad
arguments.
"""

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Final

from gpupack import mps
from gpupack.runtime.args import conventions, positive_seconds
from gpupack.runtime.logs import configure_logging
from gpupack.runtime.shell import add_log_arguments

log = logging.getLogger("node.mps_daemon")

CONTROL: Final = "nvidia-cuda-mps-control"
HEALTH_COMMAND: Final = "get_default_active_thread_percentage"
LOG_TAIL_LINES: Final = 20


class DaemonError(Exception):
    """The control daemon cannot be started or does not answer; the message says why."""


@dataclass(frozen=True, slots=True)
class Directories:
    pipe: Path
    log: Path

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> "Directories":
        return cls(
            Path(environ.get(mps.ENV_PIPE_DIRECTORY) or mps.PIPE_DIRECTORY),
            Path(environ.get(mps.ENV_LOG_DIRECTORY) or mps.LOG_DIRECTORY),
        )

    def environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        return {
            **environ,
            mps.ENV_PIPE_DIRECTORY: str(self.pipe),
            mps.ENV_LOG_DIRECTORY: str(self.log),
        }


def find_control(name: str, environ: Mapping[str, str]) -> str:
    """The control binary's path; a DaemonError that says why it is missing."""
    found = shutil.which(name, path=environ.get("PATH"))
    if found is None:
        raise DaemonError(
            f"{name} not found on PATH: the NVIDIA container runtime mounts it into "
            f"containers that hold a GPU and set NVIDIA_DRIVER_CAPABILITIES to include "
            f"'compute' (this container has "
            f"{environ.get('NVIDIA_DRIVER_CAPABILITIES', 'none')!r}); is the node's "
            f"container runtime NVIDIA's?"
        )
    return found


def ask(control: str, command: str, environ: Mapping[str, str], timeout: float) -> str:
    """Send one command to the running daemon (its client mode reads stdin); its answer."""
    try:
        done = subprocess.run(  # noqa: S603 (our binary, our command)
            [control],
            input=f"{command}\n",
            capture_output=True,
            text=True,
            env=dict(environ),
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise DaemonError(
            f"the MPS control daemon did not answer {command} in {timeout:g}s"
        ) from None
    except OSError as error:
        raise DaemonError(f"cannot run {control}: {error.strerror}") from None
    answer = (done.stdout or "").strip()
    if done.returncode != 0:
        said = (done.stderr or done.stdout or "").strip() or f"exit status {done.returncode}"
        raise DaemonError(f"the MPS control daemon did not answer {command}: {said}")
    return answer


def log_tail(directory: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The end of the daemon's control.log, for a failure message."""
    try:
        text = (directory / "control.log").read_text(errors="replace")
    except OSError:
        return "(no control.log)"
    return "\n".join(text.splitlines()[-lines:]) or "(control.log is empty)"


class Supervisor:
    """Runs the control daemon in the foreground and stops it on request."""

    def __init__(self, control: str, directories: Directories, environ: Mapping[str, str]) -> None:
        self._control = control
        self._dirs = directories
        self._env = directories.environment(environ)
        self._stopping = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        for directory in (self._dirs.pipe, self._dirs.log):
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise DaemonError(
                    f"cannot create {directory}: {error.strerror}; is the {mps.VOLUME} "
                    f"volume mounted at {mps.MOUNT_PATH}?"
                ) from None
        try:
            self._child = subprocess.Popen(  # noqa: S603 (our binary)
                [self._control, "-f"], env=self._env
            )
        except OSError as error:
            raise DaemonError(f"cannot start {self._control} -f: {error.strerror}") from None
        log.info(
            "MPS control daemon started",
            extra={"pid": self._child.pid, "pipe": str(self._dirs.pipe)},
        )

    def wait(self) -> int:
        """Until the daemon exits; 0 when it was asked to stop, 1 when it died."""
        assert self._child is not None
        status = self._child.wait()
        if self._stopping.is_set():
            log.info("MPS control daemon stopped", extra={"status": status})
            return 0
        log.error(
            "MPS control daemon exited with status %s; the pods on this GPU lost their MPS "
            "server. Last lines of control.log:\n%s",
            status,
            log_tail(self._dirs.log),
        )
        return 1

    def stop(self, timeout: float) -> None:
        """Ask the daemon to quit; kill it when it has not within `timeout` seconds."""
        self._stopping.set()
        child = self._child
        if child is None or child.poll() is not None:
            return
        try:
            ask(self._control, "quit", self._env, timeout)
        except DaemonError as error:
            log.warning("%s; terminating it", error)
            child.terminate()
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("MPS control daemon still running after %gs; killing it", timeout)
            child.kill()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=mps.DAEMON_COMMAND,
        description="Run the CUDA MPS control daemon of the GPU this container holds, in "
        "the foreground, until SIGTERM; with --check, ask the running daemon whether it "
        f"answers. Directories: ${mps.ENV_PIPE_DIRECTORY} (default {mps.PIPE_DIRECTORY}), "
        f"${mps.ENV_LOG_DIRECTORY} (default {mps.LOG_DIRECTORY}).",
    )
    add = parser.add_argument
    add("--check", action="store_true", help="exit 0 when the running daemon answers")
    add(
        "--control",
        default=CONTROL,
        metavar="PATH",
        help="the MPS control binary, found on PATH (default: %(default)s)",
    )
    add(
        "--stop-timeout",
        type=positive_seconds,
        default=10.0,
        metavar="DURATION",
        help="how long the daemon may take to quit before it is killed (default: 10s)",
    )
    add(
        "--check-timeout",
        type=positive_seconds,
        default=5.0,
        metavar="DURATION",
        help="how long --check waits for an answer (default: 5s)",
    )
    add_log_arguments(parser)
    return conventions(parser)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env = os.environ if environ is None else environ
    configure_logging(args.log_level, fmt=args.log_format)
    directories = Directories.from_environment(env)
    try:
        control = find_control(args.control, env)
        if args.check:
            answer = ask(control, HEALTH_COMMAND, directories.environment(env), args.check_timeout)
            print(f"MPS control daemon answers: default active thread percentage {answer}")
            return 0
        supervisor = Supervisor(control, directories, env)
        supervisor.start()
    except DaemonError as error:
        log.error("%s", error)
        print(f"{mps.DAEMON_COMMAND}: {error}", file=sys.stderr)
        return 1

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: stopping the MPS control daemon", signal.Signals(signum).name)
        threading.Thread(target=supervisor.stop, args=(args.stop_timeout,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return supervisor.wait()


if __name__ == "__main__":
    sys.exit(main())
