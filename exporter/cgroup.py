"""Which pod and container a host process belongs to, read from /proc/<pid>/cgroup.

NVML reports GPU usage by host PID. The exporter runs with hostPID and attributes each
PID through its cgroup path, which the kubelet names after the pod UID and the container
runtime after the container ID. `parse_cgroup` is the pure part: the text of
/proc/<pid>/cgroup to a `CgroupOwner`, or None for a process in no pod. `ProcessTable` is
the thin I/O shell over /proc: it recognises the CUDA MPS server (usage listed under the
server belongs to its clients, not to the pod that hosts the daemon) and caches answers
by (PID, start time), because PIDs are reused.

Paths understood, in cgroup v1, v2 and hybrid files alike:

- cgroupfs driver: ``/kubepods[/burstable|/besteffort]/pod<uid>/<id>``; CRI-O names the
  container's cgroup ``crio-<id>``.
- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid,
  dashes as underscores>.slice/<runtime>-<id>.scope`` (cri-containerd, crio, docker);
  guaranteed pods sit in ``kubepods-pod<uid>.slice``.
- a systemd cgroupsPath that runc in cgroupfs mode took literally, under containerd's own
  cgroup: ``/system.slice/containerd.service/kubepods-pod<uid>.slice:cri-containerd:<id>``.
- any prefix before the kubepods part (kind's ``/kubelet``, ``/docker/<node id>``,
  ``/kubelet.slice/kubelet-kubepods.slice``) and any sub-cgroups below the container's
  (``<id>.scope/init``, cgroups the workload makes): the container is the cgroup right
  below the pod's.
- paths relative to the reader's cgroup namespace (``/../../pod<uid>/<id>``): on cgroup
  v2 the runtime gives the exporter's container a private cgroup namespace by default.

Decisions: CRI-O's conmon (``crio-conmon-<id>``) is in the pod but is not a container, so
its container ID is None. A static pod's UID (the kubelet's 32-hex config hash) is kept
as written; other UIDs are normalised to the dashed form. A process in the reader's own
cgroup shows ``/`` and reads as "no pod" (only the exporter's own pod is affected).
"""

import enum
import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

MPS_SERVER_NAME: Final = "nvidia-cuda-mps-server"
_COMM_MAX: Final = 15  # the kernel truncates comm to TASK_COMM_LEN - 1 bytes

_UID: Final = (
    r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
)
_KUBEPODS = re.compile(r"(?:^|-)kubepods(?:$|[.-])")
_POD_CGROUPFS = re.compile(rf"pod(?P<uid>{_UID})")
_POD_SYSTEMD = re.compile(rf"(?:[\w.-]*-)?kubepods(?:-[a-z]+)?-pod(?P<uid>{_UID})\.slice")
_CONTAINER = re.compile(r"(?:(?P<runtime>[a-z][a-z0-9-]*)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?")
# v1 controllers whose hierarchy every runtime and driver joins, most trusted first;
# other v1 lines next, the v2 line ("0::") last (in hybrid files it may be stale).
_PREFERRED: Final = ("memory", "cpu", "pids", "name=systemd")


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    """The pod (and the container in it) whose cgroup holds a process."""

    pod_uid: str  # dashed form, or a static pod's 32-hex config hash
    container_id: str | None  # 64 hex; None in the pod's own cgroup or in CRI-O's conmon


def parse_cgroup(text: str) -> CgroupOwner | None:
    """The pod owning the process whose /proc/<pid>/cgroup is `text`; None outside pods."""
    entries: list[tuple[int, str]] = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3:
            entries.append((_rank(fields[1]), fields[2]))
    for _, path in sorted(entries, key=lambda entry: entry[0]):
        owner = _owner_of_path(path)
        if owner is not None:
            return owner
    return None


def _rank(controllers: str) -> int:
    if not controllers:
        return len(_PREFERRED) + 1
    names = controllers.split(",")
    return min((i for i, name in enumerate(_PREFERRED) if name in names), default=len(_PREFERRED))


def _owner_of_path(path: str) -> CgroupOwner | None:
    parts = [part for part in path.split("/") if part]
    # Relative to our cgroup namespace: the kubepods ancestor may be out of sight.
    anchored = bool(parts) and parts[0] == ".."
    for i, part in enumerate(parts):
        head, literal, tail = part.partition(":")
        match = _POD_SYSTEMD.fullmatch(head)
        if match is None and anchored:
            match = _POD_CGROUPFS.fullmatch(head)
        if match is None:
            anchored = anchored or _KUBEPODS.search(head) is not None
            continue
        # The container is the cgroup right below the pod's, or "<pod slice>:<runtime>:<id>".
        child = tail.replace(":", "-") if literal else "".join(parts[i + 1 : i + 2])
        return CgroupOwner(match["uid"].replace("_", "-"), _container_id(child))
    return None


def _container_id(part: str) -> str | None:
    match = _CONTAINER.fullmatch(part)
    if match is None or (match["runtime"] or "").endswith("conmon"):
        return None
    return match["id"]


@dataclass(frozen=True, slots=True)
class ProcStat:
    comm: str  # as the kernel keeps it: at most 15 bytes
    start_time: int  # clock ticks after boot (field 22)


def parse_stat(text: str) -> ProcStat | None:
    """Name and start time from /proc/<pid>/stat; None when malformed.

    The name sits in parentheses and may itself hold spaces and ')' characters, so it
    ends at the last ')'.
    """
    opening, closing = text.find("("), text.rfind(")")
    if opening < 0 or closing < opening:
        return None
    fields = text[closing + 1 :].split()  # fields[0] is field 3 (the state)
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return ProcStat(text[opening + 1 : closing], int(fields[19]))


