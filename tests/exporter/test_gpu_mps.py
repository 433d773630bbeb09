"""Real-GPU suite, MPS: the daemon started as a capacity pod starts it, clients with the
limits the webhook writes, and the limits taking effect.

Needs an NVIDIA GPU, its driver and `nvidia-cuda-mps-control` on PATH; elsewhere every
test is skipped with the reason (`pytest -ra` prints it). The daemon runs under
`gpupack-mps-daemon` with its pipe and log directories in a scratch directory, as the
CSI volume gives them in a pod. Each client is plain Python with ctypes on the CUDA
driver API (no PyTorch): it creates a context on device 0, reports the SMs its context
may use, and tries to allocate each size it is given, reporting the CUDA result.

Checks: the daemon answers its probe; a client whose pinned memory limit is 2 GiB
allocates 1 GiB and fails to allocate 3 GiB, while one without a limit allocates 3 GiB;
a client with an active thread percentage of 25 gets at most a quarter of the SMs (plus
rounding) where one without gets them all.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

GiB = 1 << 30

CLIENT = r"""
import ctypes, json, sys

cuda = ctypes.CDLL("libcuda.so.1")
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
allocations = {}
for size in map(int, sys.argv[1:]):
    pointer = ctypes.c_uint64()
    result = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
    allocations[str(size)] = result
    if result == 0:
        cuda.cuMemFree_v2(pointer)
print(json.dumps({
    "device_sms": sms.value,
    "context_sms": affinity.smCount.val if got == 0 else None,
    "allocations": allocations,
}))
"""


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
        [sys.executable, "-m", "exporter.mps_daemon", "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture(scope="module")
def mps_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running MPS control daemon on GPU 0, under gpupack-mps-daemon."""
    _skip_without_mps()
    scratch = tmp_path_factory.mktemp("mps")
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_MPS_PIPE_DIRECTORY": str(scratch / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(scratch / "log"),
    }
    daemon = subprocess.Popen(
        [sys.executable, "-m", "exporter.mps_daemon", "--log-format=text"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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


def client(env: dict[str, str], *sizes: int, **limits: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, *map(str, sizes)],
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
