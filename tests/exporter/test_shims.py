"""Which pod GPU processes run the memory shim: the pure marking, and the whole path with
the real shim writing a pod's budget, the node agent's roster serving it, and the
exporter's client asking it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from doubles.shim_build import Build
from exporter.cgroup import OwnerKind, ProcessOwner, parse_stat
from exporter.shims import RosterClient, mark
from node import shim_roster
from tests.cuda_shim.harness import Pod


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Build:
    return Build(tmp_path_factory.mktemp("shim")).make()


UID = "5b1c0d3e-0000-4000-8000-000000000001"
OTHER = "5b1c0d3e-0000-4000-8000-000000000002"


def pod_process(uid: str, ns_pid: int | None, start: int) -> ProcessOwner:
    return ProcessOwner(OwnerKind.POD, uid, "c" * 64, ns_pid=ns_pid, start_time=start)


def test_a_process_is_loaded_when_its_pods_budget_records_it() -> None:
    asked: list[str] = []

    def roster(uid: str) -> frozenset[tuple[int, int]] | None:
        asked.append(uid)
        return frozenset({(17, 500)}) if uid == UID else None

    owners = {
        100: pod_process(UID, 17, 500),
        101: pod_process(UID, 17, 999),  # the PID again, another process: missing
        102: pod_process(UID, 18, 500),
        103: pod_process(UID, None, 500),  # its status unread: unknown
        104: pod_process(OTHER, 17, 500),  # its roster cannot say: unknown
        105: ProcessOwner(OwnerKind.HOST),
    }
    marked = mark(owners, roster)
    assert [marked[pid].shim for pid in range(100, 105)] == [True, False, False, None, None]
    assert marked[105] == owners[105]
    assert sorted(asked) == [UID, OTHER]  # once a pod


def start_time(pid: int) -> int:
    stat = parse_stat(Path(f"/proc/{pid}/stat").read_text())
    assert stat is not None
    return stat.start_time


def test_the_roster_tells_the_shims_processes_from_others_without_reading_them(
    built: Build, tmp_path: Path
) -> None:
    pods_dir = tmp_path / "pods"
    directory = shim_roster.budget_path(pods_dir, UID).parent
    pod = Pod(built, tmp_path / "device-root")
    directory.mkdir(parents=True)
    (directory / "limit").write_text(f"{1 << 30}\n")
    holder = subprocess.Popen(
        [str(built.probe), "linked", "ctx", "alloc:1048576", "hold"],
        env={**pod.env(), "GPUPACK_CUDA_DIR": str(directory)},
        stdout=subprocess.PIPE,
        text=True,
    )
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = shim_roster.serve(tmp_path / "agent" / "shims.sock", pods_dir)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ctx rc=0"
        holder.stdout.readline()
        client = RosterClient(tmp_path / "agent" / "shims.sock")
        owners = {
            holder.pid: pod_process(UID, holder.pid, start_time(holder.pid)),
            bare.pid: pod_process(UID, bare.pid, start_time(bare.pid)),
            1: pod_process(OTHER, 1, start_time(1)),  # a pod without a budget
        }
        marked = mark(owners, client)
        mode = os.stat(tmp_path / "agent" / "shims.sock").st_mode & 0o777
    finally:
        server.shutdown()
        server.server_close()
        for process in (holder, bare):
            process.kill()
            process.communicate()
    assert marked[holder.pid].shim is True
    assert marked[bare.pid].shim is False
    assert marked[1].shim is False
    assert mode & 0o077 == 0  # root's alone


def test_a_roster_that_cannot_be_asked_says_unknown(tmp_path: Path) -> None:
    owners = {7: pod_process(UID, 7, 1)}
    assert mark(owners, RosterClient(tmp_path / "nothing.sock"))[7].shim is None