def parse_ns_pid(status: str) -> int | None:
    """The innermost PID of /proc/<pid>/status's `NSpid` line; None without one."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields and fields[-1].isdigit() else None
    return None


class OwnerKind(enum.StrEnum):
    POD = "pod"  # in a pod: charge its usage there
    MPS_SERVER = "mps-server"  # the CUDA MPS server: its usage is its clients'
    HOST = "host"  # in no pod: a host service, a plain Docker container, a kernel thread
    GONE = "gone"  # exited, or its /proc entry could not be read


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    kind: OwnerKind
    pod_uid: str | None = None  # set for POD; for MPS_SERVER, the pod hosting the daemon
    container_id: str | None = None
    # A pod's process as its own PID namespace knows it (the last of /proc/<pid>/status's
    # NSpid) and its start time: how the memory shim's budget names it (exporter.shims).
    # Who the process is, not who owns it: left out of comparisons.
    ns_pid: int | None = field(default=None, compare=False)
    start_time: int = field(default=0, compare=False)
    # Whether it runs with the memory shim; None: not known (exporter.shims sets it).
    shim: bool | None = None


HOST: Final = ProcessOwner(OwnerKind.HOST)
GONE: Final = ProcessOwner(OwnerKind.GONE)


class ProcessTable:
    """Host PID -> `ProcessOwner` through /proc, cached by (PID, start time).

    Every call reads /proc/<pid>/stat (a reused PID has a new start time); a miss also
    reads the cgroup file and, for a process named like the MPS daemons, its cmdline.
    The cache keeps the `max_entries` most recently used PIDs. Not thread-safe: one
    sampler owns it.
    """

    def __init__(self, proc_root: Path = Path("/proc"), *, max_entries: int = 65536) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: must be at least 1, got {max_entries}")
        self._root = proc_root
        self._prefix = os.fspath(proc_root)
        self._max = max_entries
        self._cache: dict[int, tuple[int, ProcessOwner]] = {}
        self.failures = 0  # calls answered GONE: the PID exited or /proc was unreadable

    def __len__(self) -> int:
        return len(self._cache)

    def owner(self, pid: int) -> ProcessOwner:
        stat = self._stat(pid)
        cached = self._cache.pop(pid, None)
        if stat is None:
            self.failures += 1
            return GONE
        if cached is not None and cached[0] == stat.start_time:
            self._cache[pid] = cached  # now the most recently used
            return cached[1]
        resolved = self._resolve(pid, stat)
        if resolved is None:
            self.failures += 1
            return GONE
        if len(self._cache) >= self._max:
            del self._cache[next(iter(self._cache))]
        self._cache[pid] = (stat.start_time, resolved)
        return resolved

    def forget_missing(self, live_pids: Collection[int]) -> int:
        """Drop the entries of PIDs not in `live_pids`; returns how many were dropped."""
        live = set(live_pids)
        dead = [pid for pid in self._cache if pid not in live]
        for pid in dead:
            del self._cache[pid]
        return len(dead)

    def _resolve(self, pid: int, stat: ProcStat) -> ProcessOwner | None:
        text = self._read(pid, "cgroup")
        if text is None:
            return None
        mps = self._is_mps_server(pid, stat.comm)
        again = self._stat(pid)
        if again is None or again.start_time != stat.start_time:
            return None  # exited, or the PID was reused while we read
        owner = parse_cgroup(text)
        if mps:
            if owner is None:
                return ProcessOwner(OwnerKind.MPS_SERVER)
            return ProcessOwner(OwnerKind.MPS_SERVER, owner.pod_uid, owner.container_id)
        if owner is None:
            return HOST
        return ProcessOwner(
            OwnerKind.POD,
            owner.pod_uid,
            owner.container_id,
            ns_pid=self._ns_pid(pid),
            start_time=stat.start_time,
        )

    def _ns_pid(self, pid: int) -> int | None:
        """The PID the process has in its own namespace (world-readable: no capability)."""
        return parse_ns_pid(self._read(pid, "status") or "")

    def _is_mps_server(self, pid: int, comm: str) -> bool:
        if comm == MPS_SERVER_NAME:
            return True
        if comm != MPS_SERVER_NAME[:_COMM_MAX]:
            return False
        # The truncated name is shared with nvidia-cuda-mps-control; argv[0] tells them
        # apart. Unreadable: an MPS daemon either way, and not the pod's own usage.
        cmdline = self._read(pid, "cmdline")
        if not cmdline:
            return True
        return Path(cmdline.split("\0", 1)[0]).name == MPS_SERVER_NAME

    def _stat(self, pid: int) -> ProcStat | None:
        # Read for every PID on every scrape (the reuse check), so with plain os calls:
        # building Path objects cost more than the read itself. One read is enough: the
        # file is well under 4 KiB, and a short read fails parse_stat (GONE).
        if pid <= 0:
            return None
        try:
            fd = os.open(f"{self._prefix}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # vanished (ENOENT, ESRCH), permission denied, anything else
            return None
        try:
            data = os.read(fd, 4096)
        except OSError:
            return None
        finally:
            os.close(fd)
        return parse_stat(data.decode("utf-8", "replace"))

    def _read(self, pid: int, name: str) -> str | None:
        if pid <= 0:
            return None
        try:
            return (self._root / str(pid) / name).read_bytes().decode("utf-8", "replace")
        except OSError:  # vanished (ENOENT, ESRCH), permission denied, anything else
            return None
