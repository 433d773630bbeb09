"""Real-GPU suite: real CUDA processes, seen through PynvmlReader and the Sampler.

Needs an NVIDIA GPU not in MIG mode, its driver (libnvidia-ml.so.1 and libcuda.so.1)
and a PID namespace NVML can see into; elsewhere every test is skipped with the reason
(`pytest -ra` prints it). The CUDA processes are plain Python with ctypes on the CUDA
driver API, no PyTorch: each finds the GPU by UUID, holds 1 GiB, and either launches a
hand-written PTX kernel that spins on %clock64 across every SM (busy) or only sleeps
(idle). The checks: each PID on the right GPU with the memory it holds plus at most
1 GiB of context, the busy one's compute clearly above zero and the idle one's near
zero, and both gone once they exit.
"""

import contextlib
import ctypes
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from exporter.health import Health
from exporter.nvml import PynvmlReader
from exporter.readings import Device, GpuReading, NvmlUnavailable
from exporter.sampler import Sampler

pytestmark = pytest.mark.gpu

GiB = 1 << 30
ALLOCATED = 1 * GiB
CONTEXT_OVERHEAD = 1 * GiB  # what a CUDA context itself may hold on top
WORKER_SECONDS = 120.0

WORKER = r'''
import ctypes, sys, time

PTX = b"""
.version 7.0
.target sm_52
.address_size 64

.visible .entry spin(
    .param .u64 spin_cycles
)
{
    .reg .pred  %p<2>;
    .reg .b64   %rd<5>;

    ld.param.u64    %rd1, [spin_cycles];
    mov.u64         %rd2, %clock64;
$L__spin:
    mov.u64         %rd3, %clock64;
    sub.s64         %rd4, %rd3, %rd2;
    setp.lt.s64     %p1, %rd4, %rd1;
    @%p1 bra        $L__spin;
    ret;
}
"""
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13  # kHz
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6


def main():
    mode, uuid, size, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(result, what, detail=""):
        if result != 0:
            name = ctypes.c_char_p()
            cuda.cuGetErrorName(result, ctypes.byref(name))
            text = name.value.decode() if name.value else "unknown error"
            print(f"worker: {what} failed: CUresult {result} ({text}) {detail}",
                  file=sys.stderr, flush=True)
            sys.exit(3)

    check(cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
    device, seen = None, []
    for ordinal in range(count.value):
        candidate = ctypes.c_int()
        check(cuda.cuDeviceGet(ctypes.byref(candidate), ordinal), "cuDeviceGet")
        raw = (ctypes.c_ubyte * 16)()
        check(get_uuid(raw, candidate), "cuDeviceGetUuid")
        h = bytes(raw).hex()
        seen.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
        if seen[-1] == uuid:
            device = candidate
            break
    if device is None:
        print(f"worker: no CUDA device has UUID {uuid}; CUDA sees {seen}", file=sys.stderr,
              flush=True)
        sys.exit(4)

    context = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
          "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    memory = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(memory), ctypes.c_size_t(size)), "cuMemAlloc_v2")
    check(cuda.cuMemsetD8_v2(memory, ctypes.c_ubyte(1), ctypes.c_size_t(size)),
          "cuMemsetD8_v2")
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")

    if mode == "spin":
        module, log = ctypes.c_void_p(), ctypes.create_string_buffer(16384)
        options = (ctypes.c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p),
                                       ctypes.c_void_p(len(log)))
        result = cuda.cuModuleLoadDataEx(ctypes.byref(module), ctypes.c_char_p(PTX), 2,
                                         options, values)
        check(result, "cuModuleLoadDataEx", log.value.decode(errors="replace"))
        function = ctypes.c_void_p()
        check(cuda.cuModuleGetFunction(ctypes.byref(function), module, b"spin"),
              "cuModuleGetFunction")
        sms, khz = ctypes.c_int(), ctypes.c_int()
        check(cuda.cuDeviceGetAttribute(ctypes.byref(sms),
                                        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
              "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")
        if cuda.cuDeviceGetAttribute(ctypes.byref(khz), CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
                                     device) != 0 or khz.value <= 0:
            khz.value = 2_000_000  # deprecated in newer CUDA: assume 2 GHz
        cycles = ctypes.c_uint64(khz.value * 100)  # about 100 ms per launch
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(cycles), ctypes.c_void_p))

        def launch():
            check(cuda.cuLaunchKernel(function, ctypes.c_uint(sms.value * 4), 1, 1,
                                      ctypes.c_uint(128), 1, 1, 0, None, params, None),
                  "cuLaunchKernel")
            check(cuda.cuCtxSynchronize(), "cuCtxSynchronize after the spin kernel")

        launch()  # fail before "ready" if the kernel cannot run
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if mode == "spin":
            launch()
        else:
            time.sleep(0.1)


main()
'''


