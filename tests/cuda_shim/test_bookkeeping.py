"""The shim's bookkeeping under what programs do to it: addresses the driver hands out
again at once, millions of allocations, threads and processes at once, a fork without
exec, a process stopped or killed at any moment, a context made while a neighbour
allocates. Each ends with the budget equal to what the device holds."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from doubles.shim_build import Build
from tests.cuda_shim.harness import CONTEXT, GIB, LIMIT, MIB, OK, OOM, Pod, Run

SHARE = 8 * GIB


@pytest.mark.parametrize("mode", ["linked", "gpa"])
def test_a_free_racing_an_allocation_that_reuses_its_address_leaks_nothing(
    built: Build, tmp_path: Path, mode: str
) -> None:
    """Two threads doing 20,000 alloc/free pairs of up to 16 MiB: the fake driver hands a
    freed address out again at once, as the real one does."""
    pod = Pod(built, tmp_path, limit=SHARE)
    run = pod.probe(mode, "ctx", f"hammer:2:20000:{16 * MIB}", "info", "used")
    assert run.value("hammer", "refused") == 0
    assert run.value("hammer", "failed_frees") == 0
    assert run.value("info", "free") == SHARE - CONTEXT  # nothing left charged
    assert run.value("used", "bytes") == CONTEXT


def test_the_shims_records_stay_as_small_as_what_is_live(pod: Pod) -> None:
    """A million stream-ordered pairs leave the process as large as a thousand did."""
    run = pod.probe("gpa", "ctx", "abench:1000:4096", "rss", "abench:1000000:4096", "rss", "info")
    before, after = run.value("rss", "peak_kib"), run.value("rss", "peak_kib", 1)
    assert after - before < 4096, (before, after)  # the old table grew 20 MiB here
    assert run.value("info", "free") == LIMIT - CONTEXT


def test_many_processes_and_threads_with_address_reuse_end_with_the_budget_the_device_holds(
    built: Build, tmp_path: Path
) -> None:
    pod = Pod(built, tmp_path, limit=512 * MIB)
    # Contexts are charged even past the share (one cannot be refused): none here, so the
    # device's peak is the allocations' alone.
    quiet = {"FAKE_CUDA_CONTEXT": "0", "GPUPACK_CUDA_QUIET": "1"}
    holder = pod.start("dlsym", "ctx", f"alloc:{64 * MIB}", **quiet)
    try:
        procs = [
            subprocess.Popen(
                [str(built.probe), mode, "ctx", f"hammer:8:500:{40 * MIB}", "info"],
                env=pod.env(extra=quiet),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for mode in ("linked", "dlsym", "gpa", "gpa-ptds")
        ]
        outputs = [proc.communicate(timeout=300) for proc in procs]
        assert all(proc.returncode == 0 for proc in procs), outputs
        beside = pod.probe(
            "linked", "ctx", "info", "used", "peak", FAKE_CUDA_CONTEXT="0", GPUPACK_CUDA_QUIET="1"
        )
        budget = pod.budget()
    finally:
        pod.kill(holder)
    assert sum(int(out.split("refused=")[1].split()[0]) for out, _ in outputs) > 0  # contended
    assert all("failed_frees=0" in out for out, _ in outputs)
    assert beside.value("peak", "bytes") <= 512 * MIB  # never more than the share
    used = beside.value("used", "bytes")
    assert used == 64 * MIB
    assert 512 * MIB - beside.value("info", "free") == used  # the budget is the device
    assert budget.held(budget.gpus[0]) >= used  # dead hammers' slots are zeroed when needed


FORKED = """
import ctypes, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1"); cuda.cuInit(0)
ctx = ctypes.c_void_p(); cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
p = ctypes.c_ulonglong(); cuda.cuMemAlloc_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
assert cuda.cuMemAlloc_v2(ctypes.byref(p), 600 << 20) == 0
if os.fork() == 0:  # a worker that never execs and never touches CUDA
    time.sleep(60)
    os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_fork_child_does_not_keep_its_parents_slot(pod: Pod) -> None:
    parent = subprocess.Popen(
        ["python3", "-c", FORKED], env=pod.env(), stdout=subprocess.PIPE, text=True
    )
    children: list[str] = []
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "ready"
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        assert children
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        # The child lives on; what the dead parent held is the pod's again.
        after = pod.probe("linked", "ctx", "info", f"alloc:{800 * MIB}")
    finally:
        for child in children:
            os.kill(int(child), signal.SIGKILL)
        parent.kill()
        parent.communicate()
    assert after.value("info", "free") == LIMIT - CONTEXT
    assert after.rc(f"alloc:{800 * MIB}") == OK


