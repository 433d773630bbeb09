"""The control plane's processes: started in their own process group, logged to a file,
killed with their parent unless detached (the demo leaves its cluster running), stopped
with SIGTERM then SIGKILL."""

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# The thread every process is started from. The kernel sends a child its parent-death
# signal when the *thread* that forked it ends, not the process: a process a short-lived
# thread started (a `Restarter`'s, which ends with its test) got SIGTERM then. This one
# lives as long as this Python process.
_SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="process-spawner")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Process:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # the environment it was first started with
    # Held while it is started or stopped, so that a `Restarter` never starts again one
    # that is being stopped on purpose.
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def start(self, env: dict[str, str] | None = None, *, detach: bool = False) -> None:
        """Start it; a restart without `env` gets the environment of the first start."""
        with self._lock:
            self._start(env, detach)

    def _start(self, env: dict[str, str] | None, detach: bool) -> None:
        if env is None:
            env = self.env
        self.env = env
        with open(self.log, "ab") as log:
            self.popen = _SPAWNER.submit(
                subprocess.Popen,  # our own binaries, fixed arguments
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=None if detach else _die_with_parent,
            ).result()

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else 0

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def restart_if_exited(self) -> int | None:
        """Start it again if it was started and exited since (not stopped): its exit
        status, or None when it runs or was stopped."""
        with self._lock:
            if self.popen is None or self.popen.poll() is None:
                return None
            status = self.popen.returncode
            self._start(None, detach=False)
            return status

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL to its process group, as when a node dies: nothing is released."""
        with self._lock:
            if self.popen is None:
                return
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)
            self.popen = None

    def stop(self, grace: float = 10.0) -> None:
        with self._lock:
            if self.popen is None:
                return
            stop_pid(self.popen.pid, grace)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=1)
            self.popen = None


class Restarter:
    """What the kubelet does for a pod's containers (restartPolicy: Always), for host
    processes: each of `names` that exits is started again after `delay` seconds (a
    kube-scheduler that loses its Lease exits, and its pod restarts it). Restarts are
    counted per name; `paused()` stops watching while a test stops one on purpose (one
    stopped with `Process.stop` is never started again); `restarted` is called after
    each restart."""

    def __init__(
        self,
        processes: dict[str, Process],
        names: list[str],
        delay: float = 1.0,
        restarted: Callable[[], None] = lambda: None,
    ):
        self._processes = processes
        self._names = names
        self._delay = delay
        self._restarted = restarted
        self.restarts: dict[str, int] = dict.fromkeys(names, 0)
        self._stop = threading.Event()
        self._paused = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="restarter", daemon=True)

    def __enter__(self) -> "Restarter":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._paused:
            yield

    def _run(self) -> None:
        while not self._stop.wait(self._delay):
            with self._paused:
                for name in self._names:
                    process = self._processes.get(name)
                    status = process.restart_if_exited() if process is not None else None
                    if status is not None:
                        log(f"{name} exited ({status}): started it again")
                        self.restarts[name] += 1
                        self._restarted()


def stop_pid(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it is still there after `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)


def log(message: str) -> None:
    print(f"localcluster: {message}", file=sys.stderr, flush=True)


def routable_address() -> str:
    """This machine's address on its default route: where the API server can reach a
    Service endpoint (endpoints may not be loopback addresses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # UDP: no packet is sent
            address = str(probe.getsockname()[0])
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        raise OSError("this machine has no address but loopback; a Service endpoint needs one")
    return address


def local_executables() -> dict[str, str]:
    """gpupack's console scripts as this Python environment installs them: the local
    stand-ins for the image's `/opt/gpupack/bin`."""
    scripts = Path(sys.executable).parent
    return {path.name: str(path) for path in scripts.glob("gpupack-*")}


def host_environment() -> dict[str, str]:
    """This process's environment less KUBECONFIG: a component finds the API server
    through the `--kubeconfig` the harness passes, as a pod through its token."""
    return {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
