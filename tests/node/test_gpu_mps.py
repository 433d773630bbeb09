"""Real-GPU suite, MPS: the daemon started as a capacity pod starts it, clients with the
limits the webhook writes, and the limits taking effect.

Needs an NVIDIA GPU, its driver and `nvidia-cuda-mps-control` on PATH; elsewhere every
test is skipped with the reason (`pytest -ra` prints it). The daemon runs under
`gpupack-mps-daemon` with its pipe and log directories in a scratch directory, as the
CSI volume gives them in a pod. Each client is plain Python with ctypes on the CUDA
driver API (no PyTorch): it creates a context on device 0, reports the SMs its context
may use, and tries to allocate each size it is given, reporting the CUDA result.

Checks: the daemon answers its probe, quits with its MPS processes on SIGTERM and exits
1 with its log when the control daemon dies under it; a client whose pinned memory limit
is 2 GiB allocates 1 GiB and fails to allocate 3 GiB, while one without a limit
allocates 3 GiB; a client with an active thread percentage of 25 gets at most a quarter
of the SMs (plus rounding) and takes several times longer over the same kernel; NVML
lists a client with its memory, the exporter knows the server process, and the sampler
never reports a busy client idle. The figures are printed (`-s`) for docs/exporter.md.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from doubles import cuda_worker
from exporter.cgroup import OwnerKind, ProcessTable
from exporter.health import Health
from exporter.nvml import PynvmlReader
from exporter.readings import ProcessKind
from exporter.sampler import Sampler

pytestmark = pytest.mark.gpu

GiB = 1 << 30

CLIENT = r"""
import ctypes, json, sys, time

PTX = __PTX__
cuda = ctypes.CDLL("libcuda.so.1")
CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13  # kHz
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0


def check(result, what):
    if result != 0:
        print(json.dumps({"error": f"{what}: CUDA error {result}"}))
        sys.exit(1)


class SmCount(ctypes.Structure):
    _fields_ = [("val", ctypes.c_uint)]


class Affinity(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("smCount", SmCount)]


