"""libgpupack-cuda.so against a fake CUDA driver and NVML with real bookkeeping: the
allocations every framework makes, what the pod sees, how the driver is reached, what the
shim says, and the whole of it under the sanitizers. The other ways memory is held are in
test_memory_kinds.py; the bookkeeping under races, forks and kills in test_bookkeeping.py;
the shim's safety in every process in test_safety.py (harness.py: the pretend pod)."""

import json
import subprocess
from pathlib import Path

import pytest

from doubles.shim_build import Build
from tests.cuda_shim.harness import CONTEXT, GIB, LIMIT, MIB, MODES, OK, OOM, Pod

# Every way an application takes device memory, with what it takes beyond its argument.
ALLOCATIONS = {
    "alloc": ("alloc:{n}", 0),
    "managed": ("managed:{n}", 0),
    "async": ("async:{n}", 0),
    "pool": ("pool:{n}", 0),
    "vmm": ("create:{n}", 0),
    "old-abi": ("alloc1:{n}", 0),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(ALLOCATIONS))
def test_each_allocation_is_counted_limited_and_given_back(pod: Pod, mode: str, kind: str) -> None:
    op = ALLOCATIONS[kind][0]
    big, small = (LIMIT - CONTEXT) // 2 + MIB, 100 * MIB
    run = pod.probe(
        mode,
        "ctx",
        op.format(n=big),
        op.format(n=big),
        op.format(n=small),
        "info",
        "free",
        "free",
        "info",
        op.format(n=big),
        "peak",
    )
    first, second, third = (op.format(n=n) for n in (big, big, small))
    assert run.rc(first) == OK
    assert run.rc(second, 0 if second != first else 1) == OOM  # the context and one half fill it
    assert run.rc(third) == OK
    assert run.value("info", "free") == LIMIT - CONTEXT - big - small
    assert run.value("info", "free", 1) == LIMIT - CONTEXT  # both frees gave back
    assert run.rc(first, 2 if first == second else 1) == OK
    assert run.value("peak", "bytes") <= LIMIT  # what the fake device really held at most
    assert "refused" in run.stderr
    assert "gpupack.io/gpu-memory" in run.stderr


@pytest.mark.parametrize("mode", MODES)
def test_pitched_and_array_allocations_count_what_the_driver_lays_out(pod: Pod, mode: str) -> None:
    run = pod.probe(
        mode,
        "ctx",
        "pitch:1000:1000",
        "info",
        "free",
        "array:4096:4096",
        "info",
        "free",
        "array3d:512:512:512",
        "info",
        "free",
        "mipmap:1024:1024:1",
        "info",
        "free",
        "info",
    )
    base = LIMIT - CONTEXT
    assert run.value("info", "free") == base - 1024 * 1000  # the fake's pitch is 1024 bytes
    assert run.value("info", "free", 1) == base - 64 * MIB  # 4096 x 4096 x float
    assert run.value("info", "free", 2) == base - 512 * MIB
    assert run.value("info", "free", 3) <= base - 4 * MIB  # mipmap levels: up to 4/3
    assert run.value("info", "free", 4) == base


def test_an_array_past_the_limit_is_refused(pod: Pod) -> None:
    run = pod.probe("gpa", "ctx", "array3d:1024:1024:512", "info")  # 2 GiB of floats
    assert run.rc("array3d:1024:1024:512") == OOM
    assert run.value("info", "free") == LIMIT - CONTEXT


def test_host_memory_from_the_vmm_api_is_not_counted(pod: Pod) -> None:
    run = pod.probe("linked", "ctx", f"hostcreate:{2 * GIB}", "info")
    assert run.rc(f"hostcreate:{2 * GIB}") == OK
    assert run.value("info", "free") == LIMIT - CONTEXT


@pytest.mark.parametrize("mode", MODES)
def test_the_pod_sees_its_share_as_the_device(pod: Pod, mode: str) -> None:
    run = pod.probe(mode, "ctx", "info", "total", f"alloc:{256 * MIB}", "info")
    assert run.value("info", "total") == LIMIT
    assert run.value("total", "total") == LIMIT
    assert run.value("info", "free") == LIMIT - CONTEXT
    assert run.value("info", "free", 1) == LIMIT - CONTEXT - 256 * MIB


