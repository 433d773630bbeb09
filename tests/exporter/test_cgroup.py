from pathlib import Path

import pytest

from doubles.procfs import stat_line, write_proc
from exporter.cgroup import (
    CgroupOwner,
    OwnerKind,
    ProcessOwner,
    ProcessTable,
    ProcStat,
    parse_cgroup,
    parse_ns_pid,
    parse_stat,
)
from tests.exporter import cgroup_fixtures as fx

BURSTABLE_A = CgroupOwner(fx.BURSTABLE_POD_UID, fx.CONTAINER_A)
BESTEFFORT_B = CgroupOwner(fx.BESTEFFORT_POD_UID, fx.CONTAINER_B)
GUARANTEED_C = CgroupOwner(fx.GUARANTEED_POD_UID, fx.CONTAINER_C)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(fx.V1_CGROUPFS_DOCKER_BURSTABLE, BURSTABLE_A, id="v1-cgroupfs-docker"),
        pytest.param(
            fx.V1_CGROUPFS_CONTAINERD_BESTEFFORT, BESTEFFORT_B, id="v1-cgroupfs-containerd"
        ),
        pytest.param(
            fx.V1_CGROUPFS_CONTAINERD_GUARANTEED, GUARANTEED_C, id="v1-cgroupfs-guaranteed"
        ),
        pytest.param(fx.V1_SYSTEMD_CONTAINERD_BURSTABLE, BURSTABLE_A, id="v1-systemd-containerd"),
        pytest.param(
            fx.V1_SYSTEMD_CRIO_BURSTABLE,
            CgroupOwner(fx.BURSTABLE_POD_UID, fx.CONTAINER_B),
            id="v1-systemd-crio",
        ),
        pytest.param(fx.V1_SYSTEMD_DOCKER_GUARANTEED, GUARANTEED_C, id="v1-systemd-docker"),
        pytest.param(
            fx.V1_KIND_CGROUPFS_BESTEFFORT, BESTEFFORT_B, id="v1-kind-under-docker-and-kubelet"
        ),
        pytest.param(fx.V2_SYSTEMD_CONTAINERD_BURSTABLE, BURSTABLE_A, id="v2-systemd-containerd"),
        pytest.param(fx.V2_SYSTEMD_CONTAINERD_GUARANTEED, GUARANTEED_C, id="v2-systemd-guaranteed"),
        pytest.param(fx.V2_SYSTEMD_CRIO_BESTEFFORT, BESTEFFORT_B, id="v2-systemd-crio"),
        pytest.param(fx.V2_SYSTEMD_DOCKER_BURSTABLE, BURSTABLE_A, id="v2-systemd-docker"),
        pytest.param(fx.V2_CGROUPFS_CONTAINERD_BURSTABLE, BURSTABLE_A, id="v2-cgroupfs-containerd"),
        pytest.param(fx.V2_CGROUPFS_CRIO_BESTEFFORT, BESTEFFORT_B, id="v2-cgroupfs-crio"),
        pytest.param(
            fx.V2_SYSTEMD_STATIC_POD,
            CgroupOwner(fx.STATIC_POD_UID, fx.CONTAINER_C),
            id="static-pod-keeps-its-hash-uid",
        ),
        pytest.param(
            fx.V2_LITERAL_SYSTEMD_PATH, BESTEFFORT_B, id="systemd-cgroups-path-taken-literally"
        ),
        pytest.param(fx.V2_SYSTEMD_CONTAINER_INIT, BURSTABLE_A, id="init-leaf-below-container"),
        pytest.param(
            fx.V2_SYSTEMD_WORKLOAD_SUBTREE, BURSTABLE_A, id="systemd-workload-subtree-and-slash"
        ),
        pytest.param(fx.V2_CGROUPFS_WORKLOAD_SUBTREE, BURSTABLE_A, id="cgroupfs-workload-subtree"),
        pytest.param(fx.V2_KIND_SYSTEMD_BESTEFFORT, BESTEFFORT_B, id="v2-kind-kubelet-slice"),
        pytest.param(fx.V2_KIND_FROM_HOST, BESTEFFORT_B, id="v2-kind-seen-from-host"),
        pytest.param(
            fx.V2_NAMESPACED_SYSTEMD_BURSTABLE, BURSTABLE_A, id="cgroupns-relative-systemd"
        ),
        pytest.param(
            fx.V2_NAMESPACED_CGROUPFS_BESTEFFORT, BESTEFFORT_B, id="cgroupns-relative-cgroupfs"
        ),
    ],
)
def test_container_processes_resolve_to_pod_and_container(text: str, expected: CgroupOwner) -> None:
    assert parse_cgroup(text) == expected


