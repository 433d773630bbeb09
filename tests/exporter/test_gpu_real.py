"""Real-GPU suite: real CUDA processes, seen through PynvmlReader and the Sampler.

Needs an NVIDIA GPU not in MIG mode, its driver (libnvidia-ml.so.1 and libcuda.so.1)
and a PID namespace NVML can see into; elsewhere every test is skipped with the reason
(`pytest -ra` prints it). The CUDA processes are `doubles.cuda_worker`'s: each
finds the GPU by UUID, holds 1 GiB, and either spins on every SM (busy) or only sleeps
(idle). The checks: each PID on the right GPU with the memory it holds plus at most
1 GiB of context, the busy one's compute clearly above zero and the idle one's near
zero, and both gone once they exit.
"""

import contextlib
import ctypes
import subprocess
import time
from collections.abc import Iterator

import pytest

from doubles import cuda_worker
from exporter.health import Health
from exporter.nvml import PynvmlReader
from exporter.readings import Device, GpuReading, NvmlUnavailable
from exporter.sampler import Sampler

pytestmark = pytest.mark.gpu

GiB = 1 << 30
ALLOCATED = 1 * GiB
CONTEXT_OVERHEAD = 1 * GiB  # what a CUDA context itself may hold on top
WORKER_SECONDS = 120.0


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
    with contextlib.ExitStack() as stack:
        try:
            process = stack.enter_context(
                cuda_worker.cuda_process(mode, device.uuid, ALLOCATED, WORKER_SECONDS)
            )
        except RuntimeError as err:
            pytest.fail(str(err))
        yield process


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
            print(f"real processes: busy {usage[busy.pid]}, idle {usage[idle.pid]}")
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