def test_free_is_never_more_than_the_device_really_has(pod: Pod) -> None:
    run = pod.probe("gpa", "ctx", "info", "total", FAKE_CUDA_TOTAL=str(512 * MIB))
    assert run.value("info", "total") == 512 * MIB
    assert run.value("total", "total") == 512 * MIB
    assert run.value("info", "free") == 512 * MIB - CONTEXT


NVML_READER = """
import ctypes, json
class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
class Memory2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
nvml = ctypes.CDLL("libnvidia-ml.so.1")
nvml.nvmlInit_v2()
device = ctypes.c_void_p()
nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device))
one, two = Memory(), Memory2()
nvml.nvmlDeviceGetMemoryInfo(device, ctypes.byref(one))
nvml.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(two))
print(json.dumps({"v1": [one.total, one.free, one.used], "v2": [two.total, two.free, two.used, two.reserved]}))
"""


def test_nvml_reports_the_share_and_the_pods_usage(pod: Pod) -> None:
    holder = pod.start("linked", "ctx", f"alloc:{300 * MIB}")
    try:
        seen = json.loads(pod.python(NVML_READER))
    finally:
        pod.kill(holder)
    used = CONTEXT + 300 * MIB
    assert seen["v1"] == [LIMIT, LIMIT - used, used]  # what nvidia-smi prints in the pod
    assert seen["v2"] == [LIMIT, LIMIT - used, used, 0]


CTYPES_DRIVER = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")  # dlopen + dlsym, as ctypes and XLA do
size = ctypes.c_size_t
cuda.cuInit(0)
ctx = ctypes.c_void_p()
cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
if sys.argv[1] == "gpa":  # as the CUDA runtime does: every entry point by name and version
    gpa = cuda.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
    def get(name, proto):
        fn, status = ctypes.c_void_p(), ctypes.c_int()
        assert gpa(name.encode(), ctypes.byref(fn), 13000, 0, ctypes.byref(status)) == 0
        return proto(fn.value)
    alloc = get("cuMemAlloc", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), size))
    info = get("cuMemGetInfo", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(size), ctypes.POINTER(size)))
else:
    alloc, info = cuda.cuMemAlloc_v2, cuda.cuMemGetInfo_v2
    alloc.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), size]