@pytest.mark.parametrize(
    ("text", "pod_uid"),
    [
        pytest.param(fx.V1_SYSTEMD_CRIO_CONMON, fx.BURSTABLE_POD_UID, id="v1-crio-conmon"),
        pytest.param(fx.V2_SYSTEMD_CRIO_CONMON, fx.BESTEFFORT_POD_UID, id="v2-crio-conmon"),
        pytest.param(fx.V2_CGROUPFS_CRIO_CONMON, fx.BESTEFFORT_POD_UID, id="cgroupfs-conmon"),
        pytest.param(fx.V1_CGROUPFS_POD_LEVEL, fx.BURSTABLE_POD_UID, id="v1-pod-cgroup"),
        pytest.param(fx.V2_SYSTEMD_POD_LEVEL, fx.BURSTABLE_POD_UID, id="v2-pod-slice"),
    ],
)
def test_pod_processes_outside_any_container_have_no_container_id(text: str, pod_uid: str) -> None:
    assert parse_cgroup(text) == CgroupOwner(pod_uid, None)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(fx.V1_HOST_SERVICE, id="v1-host-service"),
        pytest.param(fx.V1_DOCKER_OUTSIDE_KUBERNETES, id="v1-plain-docker-container"),
        pytest.param(fx.V2_HOST_SERVICE, id="v2-host-service"),
        pytest.param(fx.V2_HOST_SESSION, id="v2-login-session"),
        pytest.param(fx.V2_HOST_INIT, id="v2-init"),
        pytest.param(fx.V2_KERNEL_THREAD, id="v2-root-cgroup"),
        pytest.param(fx.V2_DOCKER_OUTSIDE_KUBERNETES, id="v2-plain-docker-container"),
        pytest.param(fx.V2_PODMAN, id="podman-container"),
        pytest.param(fx.V2_KUBEPODS_QOS_LEVEL, id="qos-slice-without-pod"),
        pytest.param(fx.V2_NAMESPACED_HOST_SERVICE, id="cgroupns-relative-host-service"),
        pytest.param(fx.V2_NAMESPACED_OWN_CGROUP, id="cgroupns-own-cgroup"),
        pytest.param("", id="empty-file"),
        pytest.param("not a cgroup file\n\n", id="garbage"),
        pytest.param(
            f"0::/pod{fx.BURSTABLE_POD_UID}/{fx.CONTAINER_A}\n", id="pod-like-name-outside-kubepods"
        ),
    ],
)
def test_processes_outside_pods_have_no_owner(text: str) -> None:
    assert parse_cgroup(text) is None


def test_v1_lines_win_over_a_stale_unified_line_in_hybrid_files() -> None:
    # Old Docker (runc < 1.0) never moved containers in the unified hierarchy: "0::" still
    # names containerd's service while every v1 line names the container.
    text = fx.V1_CGROUPFS_CONTAINERD_BESTEFFORT.replace(
        f"0::/kubepods/besteffort/pod{fx.BESTEFFORT_POD_UID}/{fx.CONTAINER_B}",
        f"0::/kubepods/burstable/pod{fx.BURSTABLE_POD_UID}/{fx.CONTAINER_A}",
    )
    assert parse_cgroup(text) == BESTEFFORT_B


def test_memory_line_is_preferred_over_other_v1_lines() -> None:
    text = (
        f"3:cpuset:/kubepods/burstable/pod{fx.BURSTABLE_POD_UID}/{fx.CONTAINER_A}\n"
        f"2:memory:/kubepods/besteffort/pod{fx.BESTEFFORT_POD_UID}/{fx.CONTAINER_B}\n"
        "1:name=systemd:/\n"
    )
    assert parse_cgroup(text) == BESTEFFORT_B


def test_a_pod_only_in_the_unified_line_is_still_found() -> None:
    text = f"2:cpu,cpuacct:/\n1:name=systemd:/\n0::/kubepods/pod{fx.GUARANTEED_POD_UID}/{fx.CONTAINER_C}\n"
    assert parse_cgroup(text) == GUARANTEED_C


# --- /proc/<pid>/stat ------------------------------------------------------------------


@pytest.mark.parametrize(
    "comm",
    [
        pytest.param("python3", id="plain"),
        pytest.param("pt_main thread", id="space"),
        pytest.param("a) (b", id="close-paren-space-open-paren"),
        pytest.param("x) S 1 2 3 ) )", id="fake-fields-inside-the-name"),
        pytest.param("", id="empty"),
    ],
)
def test_stat_start_time_is_read_after_the_last_closing_parenthesis(comm: str) -> None:
    assert parse_stat(stat_line(4242, comm, 8_812_345)) == ProcStat(comm, 8_812_345)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("4242 python3 S 1", id="no-parentheses"),
        pytest.param("4242 (python3) S 1 4242 4242 0 -1", id="truncated"),
        pytest.param(stat_line(1, "x", 5).replace(" 5 ", " five ", 1), id="non-numeric"),
    ],
)
def test_malformed_stat_reads_as_none(text: str) -> None:
    assert parse_stat(text) is None


