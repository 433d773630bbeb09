"""A fake /proc for tests: the files `exporter.cgroup.ProcessTable` reads, as Linux writes them."""

from pathlib import Path


def stat_line(pid: int, comm: str, start_time: int) -> str:
    # Fields 3..21, then starttime (22), then the rest up to field 52, as Linux 5.x writes.
    head = f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 11523 0 3 0 412 97 0 0 20 0 9 0"
    tail = " 13094912000 482113 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0"
    return f"{head} {start_time}{tail} 17 5 0 0 0 0 0 0 0 0 0 0 0 0 0\n"


def write_proc(
    root: Path,
    pid: int,
    *,
    cgroup: str,
    start_time: int = 100,
    comm: str = "python3",
    cmdline: str | None = None,
) -> None:
    """`root/<pid>/{stat,cgroup,cmdline}` for one process."""
    proc = root / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(stat_line(pid, comm, start_time))
    (proc / "cgroup").write_text(cgroup)
    (proc / "cmdline").write_text(cmdline if cmdline is not None else f"{comm}\0")


def containerd_v2(pod_uid: str, container_id: str, qos: str = "burstable") -> str:
    """/proc/<pid>/cgroup of a container process: cgroup v2, systemd driver, containerd."""
    slice_uid = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )
