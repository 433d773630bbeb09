"""What the local cluster's processes have spent: CPU time read from /proc."""

import os
from pathlib import Path
from typing import Any


def cpu_seconds(processes: dict[str, Any]) -> dict[str, float]:
    """CPU time (user and system) each process of the cluster has used so far, and this
    benchmark's own (`benchmark`: its clients and watches). A process that has exited is
    left out."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = {name: p.pid for name, p in processes.items() if getattr(p, "pid", 0)}
    pids["benchmark"] = os.getpid()
    used = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        except OSError:
            continue
        used[name] = (int(fields[11]) + int(fields[12])) / tick
    return used