check(cuda.cuInit(0), "cuInit")
device, context = ctypes.c_int(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
check(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
sms = ctypes.c_int()
check(
    cuda.cuDeviceGetAttribute(ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
    "cuDeviceGetAttribute",
)
affinity = Affinity()
got = cuda.cuCtxGetExecAffinity(ctypes.byref(affinity), CU_EXEC_AFFINITY_TYPE_SM_COUNT)
allocations, blocks, sizes = {}, 0, []
for arg in sys.argv[1:]:
    if arg.startswith("spin="):
        blocks = int(arg[5:])
    else:
        sizes.append(int(arg))
for size in sizes:
    pointer = ctypes.c_uint64()
    result = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
    allocations[str(size)] = result
    if result == 0:
        cuda.cuMemFree_v2(pointer)
kernel_s = None
if blocks:
    # A fixed amount of work: `blocks` 128-thread blocks, each spinning for about 20 ms of
    # its SM's clock, timed three times. 16 such blocks fill an SM; with fewer SMs the
    # same grid takes proportionally more waves.
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
    check(cuda.cuModuleGetFunction(ctypes.byref(function), module, b"spin"),
          "cuModuleGetFunction")
    khz = ctypes.c_int()
    if cuda.cuDeviceGetAttribute(ctypes.byref(khz), CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
                                 device) != 0 or khz.value <= 0:
        khz.value = 2_000_000
    cycles = ctypes.c_uint64(khz.value * 20)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(cycles), ctypes.c_void_p))
    times = []
    for _ in range(3):
        started = time.perf_counter()
        check(cuda.cuLaunchKernel(function, ctypes.c_uint(blocks), 1, 1,
                                  ctypes.c_uint(128), 1, 1, 0, None, params, None),
              "cuLaunchKernel")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        times.append(time.perf_counter() - started)
    kernel_s = min(times)
print(json.dumps({
    "device_sms": sms.value,
    "context_sms": affinity.smCount.val if got == 0 else None,
    "allocations": allocations,
    "kernel_s": kernel_s,
}))
""".replace("__PTX__", repr(cuda_worker.SPIN_PTX))


def _skip_without_mps() -> None:
    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("no nvidia-cuda-mps-control on PATH: no NVIDIA driver with MPS here")
    try:
        probe = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        pytest.skip("no nvidia-smi: no NVIDIA driver here")
    if probe.returncode != 0 or "GPU 0" not in probe.stdout:
        pytest.skip(f"no NVIDIA GPU to test on: {probe.stderr.strip() or probe.stdout.strip()}")


def probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`gpupack-mps-daemon --check`, as the capacity pod's probes run it."""
    return subprocess.run(
        [sys.executable, "-m", "node.mps_daemon", "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def start_daemon(scratch: Path) -> tuple[dict[str, str], "subprocess.Popen[str]"]:
    """`gpupack-mps-daemon` on GPU 0 with its pipe and log directories in `scratch`, as
    the CSI volume gives them in a pod; its environment (a client's too) and process."""
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_MPS_PIPE_DIRECTORY": str(scratch / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(scratch / "log"),
    }
    daemon = subprocess.Popen(
        [sys.executable, "-m", "node.mps_daemon", "--log-format=text"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return env, daemon


@pytest.fixture(scope="module")
def mps_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running MPS control daemon on GPU 0, under gpupack-mps-daemon."""
    _skip_without_mps()
    env, daemon = start_daemon(tmp_path_factory.mktemp("mps"))
    deadline = time.monotonic() + 30
    while True:
        check = probe(env)
        if check.returncode == 0:
            break
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            output = daemon.communicate()[0]
            pytest.skip(f"the MPS daemon did not start here: {check.stderr.strip()} {output}")
        time.sleep(0.5)
    yield env
    daemon.send_signal(signal.SIGTERM)
    output, _ = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, output  # quit cleanly on SIGTERM, as a pod's does
    deadline = time.monotonic() + 10
    while left := mps_processes():  # and took the control daemon and its server with it
        assert time.monotonic() < deadline, f"MPS processes outlive the daemon: {left}"
        time.sleep(0.5)


def mps_processes() -> dict[int, str]:
    """PID -> name of every running nvidia-cuda-mps-control or -server process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if Path(argv0).name.startswith("nvidia-cuda-mps-"):
            found[int(entry.name)] = Path(argv0).name
    return found


def client(env: dict[str, str], *args: int | str, **limits: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, *map(str, args)],
        env={**env, **limits},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.strip(), done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    return result


def test_the_daemon_answers_as_the_capacity_pods_probe_asks(
    mps_environment: dict[str, str],
) -> None:
    check = probe(mps_environment)
    assert check.returncode == 0, check.stderr
    assert "default active thread percentage" in check.stdout


def test_a_client_past_its_pinned_memory_limit_fails_to_allocate(
    mps_environment: dict[str, str],
) -> None:
    unlimited = client(mps_environment, 3 * GiB)
    assert unlimited["allocations"][str(3 * GiB)] == 0, unlimited
    limited = client(mps_environment, 1 * GiB, 3 * GiB, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2048M")
    assert limited["allocations"][str(1 * GiB)] == 0, limited
    assert limited["allocations"][str(3 * GiB)] != 0, limited  # CUDA_ERROR_OUT_OF_MEMORY


def test_a_client_gets_the_share_of_the_sms_its_thread_percentage_says(
    mps_environment: dict[str, str],
) -> None:
    full = client(mps_environment)
    quarter = client(mps_environment, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25")
    total = full["context_sms"] or full["device_sms"]
    limited = quarter["context_sms"] or quarter["device_sms"]
    assert limited < total, (full, quarter)
    assert limited <= total // 4 + 2, (full, quarter)  # MPS rounds up to whole SM groups


def test_a_client_at_a_quarter_of_the_threads_does_a_quarter_of_the_work_per_second(
    mps_environment: dict[str, str],
) -> None:
    """The same kernel (one full-occupancy wave on every SM of the GPU) takes about four
    times as long at an active thread percentage of 25: the limit costs throughput, not
    only a number. (Under the limit the device reports its share of the SMs as its SM
    count, so the grid is sized from an unlimited client's count.)"""
    sms = client(mps_environment)["device_sms"]
    full = client(mps_environment, f"spin={sms * 16}")
    quarter = client(mps_environment, f"spin={sms * 16}", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25")
    print(f"MPS throughput: {json.dumps({'full': full, 'quarter': quarter})}")
    assert full["kernel_s"], full
    assert quarter["kernel_s"], quarter
    assert quarter["kernel_s"] >= 2.5 * full["kernel_s"], (full, quarter)


def test_nvml_lists_an_mps_client_and_the_exporter_knows_its_server(
    mps_environment: dict[str, str],
) -> None:
    """What NVML says of a busy MPS client, as `PynvmlReader` reads it: the client's own
    PID is listed with its memory, and the process that runs its kernels is recognised
    as the MPS server (whose usage `exporter.collector` charges to no pod). Where NVML
    puts the client's SM time (on the client or on the server) is printed, for
    docs/exporter.md."""
    reader = PynvmlReader()
    device = next(d for d in reader.open() if d.index == 0)
    try:
        with cuda_worker.cuda_process(
            "spin", device.uuid, 1 * GiB, 60, env=mps_environment
        ) as worker:
            deadline = time.monotonic() + 30
            while True:
                listed = {p.pid: p for p in reader.processes(device)}
                if worker.pid in listed or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            time.sleep(3)  # a few seconds of the kernel running for the samples
            listed = {p.pid: p for p in reader.processes(device)}
            samples = reader.utilization(device, 0)
            servers = {p: n for p, n in mps_processes().items() if n.endswith("-server")}
            table = ProcessTable(Path("/proc"))
            owners = {pid: table.owner(pid).kind.value for pid in [worker.pid, *servers]}
            sampler = Sampler(PynvmlReader(), Health(), min_window=2.0)
            try:
                for _ in range(4):
                    sampler.sample_once()
                    time.sleep(1.0)
                gpu = next(g for g in sampler.readings().gpus if g.device.uuid == device.uuid)
                client_compute = next(p.compute for p in gpu.processes if p.pid == worker.pid)
            finally:
                sampler.stop()
        sm_by_pid: dict[int, float] = {}
        for sample in samples:
            sm_by_pid[sample.pid] = max(sm_by_pid.get(sample.pid, 0.0), sample.sm)
        record = {
            "client": worker.pid,
            "servers": sorted(servers),
            "listed": {pid: [p.kind.value, p.memory] for pid, p in listed.items()},
            "sm_by_pid": sm_by_pid,
            "owners": owners,
            "sampler_client_compute": client_compute,
        }
        print(f"MPS under NVML: {json.dumps(record)}")
        assert worker.pid in listed, record
        assert listed[worker.pid].kind is ProcessKind.MPS_CLIENT, record
        memory = listed[worker.pid].memory
        assert memory is None or memory >= 1 * GiB, record
        assert servers, record
        assert {owners[pid] for pid in servers} == {OwnerKind.MPS_SERVER.value}, record
        assert owners[worker.pid] == OwnerKind.HOST.value, record  # in no pod here
        # The kernels' SM time is NVML's to place: on the client, or on the server
        # (then the exporter reports it under source="mps-server").
        assert max(sm_by_pid.get(pid, 0.0) for pid in [worker.pid, *servers]) > 0.2, record
        # ... and the sampler never calls the busy client idle: busy, or unknown (None).
        assert client_compute is None or client_compute > 0.2, record
    finally:
        reader.close()


def test_the_daemon_exits_1_with_its_log_when_mps_dies_under_it(
    tmp_path: Path,
) -> None:
    """docs/mps.md: when the control daemon dies on its own, gpupack-mps-daemon exits 1
    with the end of control.log in its output, so the kubelet restarts the container."""
    _skip_without_mps()
    before = set(mps_processes())
    env, daemon = start_daemon(tmp_path)
    try:
        deadline = time.monotonic() + 30
        while probe(env).returncode != 0:
            assert daemon.poll() is None, "gpupack-mps-daemon exited before answering"
            assert time.monotonic() < deadline, "gpupack-mps-daemon did not answer in 30 s"
            time.sleep(0.5)
        controls = [
            pid
            for pid, name in mps_processes().items()
            if pid not in before and name == "nvidia-cuda-mps-control"
        ]
        assert controls, mps_processes()
        for pid in controls:
            os.kill(pid, signal.SIGKILL)
        output, _ = daemon.communicate(timeout=30)
        assert daemon.returncode == 1, output
        assert "control.log" in output, output
        assert probe(env).returncode != 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.communicate()
