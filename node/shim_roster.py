"""The roster: which processes each pod's memory-shim budget records, for the exporter.

The CSI driver `cuda.gpupack.io` writes every memory-enforced pod's directory into the
kubelet's pod directories; the budget there lists each process the shim is loaded into
(its PID in its own namespace and its start time: `gpupack.budget`). The exporter beside
it in the node agent's pod matches those with NVML's GPU processes, and so learns which
run without the shim, with neither CAP_SYS_PTRACE (reading other processes' memory maps)
nor the kubelet's pod directories (every pod's secrets) in its container.

One request a connection, on a Unix socket in a directory the two containers share:
the pod's UID in, one JSON line out (`gpupack.budget.roster_answer`). A UID that is not
one (no path can be named), a budget of another layout, or one that cannot be read is an
error answer; a pod without a budget has no processes. The socket is root's alone.
"""

import logging
import os
import socketserver
import threading
from pathlib import Path
from typing import Final

from gpupack import budget as budget_file
from gpupack import cuda

log = logging.getLogger(__name__)

REQUEST_BYTES: Final = 128
TIMEOUT_SECONDS: Final = 2.0


def budget_path(pods_dir: Path, uid: str) -> Path:
    """Where the kubelet keeps a pod's shim directory (the CSI driver's target path)."""
    return pods_dir / uid / "volumes" / "kubernetes.io~csi" / cuda.VOLUME / "mount" / cuda.BUDGET


def answer(pods_dir: Path, request: bytes) -> bytes:
    """The roster's answer to one request line."""
    uid = request.decode("ascii", "replace").strip()
    if not budget_file.POD_UID.match(uid):
        return budget_file.roster_error(f"not a pod UID: {uid[:64]!r}")
    try:
        data = budget_path(pods_dir, uid).read_bytes()
    except FileNotFoundError:
        return budget_file.roster_answer(None)
    except OSError as error:
        return budget_file.roster_error(f"the budget of pod {uid} cannot be read: {error}")
    try:
        return budget_file.roster_answer(budget_file.read_budget(data))
    except budget_file.BudgetError as error:
        return budget_file.roster_error(f"the budget of pod {uid}: {error}")


class _Handler(socketserver.StreamRequestHandler):
    timeout = TIMEOUT_SECONDS

    def handle(self) -> None:
        try:
            line = self.rfile.readline(REQUEST_BYTES)
        except (OSError, TimeoutError):
            return
        self.wfile.write(answer(self.server.pods_dir, line))  # type: ignore[attr-defined]


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    pods_dir: Path


def serve(path: Path, pods_dir: Path) -> _Server:
    """Serves the roster on `path` (replacing a socket left there) in a thread of its own;
    `shutdown()` and `server_close()` stop it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    old = os.umask(0o077)
    try:
        server = _Server(str(path), _Handler)
    finally:
        os.umask(old)
    server.pods_dir = pods_dir
    threading.Thread(target=server.serve_forever, name="shim-roster", daemon=True).start()
    log.info("serving the shim roster", extra={"socket": str(path), "pods": str(pods_dir)})
    return server
