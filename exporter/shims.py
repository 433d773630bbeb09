"""Which of a pod's GPU processes run with the memory shim, without reading their memory.

Every process the shim is loaded into records itself in its pod's budget: its PID in its
own namespace and its start time (`gpupack.budget`). The node agent's CSI driver, which
writes the budgets, answers on a Unix socket which processes each pod's budget records
(`node.shim_roster`). A GPU process NVML lists is `loaded` when its pod's budget records
its (namespace PID, start time), `missing` when it does not (a static binary, a musl
image, a process that cleared its environment where LD_PRELOAD carried the shim), and
`unknown` when the roster cannot be asked. So the exporter needs neither CAP_SYS_PTRACE
nor the kubelet's pod directories.

`mark` is the pure part: owners and a roster lookup in, owners with `shim` set out.
`RosterClient` is the thin I/O shell; one request per pod per scrape.
"""

import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Final

from exporter.cgroup import OwnerKind, ProcessOwner
from gpupack.budget import BudgetError, read_roster

log = logging.getLogger(__name__)

TIMEOUT_SECONDS: Final = 2.0
ANSWER_BYTES: Final = 1 << 20

# A pod's UID -> the (namespace PID, start time) its budget records; None: not known.
Roster = Callable[[str], frozenset[tuple[int, int]] | None]


def mark(owners: Mapping[int, ProcessOwner], roster: Roster) -> dict[int, ProcessOwner]:
    """`owners` with each pod process's `shim` set from its pod's roster."""
    answers: dict[str, frozenset[tuple[int, int]] | None] = {}
    marked = dict(owners)
    for pid, owner in owners.items():
        if owner.kind is not OwnerKind.POD or owner.pod_uid is None:
            continue
        if owner.pod_uid not in answers:
            answers[owner.pod_uid] = roster(owner.pod_uid)
        recorded = answers[owner.pod_uid]
        if recorded is None or owner.ns_pid is None:
            continue
        marked[pid] = replace(owner, shim=(owner.ns_pid, owner.start_time) in recorded)
    return marked


class RosterClient:
    """Asks the node agent's roster socket; each failure is logged once until it heals."""

    def __init__(self, path: Path, timeout: float = TIMEOUT_SECONDS) -> None:
        self._path = path
        self._timeout = timeout
        self._failing: str | None = None

    def __call__(self, uid: str) -> frozenset[tuple[int, int]] | None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(self._timeout)
                client.connect(str(self._path))
                client.sendall(uid.encode() + b"\n")
                with client.makefile("rb") as answer:
                    processes = read_roster(answer.readline(ANSWER_BYTES))
        except (OSError, BudgetError) as error:
            message = (
                f"the shim roster {self._path} cannot say which processes run the shim: {error}"
            )
            if message != self._failing:
                log.warning(message)
                self._failing = message
            return None
        self._failing = None
        return processes