p = ctypes.c_ulonglong()
results = [alloc(ctypes.byref(p), 700 << 20), alloc(ctypes.byref(p), 700 << 20)]
free, total = size(), size()
info(ctypes.byref(free), ctypes.byref(total))
print(results[0], results[1], free.value, total.value)
"""


@pytest.mark.parametrize("how", ["dlsym", "gpa"])
def test_python_through_ctypes_is_held_to_the_share(pod: Pod, how: str) -> None:
    first, second, free, total = map(int, pod.python(CTYPES_DRIVER, args=(how,)).split())
    assert (first, second) == (OK, OOM)
    assert (free, total) == (LIMIT - CONTEXT - 700 * MIB, LIMIT)


def test_one_budget_across_processes_and_a_sigkilled_process_gives_back(pod: Pod) -> None:
    holder = pod.start("gpa", "ctx", f"alloc:{600 * MIB}")
    try:
        beside = pod.probe("linked", "ctx", "info", f"alloc:{400 * MIB}", f"alloc:{200 * MIB}")
        assert beside.value("info", "free") == LIMIT - 2 * CONTEXT - 600 * MIB
        assert beside.rc(f"alloc:{400 * MIB}") == OOM
        assert beside.rc(f"alloc:{200 * MIB}") == OK
    finally:
        pod.kill(holder)
    after = pod.probe("linked", "ctx", "info", f"alloc:{800 * MIB}")
    assert after.value("info", "free") == LIMIT - CONTEXT  # the dead holder's bytes are back
    assert after.rc(f"alloc:{800 * MIB}") == OK


def test_processes_and_threads_hammering_one_budget_never_pass_it(pod: Pod) -> None:
    limit = 512 * MIB
    (pod.root / "pod" / "limit").write_text(f"{limit}\n")
    # Contexts made while others allocate are measured imprecisely (NVML's used memory is
    # the device's): none here, so the device's peak is the allocations' alone.
    env = pod.env(extra={"FAKE_CUDA_CONTEXT": "0", "GPUPACK_CUDA_QUIET": "1"})
    procs = [
        subprocess.Popen(
            [str(pod.build.probe), "dlsym", "ctx", f"hammer:8:400:{40 * MIB}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    granted = sum(int(out.split("granted=")[1].split()[0]) for out, _ in outputs)
    refused = sum(int(out.split("refused=")[1].split()[0]) for out, _ in outputs)
    assert granted > 0
    assert refused > 0  # they really contended
    after = pod.probe("linked", "ctx", "info", "peak", FAKE_CUDA_CONTEXT="0")
    assert after.value("peak", "bytes") <= limit  # the device never held more than the share
    assert after.value("info", "free") == limit  # and everything came back


EVERY_KIND = (
    "ctx",
    "info",
    "info1",
    "total",
    "total1",
    f"alloc:{GIB}",
    "free",
    f"alloc1:{MIB}",
    "free",
    f"create:{GIB}",
    "free",
    f"vmm:{GIB}=v",
    "retain:v",
    "release:v",
    "unmap:v",
    "release:v",
    "threshold:1000000",
    f"async:{MIB}",
    "free",
    f"pool:{MIB}",
    "free",
    "trim:0",
    f"graph:{MIB}=g",
    "launch:g",
    "drop:g",
    "graphtrim",
    f"capture:{MIB}=c",
    f"heap:{GIB}",
    "kernel",
    "array:64:64",
    "free",
    "pitch:100:100",
    "free",
    "unwrapped",
)


@pytest.mark.parametrize("mode", MODES)
def test_without_a_limit_every_call_passes_through_untouched(
    built: Build, tmp_path: Path, mode: str
) -> None:
    pod = Pod(built, tmp_path, limit=None)
    runs = []
    for shim in (False, True):
        log = tmp_path / f"calls-{shim}"
        runs.append(
            (pod.probe(mode, *EVERY_KIND, shim=shim, FAKE_CUDA_LOG=str(log)), log.read_text())
        )
    (plain, plain_calls), (shimmed, shimmed_calls) = runs
    assert shimmed.stdout == plain.stdout
    assert shimmed_calls == plain_calls  # the driver received exactly the same calls
    assert "gpupack-cuda" not in shimmed.stderr
    assert "cuGraphLaunch\n" in shimmed_calls


@pytest.mark.parametrize("mode", ["gpa", "gpa-ptds"])
def test_a_driver_that_answers_with_internal_addresses_is_matched_by_version(
    pod: Pod, mode: str
) -> None:
    run = pod.probe(
        mode,
        "ctx",
        f"alloc:{700 * MIB}",
        f"alloc:{700 * MIB}",
        f"async:{200 * MIB}",
        "info",
        f"vmm:{50 * MIB}=v",
        "release:v",
        "info",
        FAKE_CUDA_INTERNAL="1",
        GPUPACK_CUDA_DEBUG="1",
    )
    assert run.rc(f"alloc:{700 * MIB}", 1) == OOM
    assert run.value("info", "free") == LIMIT - CONTEXT - 900 * MIB
    assert run.value("info", "free", 1) == LIMIT - CONTEXT - 950 * MIB  # still mapped
    assert "cuGetProcAddress(cuMemAlloc, 13000" in run.stderr
    assert "by address" not in run.stderr
    # its ABIs differ by version: only an address can say which one was handed out
    assert "cuGetProcAddress(cuGraphInstantiate, 13000, " in run.stderr
    assert all(
        line.endswith("left alone")
        for line in run.stderr.splitlines()
        if "cuGetProcAddress(cuGraphInstantiate," in line
    )


def test_entry_points_it_does_not_wrap_reach_the_driver_under_a_limit(
    pod: Pod, tmp_path: Path
) -> None:
    log = tmp_path / "calls"
    run = pod.probe("gpa", "ctx", "unwrapped", FAKE_CUDA_LOG=str(log))
    assert run.rc("unwrapped") == OK
    assert "cuLaunchKernel\ncuCtxSynchronize\n" in log.read_text()


def test_the_first_call_says_the_limit_and_the_budget_once(pod: Pod) -> None:
    run = pod.probe("linked", "ctx", "info", "info", f"alloc:{MIB}")
    lines = [line for line in run.stderr.splitlines() if "GPU memory limit" in line]
    assert len(lines) == 1
    assert "1.00 GiB (1073741824 bytes)" in lines[0]
    assert str(pod.root / "pod" / "budget") in lines[0]


def test_a_refusal_names_the_limit_the_usage_and_the_annotation(pod: Pod) -> None:
    run = pod.probe("linked", "ctx", f"alloc:{2 * GIB}")
    assert run.rc(f"alloc:{2 * GIB}") == OOM
    refusal = next(line for line in run.stderr.splitlines() if "refused" in line)
    assert "cuMemAlloc_v2 of 2.00 GiB" in refusal
    assert "limit is 1.00 GiB" in refusal
    assert "hold 64.00 MiB" in refusal
    assert "gpupack.io/gpu-memory" in refusal


def test_a_budget_it_cannot_use_refuses_rather_than_runs_unbounded(pod: Pod) -> None:
    budget = pod.root / "pod" / "budget"
    budget.mkdir()  # not a file: cannot be opened for writing
    run = pod.probe("linked", "ctx", f"alloc:{MIB}")
    assert run.rc(f"alloc:{MIB}") == OOM
    assert "cannot be kept" in run.stderr


def test_a_bad_limit_is_named_and_means_no_limit(pod: Pod) -> None:
    (pod.root / "pod" / "limit").write_text("8Gi\n")
    run = pod.probe("linked", "ctx", "total")
    assert run.value("total", "total") == 80 * GIB
    assert "not a number of bytes" in run.stderr


SCENARIO = (
    "ctx",
    "info",
    f"alloc:{300 * MIB}",
    f"alloc:{GIB}",
    "managed:1000",
    "async:4096",
    "pool:4096",
    "pitch:333:77",
    f"create:{MIB}",
    "hostcreate:4096",
    "array:100:100",
    "array3d:10:10:10",
    "mipmap:64:64:1",
    f"alloc1:{MIB}",
    "total",
    *["free"] * 11,
    "info",
    f"vmm:{64 * MIB}=v",
    "retain:v",
    "release:v",
    "export:v",
    "import:v=w",
    "unmap:w",
    "release:w",
    "unmap:v",
    "release:v",
    "threshold:100000000",
    f"async:{8 * MIB}",
    "free",
    "trim:0",
    f"hostpool:{2 * GIB}",
    "free",
    f"graph:{32 * MIB}=g",
    f"child:{16 * MIB}=h",
    f"capture:{8 * MIB}=c",
    "launch:g",
    "launch:h",
    "launch:c",
    "drop:g",
    "graphtrim",
    f"heap:{64 * MIB}",
    "kernel",
    "info",
    "unwrapped",
    "hammer:4:200:8000000",
)


@pytest.mark.parametrize("mode", MODES)
def test_under_address_and_undefined_behaviour_sanitizers(
    address_sanitized: Build, tmp_path: Path, mode: str
) -> None:
    run = Pod(address_sanitized, tmp_path).probe(mode, *SCENARIO)
    assert "Sanitizer" not in run.stderr, run.stderr
    assert "runtime error" not in run.stderr, run.stderr
    assert run.value("info", "free", 1) == LIMIT - CONTEXT
    # what stays: the exported allocation (another process may hold it) and the heap's
    # 56 MiB above its default; the graph pool was trimmed
    assert run.value("info", "free", 2) == LIMIT - CONTEXT - 64 * MIB - 56 * MIB


@pytest.mark.parametrize("mode", ["linked", "gpa"])
@pytest.mark.parametrize("load", ["hammer", "mixed"])
def test_under_thread_sanitizer(
    thread_sanitized: Build, tmp_path: Path, mode: str, load: str
) -> None:
    pod = Pod(thread_sanitized, tmp_path)
    ops = (
        "ctx",
        "threshold:100000000",
        f"{load}:8:300:{60 * MIB}",
        "sync",
        "trim:0",
        "info",
        "used",
    )
    run = pod.probe(mode, *ops, GPUPACK_CUDA_QUIET="1")
    assert "ThreadSanitizer" not in run.stderr, run.stderr
    assert run.value(load, "failed_frees") == 0
    assert run.value("info", "free") == LIMIT - CONTEXT  # everything came back
    assert run.value("used", "bytes") == CONTEXT