@pytest.fixture(scope="module")
def gpu() -> Device:
    """A GPU for the suite, or a skip that says why there is none."""
    reader = PynvmlReader()
    try:
        devices = reader.open()
    except NvmlUnavailable as err:
        pytest.skip(f"no NVIDIA GPU to test on: {err}")
    try:
        whole = [d for d in devices if not d.mig]
        free = {d.uuid: d.memory_total - (reader.status(d).memory_used or 0) for d in whole}
    finally:
        reader.close()
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        pytest.skip(f"NVML works but the CUDA driver library does not load: {err}")
    if not whole:
        pytest.skip("every GPU is in MIG mode, where NVML has no per-process SM utilization")
    best = max(whole, key=lambda d: free[d.uuid])
    if free[best.uuid] < 2 * (ALLOCATED + CONTEXT_OVERHEAD):
        pytest.skip(f"no GPU has {2 * (ALLOCATED + CONTEXT_OVERHEAD)} bytes free")
    return best


@contextlib.contextmanager
def cuda_process(mode: str, device: Device) -> Iterator["subprocess.Popen[str]"]:
    """A worker process holding ALLOCATED bytes on `device`, busy ("spin") or "idle"."""
    args = [mode, device.uuid, str(ALLOCATED), str(WORKER_SECONDS)]
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        readable, _, _ = select.select([process.stdout], [], [], 120)
        line = process.stdout.readline() if readable else ""
        if line.strip() != "ready":
            process.kill()
            _, errors = process.communicate(timeout=30)
            pytest.fail(f"the {mode} CUDA process did not start: {line!r} {errors}")
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def on(readings_gpus: tuple[GpuReading, ...], device: Device) -> GpuReading:
    return next(g for g in readings_gpus if g.device.uuid == device.uuid)


def listed_pids(sampler: Sampler, device: Device) -> set[int]:
    sampler.sample_once()
    return {p.pid for p in on(sampler.readings().gpus, device).processes}


def test_real_processes_get_their_memory_and_compute(gpu: Device) -> None:
    sampler = Sampler(PynvmlReader(), Health(), min_window=5.0)
    try:
        before = listed_pids(sampler, gpu)
        assert sampler.readings().nvml_up
        with cuda_process("spin", gpu) as busy, cuda_process("idle", gpu) as idle:
            ours = {busy.pid, idle.pid}
            deadline = time.monotonic() + 30
            while not ours <= (listed := listed_pids(sampler, gpu)):
                if time.monotonic() > deadline:
                    if len(listed - before) >= len(ours) and not ours & listed:
                        pytest.skip(
                            f"NVML lists new PIDs {sorted(listed - before)}, not this test's "
                            f"{sorted(ours)}: the test runs in a PID namespace NVML does not "
                            "see; run it in the host PID namespace"
                        )
                    pytest.fail(f"NVML never listed {sorted(ours)}; it lists {sorted(listed)}")
                time.sleep(0.5)
            sampler.readings()  # the next scrape's window starts now
            for _ in range(8):
                time.sleep(1.0)
                sampler.sample_once()
            readings = sampler.readings()
            usage = {p.pid: p for p in on(readings.gpus, gpu).processes}
            for pid in ours:
                memory = usage[pid].memory
                assert memory is not None, f"NVML gave no memory for {pid}"
                assert ALLOCATED <= memory <= ALLOCATED + CONTEXT_OVERHEAD, (pid, memory)
            assert (usage[busy.pid].compute or 0.0) > 0.2, usage[busy.pid]
            idle_compute = usage[idle.pid].compute
            assert idle_compute is not None
            assert idle_compute < 0.05, usage[idle.pid]
            elsewhere = {
                p.pid for g in readings.gpus if g.device.uuid != gpu.uuid for p in g.processes
            }
            assert not ours & elsewhere
            status = on(readings.gpus, gpu).status
            assert status is not None
            assert status.memory_used is not None
            assert status.memory_used >= 2 * ALLOCATED
        deadline = time.monotonic() + 30
        while ours & listed_pids(sampler, gpu):
            assert time.monotonic() < deadline, "exited CUDA processes are still listed"
            time.sleep(0.5)
    finally:
        sampler.stop()