# --- ProcessTable over a fake /proc ----------------------------------------------------


def _pod(owner: CgroupOwner) -> ProcessOwner:
    return ProcessOwner(OwnerKind.POD, owner.pod_uid, owner.container_id)


def test_process_in_a_container_is_owned_by_its_pod(tmp_path: Path) -> None:
    write_proc(tmp_path, 4242, cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE)
    table = ProcessTable(tmp_path)
    assert table.owner(4242) == _pod(BURSTABLE_A)
    assert table.failures == 0


def test_a_pod_process_says_who_it_is_in_its_own_namespace(tmp_path: Path) -> None:
    """What the memory shim's budget records of it (exporter.shims): read from
    /proc/<pid>/status and stat, world-readable, no capability."""
    write_proc(tmp_path, 4242, cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE, start_time=777)
    write_proc(tmp_path, 4243, cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE)
    (tmp_path / "4242" / "status").write_text("Name:\tpython3\nNSpid:\t4242\t17\nPPid:\t1\n")
    table = ProcessTable(tmp_path)
    owner = table.owner(4242)
    assert (owner.ns_pid, owner.start_time, owner.shim) == (17, 777, None)
    assert owner.container_id == BURSTABLE_A.container_id
    assert table.owner(4243).ns_pid is None  # no status to read


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("NSpid:\t4242\n", 4242),
        ("Name:\tx\nNSpid:\t4242\t88\t17\n", 17),
        ("Name:\tx\n", None),
        ("NSpid:\n", None),
    ],
)
def test_the_innermost_namespace_pid_is_read(status: str, expected: int | None) -> None:
    assert parse_ns_pid(status) == expected


def test_host_process_is_reported_as_host(tmp_path: Path) -> None:
    write_proc(tmp_path, 812, cgroup=fx.V2_HOST_SERVICE, comm="nvidia-persiste")
    assert ProcessTable(tmp_path).owner(812) == ProcessOwner(OwnerKind.HOST)


def test_name_with_spaces_and_parentheses_does_not_break_resolution(tmp_path: Path) -> None:
    write_proc(tmp_path, 4242, cgroup=fx.V1_SYSTEMD_CRIO_BURSTABLE, comm="w) (x y")
    expected = ProcessOwner(OwnerKind.POD, fx.BURSTABLE_POD_UID, fx.CONTAINER_B)
    assert ProcessTable(tmp_path).owner(4242) == expected


def test_answers_are_cached_while_the_start_time_is_unchanged(tmp_path: Path) -> None:
    write_proc(tmp_path, 4242, cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE)
    table = ProcessTable(tmp_path)
    table.owner(4242)
    (tmp_path / "4242" / "cgroup").unlink()
    assert table.owner(4242) == _pod(BURSTABLE_A)


def test_a_reused_pid_with_a_new_start_time_is_read_again(tmp_path: Path) -> None:
    write_proc(tmp_path, 4242, cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE, start_time=100)
    table = ProcessTable(tmp_path)
    assert table.owner(4242) == _pod(BURSTABLE_A)
    write_proc(tmp_path, 4242, cgroup=fx.V2_SYSTEMD_CRIO_BESTEFFORT, start_time=9_000)
    assert table.owner(4242) == _pod(BESTEFFORT_B)


def test_vanished_pid_is_gone_and_counted(tmp_path: Path) -> None:
    write_proc(tmp_path, 4242, cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE)
    table = ProcessTable(tmp_path)
    table.owner(4242)
    for name in ("stat", "cgroup", "cmdline"):
        (tmp_path / "4242" / name).unlink()
    (tmp_path / "4242").rmdir()
    assert table.owner(4242) == ProcessOwner(OwnerKind.GONE)
    assert table.owner(31337) == ProcessOwner(OwnerKind.GONE)
    assert table.failures == 2
    assert len(table) == 0


@pytest.mark.parametrize("pid", [pytest.param(0, id="zero"), pytest.param(-1, id="negative")])
def test_pids_that_cannot_exist_are_gone(tmp_path: Path, pid: int) -> None:
    assert ProcessTable(tmp_path).owner(pid) == ProcessOwner(OwnerKind.GONE)


def test_permission_denied_is_gone_not_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests may run as root, which ignores file modes: deny the read itself.
    write_proc(tmp_path, 4242, cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE)
    read_bytes = Path.read_bytes

    def denied(path: Path) -> bytes:
        if path.name == "cgroup":
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", denied)
    table = ProcessTable(tmp_path)
    assert table.owner(4242) == ProcessOwner(OwnerKind.GONE)
    assert table.failures == 1


