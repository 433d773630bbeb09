"""A CUDA process of known size and load, for the real-GPU suites and the exporter
benchmark's real-NVML mode: plain Python with ctypes on the CUDA driver API (no PyTorch).

The worker finds its GPU by UUID, holds `size` bytes, prints "ready", and then either
launches a hand-written PTX kernel that spins on %clock64 across every SM for about 100 ms
at a time ("spin") or only sleeps ("idle"), until `seconds` have passed. `SPIN_PTX` is the
kernel; the MPS suite launches it too, to time a fixed amount of work.
"""

import contextlib
import select
import subprocess
import sys
from collections.abc import Iterator, Mapping

SPIN_PTX = b"""
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

_WORKER = r"""
import ctypes, sys, time

PTX = __PTX__
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
"""

WORKER = _WORKER.replace("__PTX__", repr(SPIN_PTX))


@contextlib.contextmanager
def cuda_process(
    mode: str, uuid: str, size: int, seconds: float, env: Mapping[str, str] | None = None
) -> Iterator["subprocess.Popen[str]"]:
    """A worker process holding `size` bytes on the GPU `uuid`, busy ("spin") or "idle",
    for at most `seconds`; killed on leaving. Raises RuntimeError if it does not start."""
    args = [mode, uuid, str(size), str(seconds)]
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
    )
    try:
        assert process.stdout is not None
        readable, _, _ = select.select([process.stdout], [], [], 120)
        line = process.stdout.readline() if readable else ""
        if line.strip() != "ready":
            process.kill()
            _, errors = process.communicate(timeout=30)
            raise RuntimeError(f"the {mode} CUDA process did not start: {line!r} {errors}")
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