def test_a_fork_child_that_uses_the_shim_gets_a_slot_of_its_own(pod: Pod) -> None:
    source = (
        "import ctypes, os\n"
        "cuda = ctypes.CDLL('libcuda.so.1'); cuda.cuInit(0)\n"
        "p = ctypes.c_ulonglong(); cuda.cuMemAlloc_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t]\n"
        "assert cuda.cuMemAlloc_v2(ctypes.byref(p), 600 << 20) == 0\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(cuda.cuMemAlloc_v2(ctypes.byref(p), 600 << 20))\n"
        "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    assert pod.python(source).strip() == str(OOM)  # the parent's 600 MiB still count


@pytest.mark.parametrize("moment", [0.0, 0.05, 0.2])
def test_a_process_stopped_at_any_moment_stalls_no_other(pod: Pod, moment: float) -> None:
    """SIGSTOP (a debugger) in the middle of its allocations: the others go on."""
    pod.set_limit(SHARE)
    hammer = subprocess.Popen(
        [str(pod.build.probe), "linked", "ctx", f"hammer:4:1000000:{64 * MIB}"],
        env=pod.env(extra={"GPUPACK_CUDA_QUIET": "1"}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3 + moment)
        hammer.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        other = pod.probe("gpa", "ctx", f"alloc:{GIB}", "info")  # a timeout here is the bug
        took = time.monotonic() - started
    finally:
        hammer.kill()
        hammer.wait()
    assert other.rc(f"alloc:{GIB}") == OK
    assert took < 60  # a deadline, not a measurement: the old shim waited forever
    # What the stopped process held, or was taking, counted meanwhile; now it is back.
    after = pod.probe("linked", "ctx", "info")
    assert after.value("info", "free") == SHARE - CONTEXT


def context_beside_a_burst(built: Build, tmp_path: Path, *neighbour_ops: str) -> tuple[Run, int]:
    """A pod's process makes its first context (slowly), while a neighbour (another pod,
    no limit) runs `neighbour_ops` on the same device: its run, and the free memory the
    pod's process then sees."""
    pod = Pod(built, tmp_path / "pod", limit=SHARE)
    neighbour = Pod(built, tmp_path / "neighbour", limit=None)
    device = str(tmp_path / "device")
    maker = subprocess.Popen(
        [str(built.probe), "linked", "ctx", "info", "hold"],
        env=pod.env(extra={"FAKE_CUDA_STATE": device, "FAKE_CUDA_CONTEXT_DELAY_MS": "400"}),
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.15)
    burst = neighbour.probe("linked", *neighbour_ops, "hold-briefly", FAKE_CUDA_STATE=device)
    assert maker.stdout is not None
    info = next(line for line in maker.stdout if line.startswith("info"))
    maker.kill()
    maker.communicate()
    return burst, int(info.split("free=")[1].split()[0])


def test_a_context_is_charged_what_its_process_holds_not_what_a_neighbour_took(
    built: Build, tmp_path: Path
) -> None:
    """A neighbour allocates 6 GiB while this pod's context is made."""
    burst, free = context_beside_a_burst(built, tmp_path, f"alloc:{6 * GIB}")
    assert burst.rc(f"alloc:{6 * GIB}") == OK
    assert free == SHARE - CONTEXT  # its own NVML line: exact


def test_a_context_measured_beside_a_stranger_is_charged_at_most_the_cap(
    built: Build, tmp_path: Path
) -> None:
    """Two processes appear on the device at once: NVML cannot say which is this one, and
    the device's growth (a 6 GiB burst in it) is capped at 1 GiB."""
    burst, free = context_beside_a_burst(built, tmp_path, "ctx", f"alloc:{6 * GIB}")
    assert burst.rc(f"alloc:{6 * GIB}") == OK
    assert free == SHARE - GIB  # the cap: not the 6 GiB the neighbour took


def test_when_every_slot_is_taken_a_process_is_refused_and_sees_nothing_free(pod: Pod) -> None:
    """The 1,025th process of a pod: it cannot be counted, so it is given nothing."""
    pod.probe("linked", "ctx")  # makes and stamps the budget
    locker = subprocess.Popen(
        ["python3", "-c", SLOT_LOCKER, str(pod.directory / "budget")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None
        assert locker.stdout.readline().strip() == "locked"
        run = pod.probe("linked", "ctx", "info", f"alloc:{MIB}", "total")
    finally:
        locker.kill()
        locker.communicate()
    assert run.value("info", "free") == 0
    assert run.value("info", "total") == LIMIT
    assert run.rc(f"alloc:{MIB}") == OOM
    assert "all 1024 slots are taken" in run.stderr


# Holds an open-file-description lock on every slot of a budget, as 1,024 live processes.
SLOT_LOCKER = """
import fcntl, struct, sys, time
F_OFD_SETLK = 37
fd = open(sys.argv[1], "r+b")
for i in range(1024):
    fcntl.fcntl(fd, F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 4096 + 64 * i, 64, 0))
print("locked", flush=True)
time.sleep(120)
"""