def test_pid_reused_while_being_read_is_not_attributed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process exits and its PID is reused between reading stat and reading cgroup:
    # the cgroup text may be the new process's, so neither is answered or cached.
    write_proc(tmp_path, 4242, cgroup=fx.V2_SYSTEMD_CRIO_BESTEFFORT, start_time=100)
    read_bytes = Path.read_bytes

    def reused_during_read(path: Path) -> bytes:
        if path.name == "cgroup":
            (path.parent / "stat").write_text(stat_line(4242, "python3", 9_000))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", reused_during_read)
    table = ProcessTable(tmp_path)
    assert table.owner(4242) == ProcessOwner(OwnerKind.GONE)
    assert len(table) == 0
    monkeypatch.undo()
    assert table.owner(4242) == _pod(BESTEFFORT_B)


def test_unreadable_cgroup_is_not_cached(tmp_path: Path) -> None:
    write_proc(tmp_path, 4242, cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE)
    (tmp_path / "4242" / "cgroup").unlink()
    (tmp_path / "4242" / "cgroup").mkdir()  # reading it fails with IsADirectoryError
    table = ProcessTable(tmp_path)
    assert table.owner(4242) == ProcessOwner(OwnerKind.GONE)
    (tmp_path / "4242" / "cgroup").rmdir()
    (tmp_path / "4242" / "cgroup").write_text(fx.V2_SYSTEMD_CONTAINERD_BURSTABLE)
    assert table.owner(4242) == _pod(BURSTABLE_A)


@pytest.mark.parametrize(
    ("cgroup", "expected_pod", "expected_container"),
    [
        pytest.param(
            fx.V2_SYSTEMD_CONTAINERD_BURSTABLE,
            fx.BURSTABLE_POD_UID,
            fx.CONTAINER_A,
            id="daemon-in-a-pod",
        ),
        pytest.param(fx.V2_HOST_SERVICE, None, None, id="daemon-on-the-host"),
    ],
)
@pytest.mark.parametrize(
    "cmdline",
    [
        pytest.param("nvidia-cuda-mps-server\0", id="argv0-name"),
        pytest.param("/usr/bin/nvidia-cuda-mps-server\0", id="argv0-path"),
        pytest.param("", id="cmdline-empty"),
    ],
)
def test_mps_server_is_flagged_and_keeps_its_pod(
    tmp_path: Path,
    cgroup: str,
    expected_pod: str | None,
    expected_container: str | None,
    cmdline: str,
) -> None:
    # The kernel keeps 15 bytes of the name: "nvidia-cuda-mps-server" reads "nvidia-cuda-mps".
    write_proc(tmp_path, 977, cgroup=cgroup, comm="nvidia-cuda-mps", cmdline=cmdline)
    expected = ProcessOwner(OwnerKind.MPS_SERVER, expected_pod, expected_container)
    assert ProcessTable(tmp_path).owner(977) == expected


def test_mps_control_daemon_is_not_the_server(tmp_path: Path) -> None:
    write_proc(
        tmp_path,
        976,
        cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE,
        comm="nvidia-cuda-mps",
        cmdline="nvidia-cuda-mps-control\0-d\0",
    )
    assert ProcessTable(tmp_path).owner(976) == _pod(BURSTABLE_A)


def test_cache_keeps_the_most_recently_used_entries(tmp_path: Path) -> None:
    for pid in (1001, 1002, 1003):
        write_proc(tmp_path, pid, cgroup=fx.V2_SYSTEMD_CONTAINERD_BURSTABLE)
    table = ProcessTable(tmp_path, max_entries=2)
    table.owner(1001)
    table.owner(1002)
    table.owner(1001)  # now more recent than 1002
    table.owner(1003)  # evicts 1002
    assert len(table) == 2
    for pid in (1001, 1002):
        (tmp_path / str(pid) / "cgroup").unlink()
    assert table.owner(1001) == _pod(BURSTABLE_A)  # still cached
    assert table.owner(1002) == ProcessOwner(OwnerKind.GONE)  # evicted, read again


def test_forget_missing_drops_entries_of_dead_pids(tmp_path: Path) -> None:
    for pid in (1001, 1002, 1003):
        write_proc(tmp_path, pid, cgroup=fx.V2_HOST_SERVICE)
    table = ProcessTable(tmp_path)
    for pid in (1001, 1002, 1003):
        table.owner(pid)
    assert table.forget_missing([1002]) == 2
    assert len(table) == 1


def test_cache_bound_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_entries: must be at least 1, got 0"):
        ProcessTable(tmp_path, max_entries=0)
