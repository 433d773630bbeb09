"""Every way a process holds device memory beyond cuMemAlloc, charged as the driver holds
it: VMM handles by their references and mappings, pools by what they keep, graph memory
as the driver reserves it, the device heap and stack, module globals; host memory not at
all; the old ABI; and a budget per device. Each case drives the fake driver, whose
`used` is what the device really holds, and the issue's reproductions (8 GiB share) are
named so."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from doubles.shim_build import Build
from tests.cuda_shim.harness import CONTEXT, GIB, GPU0, MIB, OK, OOM, Pod, Run, cubin, fake_module

SHARE = 8 * GIB
KEEP_ALL = str((1 << 64) - 1)  # PyTorch's backend:cudaMallocAsync release threshold


@pytest.fixture
def pod(built: Build, tmp_path: Path) -> Pod:
    return Pod(built, tmp_path, limit=SHARE)


def free_after(run: Run, nth: int) -> int:
    return run.value("info", "free", nth)


# ---- VMM ----


@pytest.mark.parametrize("mode", ["linked", "gpa"])
def test_handles_released_while_mapped_stay_charged_until_unmapped(pod: Pod, mode: str) -> None:
    """Four rounds of create 6 GiB, map, release (NVIDIA's sample pattern)."""
    rounds = [op for n in range(4) for op in (f"vmm:{6 * GIB}=r{n}", f"release:r{n}")]
    run = pod.probe(mode, "ctx", *rounds, "used", "peak", "unmap:r0", "info", "used")
    assert run.rc(f"vmm:{6 * GIB}=r0") == OK
    assert [run.rc(f"vmm:{6 * GIB}=r{n}") for n in (1, 2, 3)] == [OOM] * 3
    assert run.value("used", "bytes") == CONTEXT + 6 * GIB
    assert run.value("peak", "bytes") <= SHARE
    assert run.value("info", "free") == SHARE - CONTEXT  # the last unmap gave it back
    assert run.value("used", "bytes", 1) == CONTEXT


def test_a_retained_handle_keeps_its_memory_charged_until_its_last_release(pod: Pod) -> None:
    run = pod.probe(
        "gpa",
        "ctx",
        f"vmm:{2 * GIB}=r",
        "retain:r",
        "release:r",
        "unmap:r",
        "info",
        "used",
        "release:r",
        "info",
        "used",
    )
    assert run.rc("retain:r") == OK
    assert free_after(run, 0) == SHARE - CONTEXT - 2 * GIB
    assert run.value("used", "bytes") == CONTEXT + 2 * GIB
    assert free_after(run, 1) == SHARE - CONTEXT
    assert run.value("used", "bytes", 1) == CONTEXT


def test_an_exported_allocation_stays_charged_while_another_process_may_hold_it(pod: Pod) -> None:
    run = pod.probe(
        "linked", "ctx", f"vmm:{2 * GIB}=r", "export:r", "unmap:r", "release:r", "info", "used"
    )
    assert run.rc("release:r") == OK
    assert free_after(run, 0) == SHARE - CONTEXT - 2 * GIB
    assert run.value("used", "bytes") == CONTEXT + 2 * GIB  # the device holds it yet


def test_an_imported_allocation_is_charged_to_the_process_that_maps_it(pod: Pod) -> None:
    exporter = pod.start("linked", "ctx", f"vmm:{5 * GIB}=r", "export:r")
    try:
        assert exporter.stdout is not None
        path = f"/proc/{exporter.pid}/fd/{_exported_fd(pod, exporter)}"
        importer = pod.probe("linked", "ctx", f"importfd:{path}=s", "info", "used")
        # 5 GiB mapped beside the exporter's 5 GiB would pass the 8 GiB share: refused,
        # though the device would hold nothing more (shared memory counts in both).
        assert importer.rc(f"importfd:{path}=s") == OOM
        assert importer.value("used", "bytes") == 2 * CONTEXT + 5 * GIB
        pod.set_limit(16 * GIB)
        importer = pod.probe(
            "linked", "ctx", f"importfd:{path}=s", "info", "unmap:s", "release:s", "info"
        )
        assert importer.rc(f"importfd:{path}=s") == OK
        assert free_after(importer, 0) == 16 * GIB - 2 * CONTEXT - 10 * GIB
        assert free_after(importer, 1) == 16 * GIB - 2 * CONTEXT - 5 * GIB
    finally:
        pod.kill(exporter)


def _exported_fd(pod: Pod, process: "subprocess.Popen[str]") -> int:
    """The fd the holder printed before it held (its lines up to 'holding' were read)."""
    del pod
    fds = sorted(int(name) for name in os.listdir(f"/proc/{process.pid}/fd"))
    for fd in fds:
        if "fake-cuda-allocation" in os.readlink(f"/proc/{process.pid}/fd/{fd}"):
            return fd
    raise AssertionError("the exporter holds no exported allocation")


def test_host_located_vmm_memory_is_not_charged(pod: Pod) -> None:
    run = pod.probe("linked", "ctx", f"hostcreate:{9 * GIB}", "info")
    assert run.rc(f"hostcreate:{9 * GIB}") == OK
    assert free_after(run, 0) == SHARE - CONTEXT


# ---- pools ----


@pytest.mark.parametrize("mode", ["linked", "gpa-ptds"])
def test_a_pool_that_keeps_freed_memory_is_charged_for_it(pod: Pod, mode: str) -> None:
    """A freed 7 GiB kept in the pool (release threshold: the most), then cuMemAlloc 7 GiB."""
    run = pod.probe(
        mode,
        "ctx",
        f"threshold:{KEEP_ALL}",
        f"async:{7 * GIB}",
        "free",
        "sync",
        "info",
        f"alloc:{7 * GIB}",
        f"async:{7 * GIB}",
        "used",
        "peak",
        "free",
        "sync",
        "trim:0",
        "info",
        f"alloc:{7 * GIB}",
    )
    assert free_after(run, 0) == SHARE - CONTEXT - 7 * GIB  # kept: still the pod's
    assert run.rc(f"alloc:{7 * GIB}") == OOM
    assert run.rc(f"async:{7 * GIB}", 1) == OK  # the pool's kept memory serves it
    assert run.value("used", "bytes") == CONTEXT + 7 * GIB
    assert run.value("peak", "bytes") <= SHARE
    assert free_after(run, 1) == SHARE - CONTEXT  # trimmed: given back
    assert run.rc(f"alloc:{7 * GIB}", 1) == OK


def test_a_pool_with_the_default_threshold_gives_memory_back_as_it_is_freed(pod: Pod) -> None:
    run = pod.probe("linked", "ctx", f"async:{7 * GIB}", "free", "sync", "info", f"alloc:{7 * GIB}")
    assert free_after(run, 0) == SHARE - CONTEXT
    assert run.rc(f"alloc:{7 * GIB}") == OK


def test_a_created_pool_with_a_threshold_is_charged_what_it_keeps(pod: Pod) -> None:
    run = pod.probe(
        "gpa", "ctx", f"pthreshold:{4 * GIB}", f"pool:{6 * GIB}", "free", "sync", "info", "used"
    )
    assert free_after(run, 0) == SHARE - CONTEXT - 4 * GIB  # keeps up to its threshold
    assert run.value("used", "bytes") == CONTEXT + 4 * GIB


def test_lowering_a_threshold_gives_back_what_the_pool_will_not_keep(pod: Pod) -> None:
    run = pod.probe(
        "linked",
        "ctx",
        f"threshold:{KEEP_ALL}",
        f"async:{4 * GIB}",
        "free",
        "sync",
        "info",
        "threshold:0",
        "sync",
        "info",
        "used",
    )
    assert free_after(run, 0) == SHARE - CONTEXT - 4 * GIB
    assert free_after(run, 1) == SHARE - CONTEXT
    assert run.value("used", "bytes") == CONTEXT


def test_a_pool_located_on_the_host_is_not_charged(pod: Pod) -> None:
    """A 9 GiB host pool and 9 GiB of host-attached managed memory under an 8 GiB share."""
    run = pod.probe("linked", "ctx", f"hostpool:{9 * GIB}", f"managedhost:{9 * GIB}", "info")
    assert run.rc(f"hostpool:{9 * GIB}") == OK
    assert run.rc(f"managedhost:{9 * GIB}") == OK
    assert free_after(run, 0) == SHARE - CONTEXT


# ---- graphs ----


@pytest.mark.parametrize("mode", ["linked", "dlsym", "gpa"])
def test_graph_memory_is_charged_as_the_driver_reserves_it(pod: Pod, mode: str) -> None:
    run = pod.probe(
        mode,
        "ctx",
        f"graph:{16 * GIB}=big",
        "launch:big",
        "used",
        f"graph:{4 * GIB}=g",
        "launch:g",
        "info",
        "used",
        "launch:g",
        "drop:g",
        "info",
        "graphtrim",
        "info",
        "used",
    )
    assert run.rc("launch:big") == OOM  # refused before it ran: the device took nothing
    assert run.value("used", "bytes") == CONTEXT
    assert run.rc("launch:g") == OK
    assert free_after(run, 0) == SHARE - CONTEXT - 4 * GIB
    assert run.value("used", "bytes", 1) == CONTEXT + 4 * GIB
    assert free_after(run, 1) == SHARE - CONTEXT - 4 * GIB  # reserved until a trim
    assert free_after(run, 2) == SHARE - CONTEXT
    assert run.value("used", "bytes", 2) == CONTEXT


def test_a_child_graph_s_allocations_count(pod: Pod) -> None:
    run = pod.probe(
        "gpa", "ctx", f"child:{9 * GIB}=big", "launch:big", f"child:{3 * GIB}=c", "launch:c", "info"
    )
    assert run.rc("launch:big") == OOM
    assert free_after(run, 0) == SHARE - CONTEXT - 3 * GIB


def test_an_uploaded_graph_is_charged_at_upload(pod: Pod) -> None:
    run = pod.probe("linked", "ctx", f"graph:{3 * GIB}=g", "upload:g", "info", "used")
    assert run.rc("upload:g") == OK
    assert free_after(run, 0) == SHARE - CONTEXT - 3 * GIB
    assert run.value("used", "bytes") == CONTEXT + 3 * GIB


def test_a_captured_allocation_is_checked_at_capture_and_charged_at_launch(pod: Pod) -> None:
    run = pod.probe(
        "gpa-ptds",
        "ctx",
        f"capture:{16 * GIB}=big",
        f"capture:{6 * GIB}=k",
        "info",
        "launch:k",
        "info",
        f"alloc:{3 * GIB}",
        "used",
    )
    assert run.rc(f"capture:{16 * GIB}=big") == OOM  # its allocation could never fit
    assert free_after(run, 0) == SHARE - CONTEXT  # a capture takes nothing yet
    assert run.rc("launch:k") == OK
    assert free_after(run, 1) == SHARE - CONTEXT - 6 * GIB
    assert run.rc(f"alloc:{3 * GIB}") == OOM
    assert run.value("used", "bytes") == CONTEXT + 6 * GIB


# ---- the device heap and stack, module globals ----


def test_the_device_heap_is_charged_when_it_is_set(pod: Pod) -> None:
    run = pod.probe(
        "linked",
        "ctx",
        f"heap:{16 * GIB}",
        f"heap:{GIB}",
        "info",
        "kernel",
        "used",
        f"heap:{8 * MIB}",
        "info",
        "kernel",
        "used",
    )
    assert run.rc(f"heap:{16 * GIB}") == OOM
    assert free_after(run, 0) == SHARE - CONTEXT - (GIB - 8 * MIB)  # above the default 8 MiB
    assert run.value("used", "bytes") == CONTEXT + GIB - 8 * MIB  # reserved at the launch
    assert free_after(run, 1) == SHARE - CONTEXT
    assert run.value("used", "bytes", 1) == CONTEXT


def test_the_stack_is_charged_for_every_thread_the_device_runs(pod: Pod) -> None:
    threads = 132 * 2048  # the fake device's multiprocessors x threads each
    run = pod.probe("gpa", "ctx", "stack:100000", "stack:4096", "info", "kernel", "used")
    assert run.rc("stack:100000") == OOM  # 100,000 bytes x 270,336 threads: 25 GiB
    assert free_after(run, 0) == SHARE - CONTEXT - (4096 - 1024) * threads
    assert run.value("used", "bytes") == CONTEXT + (4096 - 1024) * threads


@pytest.mark.parametrize("how", ["moduledata", "module", "library"])
def test_module_globals_a_cubin_declares_are_refused_in_advance(
    pod: Pod, tmp_path: Path, how: str
) -> None:
    big, small = tmp_path / "big.cubin", tmp_path / "small.cubin"
    big.write_bytes(cubin(16 * GIB))
    small.write_bytes(cubin(GIB))
    run = pod.probe(
        "linked", "ctx", f"{how}:{big}", "used", f"{how}:{small}", "info", "free", "info"
    )
    assert run.rc(f"{how}:{big}") == OOM
    assert run.value("used", "bytes") == CONTEXT  # the driver was never asked
    assert free_after(run, 0) == SHARE - CONTEXT - GIB
    assert free_after(run, 1) == SHARE - CONTEXT  # unloaded: given back


def test_module_globals_only_the_driver_knows_are_measured(pod: Pod, tmp_path: Path) -> None:
    two, sixteen = tmp_path / "two.ptx", tmp_path / "sixteen.ptx"
    two.write_bytes(fake_module(2 * GIB))
    sixteen.write_bytes(fake_module(16 * GIB))
    run = pod.probe("gpa", "ctx", f"moduledata:{two}", "info", f"moduledata:{sixteen}", "used")
    assert free_after(run, 0) == SHARE - CONTEXT - 2 * GIB  # this process's own NVML line
    assert run.rc(f"moduledata:{sixteen}") == OOM  # measured past the share: unloaded
    assert run.value("used", "bytes") == CONTEXT + 2 * GIB


# ---- the old ABI and several devices ----


def test_the_old_abi_sees_and_is_held_to_the_share(built: Build, tmp_path: Path) -> None:
    pod = Pod(built, tmp_path, limit=GIB)
    run = pod.probe(
        "gpa", "ctx", "info1", "total1", f"alloc1:{2 * GIB}", f"alloc1:{512 * MIB}", "info1"
    )
    assert run.value("info1", "total") == GIB
    assert run.value("info1", "free") == GIB - CONTEXT
    assert run.rc(f"alloc1:{2 * GIB}") == OOM
    assert run.rc(f"alloc1:{512 * MIB}") == OK
    assert run.value("info1", "free", 1) == GIB - CONTEXT - 512 * MIB
    assert run.value("total1", "total") == GIB


NVML_DEVICES = """
import ctypes, json
class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
nvml = ctypes.CDLL("libnvidia-ml.so.1")
nvml.nvmlInit_v2()
seen = []
for index in range(2):
    device, memory = ctypes.c_void_p(), Memory()
    nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(device))
    nvml.nvmlDeviceGetMemoryInfo(device, ctypes.byref(memory))
    seen.append([memory.total, memory.free, memory.used])
print(json.dumps(seen))
"""


def test_each_device_has_its_own_budget_and_total(built: Build, tmp_path: Path) -> None:
    pod = Pod(built, tmp_path, limit=GIB)
    holder = pod.start(
        "gpa",
        "device:0",
        f"alloc:{700 * MIB}",
        "device:1",
        f"alloc:{200 * MIB}",
        FAKE_CUDA_DEVICES="2",
    )
    try:
        run = pod.probe(
            "dlsym",
            "device:1",
            "info",
            f"alloc:{600 * MIB}",
            "device:0",
            "info",
            f"alloc:{700 * MIB}",
            "total",
            FAKE_CUDA_DEVICES="2",
        )
        nvml = json.loads(pod.python(NVML_DEVICES, FAKE_CUDA_DEVICES="2"))
        budget = pod.budget()
    finally:
        pod.kill(holder)
    assert run.value("info", "free") == GIB - 2 * CONTEXT - 200 * MIB  # device 1's own
    assert run.rc(f"alloc:{600 * MIB}") == OK  # fits on device 1
    assert run.value("info", "free", 1) == GIB - 2 * CONTEXT - 700 * MIB  # device 0's
    assert run.rc(f"alloc:{700 * MIB}") == OOM
    assert run.value("total", "total") == GIB
    assert [total for total, _, _ in nvml] == [GIB, GIB]
    assert [used for _, _, used in nvml] == [CONTEXT + 700 * MIB, CONTEXT + 200 * MIB]
    assert len(budget.gpus) == 2
    assert budget.gpus[0] == GPU0
    holders = [s for s in budget.slots if s.pid == holder.pid]
    assert holders
    assert holders[0].gpus == frozenset(budget.gpus)
    assert holders[0].held == {
        budget.gpus[0]: CONTEXT + 700 * MIB,
        budget.gpus[1]: CONTEXT + 200 * MIB,
    }
