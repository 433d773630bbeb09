"""Compute shares on a GPU time-sliced between pods (cuda-shim/compute.c).

Each pod is a probe process that launches kernels as a training or serving loop does, on
the fake driver's clock (fake_clock.c): every kernel takes FAKE_CUDA_KERNEL_US alone on a
device that runs one context at a time, round robin between the contexts with work. What
each pod got is the device's own account (fake_gpu_ns), over a window after the pacing
has settled; the issue's tolerance is 5 % of the GPU per pod."""

import mmap
import signal
import struct
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from doubles.shim_build import Build
from gpupack import cuda
from tests.cuda_shim.harness import Pod, SharedGpu

KERNEL_US = "1000"
SETTLE_MS = 1500.0  # the pacing's decay constant is one second
WINDOW_MS = 2000.0
TOLERANCE = 0.05


@dataclass
class Worker:
    pod: Pod
    ops: Sequence[str]
    mode: str = "gpa"

    def start(self) -> "subprocess.Popen[str]":
        return subprocess.Popen(
            [str(self.pod.build.probe), self.mode, "ctx", *self.ops],
            env=self.pod.env(extra={"FAKE_CUDA_KERNEL_US": KERNEL_US, "GPUPACK_CUDA_QUIET": "1"}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def now_ms() -> float:
    return time.monotonic() * 1000.0


def fractions(procs: Sequence["subprocess.Popen[str]"], window_ms: float) -> list[float]:
    """Each process's device time over its last `work` window, as a fraction of it."""
    got = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        lines = [line for line in out.splitlines() if line.startswith("work rc=")]
        assert lines, (out, err)
        assert "rc=0 " in lines[-1], (out, err)
        gpu_ns = int(lines[-1].split("gpu_ns=")[1].split()[0])
        got.append(gpu_ns / (window_ms * 1e6))
    return got


def run_together(
    gpu: SharedGpu, computes: Sequence[str | None], kind: str = "kernel", mode: str = "gpa"
) -> list[float]:
    start = now_ms() + SETTLE_MS
    end = start + WINDOW_MS
    work = f"work:{start}:{end}:4:{kind}"
    pods = [gpu.pod(f"pod{i}", compute) for i, compute in enumerate(computes)]
    return fractions([Worker(pod, [work], mode).start() for pod in pods], WINDOW_MS)


def close(got: Sequence[float], want: Sequence[float]) -> bool:
    return all(abs(g - w) <= TOLERANCE for g, w in zip(got, want, strict=True))


@pytest.fixture
def gpu(built: Build, tmp_path: Path) -> SharedGpu:
    return SharedGpu(built, tmp_path / "gpu")


def test_without_shares_the_fake_gpu_gives_busy_pods_equal_time(gpu: SharedGpu) -> None:
    """The baseline the shares change: time-slicing alone splits the GPU evenly."""
    got = run_together(gpu, [None, None])
    assert close(got, [0.5, 0.5]), got


@pytest.mark.parametrize(
    ("shares", "want"),
    [
        ([300, 700], [0.3, 0.7]),
        ([200, 300, 500], [0.2, 0.3, 0.5]),
        ([100, 100, 100, 100, 100, 100, 200, 200], [0.1] * 6 + [0.2, 0.2]),
        # shares that add up to less than the GPU: the spare time goes in proportion
        ([100, 300], [0.25, 0.75]),
    ],
    ids=["two", "three", "eight", "under-one"],
)
def test_busy_pods_get_gpu_time_in_proportion_to_their_shares(
    gpu: SharedGpu, shares: list[int], want: list[float]
) -> None:
    got = run_together(gpu, [f"{share} share" for share in shares])
    assert close(got, want), (got, want)
    assert sum(got) >= 0.95, got  # work-conserving: the GPU never sat idle for pacing


@pytest.mark.parametrize("kind", ["ex", "coop", "graph"])
def test_every_kind_of_launch_is_paced(gpu: SharedGpu, kind: str) -> None:
    got = run_together(gpu, ["300 share", "700 share"], kind=kind)
    assert close(got, [0.3, 0.7]), got


def test_linked_launches_are_paced_as_looked_up_ones_are(gpu: SharedGpu) -> None:
    got = run_together(gpu, ["300 share", "700 share"], mode="linked")
    assert close(got, [0.3, 0.7]), got


def test_an_idle_neighbours_time_goes_to_the_busy_pods(gpu: SharedGpu) -> None:
    start = now_ms() + SETTLE_MS
    end = start + WINDOW_MS
    work = f"work:{start}:{end}:4"
    busy = [
        Worker(gpu.pod(f"pod{i}", f"{share} share"), [work]) for i, share in ((0, 200), (1, 300))
    ]
    idle = Worker(gpu.pod("idle", "500 share"), [f"idle-until:{end}"])
    procs = [worker.start() for worker in (*busy, idle)]
    got = fractions(procs[:2], WINDOW_MS)
    procs[2].communicate(timeout=60)
    assert close(got, [0.4, 0.6]), got


def test_a_pod_whose_neighbour_stops_working_gets_the_whole_gpu(gpu: SharedGpu) -> None:
    """Busy, then idle: the 700m pod works in the first phase only."""
    first = now_ms() + SETTLE_MS
    middle = first + WINDOW_MS
    last = middle + SETTLE_MS / 3
    end = last + WINDOW_MS
    small = Worker(
        gpu.pod("small", "300 share"), [f"work:{first}:{middle}:4", f"work:{last}:{end}:4"]
    )
    large = Worker(gpu.pod("large", "700 share"), [f"work:{first}:{middle}:4"])
    procs = [small.start(), large.start()]
    out, err = procs[0].communicate(timeout=60)
    procs[1].communicate(timeout=60)
    phases = [line for line in out.splitlines() if line.startswith("work rc=0")]
    assert len(phases) == 2, (out, err)
    shares = [int(line.split("gpu_ns=")[1].split()[0]) / (WINDOW_MS * 1e6) for line in phases]
    assert abs(shares[0] - 0.3) <= TOLERANCE, shares
    assert shares[1] >= 0.95, shares


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_killed_or_stopped_neighbour_frees_its_claim(gpu: SharedGpu, how: int) -> None:
    """The 700m pod is killed (or stopped) mid-run: the 300m pod, which its share held
    back, then has the GPU to itself."""
    start = now_ms() + SETTLE_MS
    gone_at = start + WINDOW_MS / 2
    window = (gone_at + 300.0, gone_at + 300.0 + WINDOW_MS)
    small = Worker(gpu.pod("small", "300 share"), [f"work:{window[0]}:{window[1]}:4"])
    large = Worker(gpu.pod("large", "700 share"), [f"work:{start}:{window[1]}:4"])
    procs = [small.start(), large.start()]
    time.sleep(max(0.0, (gone_at - now_ms()) / 1000.0))
    procs[1].send_signal(how)
    try:
        got = fractions(procs[:1], WINDOW_MS)
    finally:
        if how == signal.SIGSTOP:
            procs[1].send_signal(signal.SIGKILL)
        procs[1].communicate(timeout=60)
    assert got[0] >= 0.95, got


def test_a_capped_pod_keeps_to_its_share_even_alone(gpu: SharedGpu) -> None:
    got = run_together(gpu, ["300 cap"])
    assert close(got, [0.3]), got


def test_shares_that_do_not_cap_leave_a_pod_alone_the_whole_gpu(gpu: SharedGpu) -> None:
    got = run_together(gpu, ["300 share"])
    assert got[0] >= 0.95, got


def test_capped_pods_leave_the_rest_of_the_gpu_idle(gpu: SharedGpu) -> None:
    got = run_together(gpu, ["100 cap", "300 cap"])
    assert close(got, [0.1, 0.3]), got


def test_mode_off_is_plain_time_slicing(gpu: SharedGpu) -> None:
    got = run_together(gpu, ["300 off", "700 off"])
    assert close(got, [0.5, 0.5]), got


def test_a_pod_alone_is_neither_timed_nor_paced(gpu: SharedGpu, tmp_path: Path) -> None:
    """Pass-through: the driver sees the application's launches and nothing of ours (no
    event recorded) until a second pod has work on the GPU."""
    log = tmp_path / "calls"
    pod = gpu.pod("alone", "300 share")
    run = pod.probe(
        "gpa",
        "ctx",
        f"work:0:{now_ms() + 300}:4",
        FAKE_CUDA_LOG=str(log),
        FAKE_CUDA_KERNEL_US=KERNEL_US,
    )
    assert run.rc("work") == 0
    calls = log.read_text().splitlines()
    assert "cuLaunchKernel" in calls
    assert "cuEventRecord" not in calls


def test_beside_a_busy_neighbour_each_launch_is_timed_by_an_event(
    gpu: SharedGpu, tmp_path: Path
) -> None:
    log = tmp_path / "calls"
    end = now_ms() + 1000
    neighbour = Worker(gpu.pod("neighbour", "700 share"), [f"work:0:{end}:4"]).start()
    pod = gpu.pod("timed", "300 share")
    time.sleep(0.2)
    run = pod.probe(
        "gpa", "ctx", f"work:0:{end}:4", FAKE_CUDA_LOG=str(log), FAKE_CUDA_KERNEL_US=KERNEL_US
    )
    neighbour.communicate(timeout=60)
    assert run.rc("work") == 0
    assert "cuEventRecord" in log.read_text().splitlines()


@pytest.mark.parametrize("text", ["lots share", "0 share", "2000 cap", "300 fair"])
def test_a_compute_file_it_cannot_read_is_said_and_ignored(gpu: SharedGpu, text: str) -> None:
    pod = gpu.pod("bad", text)
    run = pod.probe("gpa", "ctx", "kernel", "kernel")
    assert run.rc("kernel") == 0
    assert f"ignoring {pod.directory / cuda.COMPUTE}" in run.stderr, run.stderr


def test_without_a_gpu_time_file_the_share_is_said_to_be_unapplied(
    built: Build, tmp_path: Path
) -> None:
    pod = Pod(built, tmp_path)
    (pod.directory / "compute").write_text("300 share\n")
    run = pod.probe("gpa", "ctx", "kernel")
    assert run.rc("kernel") == 0
    assert "compute share not applied" in run.stderr, run.stderr


@pytest.mark.parametrize("sanitizer", ["address_sanitized", "thread_sanitized"])
def test_pacing_is_clean_under_the_sanitizers(
    sanitizer: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Launch threads, the meter thread and two processes at once, under ASan/UBSan and
    TSan: no race, leak or undefined behaviour (the shares themselves are not measured:
    the sanitizers slow the processes)."""
    build: Build = request.getfixturevalue(sanitizer)
    gpu = SharedGpu(build, tmp_path / "gpu")
    end = now_ms() + 1000
    workers = [
        Worker(gpu.pod(f"pod{i}", f"{share} share"), [f"work:0:{end}:2"])
        for i, share in enumerate((300, 700))
    ]
    for proc in [worker.start() for worker in workers]:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "work rc=0" in out, (out, err)


def _lie(path: Path, until_ms: float) -> None:
    """A pod that rewrites the GPU's file: a slot of its own that says it has work and has
    had no GPU time (so every other pod is ahead of it), and everyone else's slots filled
    with GPU time they never had."""
    slot = struct.Struct("<IIQQQIiQ16x")
    with path.open("r+b") as stream, mmap.mmap(stream.fileno(), 0) as view:
        while now_ms() < until_ms:
            view[12:16] = struct.pack("<I", 128)  # every slot is read
            stamp = time.monotonic_ns()
            for index in range(128):
                at = 64 + index * 64
                if index == 127:
                    view[at : at + 64] = slot.pack(3, 1000, 0xBAD, 0, stamp, 1, 1, 0)
                else:  # inflate the others' time, keeping their other fields
                    view[at + 16 : at + 24] = struct.pack("<Q", 1 << 62)
            time.sleep(0.005)


def test_a_pod_that_rewrites_the_gpus_file_never_holds_a_neighbour_below_its_share(
    gpu: SharedGpu,
) -> None:
    start = now_ms() + SETTLE_MS
    end = start + WINDOW_MS
    victim = Worker(gpu.pod("victim", "300 share"), [f"work:{start}:{end}:4"]).start()
    _lie(gpu.root / cuda.GPU_TIME, end)
    [got] = fractions([victim], WINDOW_MS)
    assert got >= 0.3 - TOLERANCE, got
