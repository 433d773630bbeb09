"""The sampler against a fake NVML: averaging over the scrape window, idle and vanished
processes, MIG, lost GPUs, NVML going away and coming back, XIDs, health, the thread."""

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from doubles.nvml import EPOCH_US, FakeReader, GiB, fake_uuid
from exporter.health import NVML, Health
from exporter.readings import (
    Device,
    DeviceStatus,
    GpuReading,
    ProcessKind,
    ProcessUsage,
    Readings,
)
from exporter.sampler import Sampler
from hack.polling import eventually

GPU0, GPU1, GPU2 = fake_uuid(0), fake_uuid(1), fake_uuid(2)
PID = 4242


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    fake: FakeReader
    clock: Clock
    health: Health
    sampler: Sampler

    def tick(self, times: int = 1, every: float = 1.0) -> None:
        """Advance the clock by `every`, then sample; `times` times."""
        for _ in range(times):
            self.clock.now += every
            self.sampler.sample_once()

    def gpu(self, uuid: str) -> GpuReading:
        return next(gpu for gpu in self.sampler.readings().gpus if gpu.device.uuid == uuid)

    def process(self, uuid: str, pid: int) -> ProcessUsage:
        return next(process for process in self.gpu(uuid).processes if process.pid == pid)


def rig(fake: FakeReader | None = None, **options: float) -> Rig:
    fake = fake if fake is not None else FakeReader.typical(gpus=3, processes_per_gpu=0)
    clock = Clock()
    health = Health(logging.getLogger("test.health"))
    return Rig(fake, clock, health, Sampler(fake, health, clock=clock, **options))


# -- averaging -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phases", "compute", "window"),
    [
        pytest.param([[0.5] * 10], 0.5, 5.0, id="steady-load"),
        pytest.param([[0.0] * 5 + [1.0] * 5], 1.0, 5.0, id="first-scrape-uses-min-window"),
        pytest.param(
            [[1.0] * 5, [0.2] * 5 + [0.6] * 5], 0.4, 10.0, id="window-is-time-since-last-scrape"
        ),
        pytest.param([[0.0] * 10, [1.0] * 2], 0.4, 5.0, id="short-window-clamped-to-min"),
        pytest.param(
            [[0.0] * 5, [1.0] * 10 + [0.5] * 60], 0.5, 60.0, id="long-window-clamped-to-max"
        ),
    ],
)
def test_compute_is_the_mean_of_the_ticks_inside_the_scrape_window(
    phases: list[list[float]], compute: float, window: float
) -> None:
    r = rig()
    readings = Readings()
    for phase in phases:
        for sm in phase:
            r.fake.set_process(GPU0, PID, memory=2 * GiB, sm=sm)
            r.tick()
        readings = r.sampler.readings()
    (process,) = readings.gpus[0].processes
    assert process.compute == pytest.approx(compute)
    assert readings.window == window


def test_samples_within_one_tick_are_averaged() -> None:
    r = rig()
    r.fake.set_process(GPU0, PID, sm=[0.2, 0.4, 0.9])
    r.tick(3)
    assert r.process(GPU0, PID).compute == pytest.approx(0.5)


@pytest.mark.parametrize(
    "others",
    [
        pytest.param(False, id="gpu-idle-nvml-answers-not-found"),
        pytest.param(True, id="other-process-busy"),
    ],
)
def test_idle_process_has_zero_compute(others: bool) -> None:
    r = rig()
    r.fake.set_process(GPU0, PID, memory=3 * GiB, sm=None)
    if others:
        r.fake.set_process(GPU0, PID + 1, sm=0.8)
    r.tick(5)
    idle = r.process(GPU0, PID)
    assert idle.compute == 0.0
    assert idle.memory == 3 * GiB


def test_an_mps_client_without_samples_has_no_compute_rather_than_none_used() -> None:
    """Measured on an H200 (driver 580): NVML lists an MPS client with its memory but puts
    its kernels' SM time on the MPS server. Reporting the client idle would tell the
    recommender that a busy real-time-mps pod uses no compute."""
    r = rig()
    r.fake.set_process(GPU0, PID, memory=2 * GiB, sm=None, kind=ProcessKind.MPS_CLIENT)
    r.fake.set_process(GPU0, PID + 1, memory=GiB // 16, sm=0.93)  # the MPS server
    r.tick(5)
    client = r.process(GPU0, PID)
    assert client.compute is None
    assert client.memory == 2 * GiB
    assert r.process(GPU0, PID + 1).compute == pytest.approx(0.93)


def test_an_mps_client_with_samples_keeps_them_across_ticks_without() -> None:
    """A driver that does charge the client: its samples count, and a tick without one
    neither adds an idle tick nor drops what it had."""
    r = rig()
    r.fake.set_process(GPU0, PID, sm=0.6, kind=ProcessKind.MPS_CLIENT)
    r.tick(3)
    r.fake.set_process(GPU0, PID, sm=None, kind=ProcessKind.MPS_CLIENT)
    r.tick(2)
    assert r.process(GPU0, PID).compute == pytest.approx(0.6)


def test_utilization_is_asked_for_samples_newer_than_the_newest_seen() -> None:
    r = rig()
    r.fake.set_process(GPU0, PID, sm=0.5)
    r.tick(3)
    since = [since for uuid, since in r.fake.utilization_calls if uuid == GPU0]
    assert since == [0, EPOCH_US + 1_000_000, EPOCH_US + 2_000_000]


def test_vanished_process_is_dropped_with_its_history() -> None:
    r = rig()
    r.fake.set_process(GPU0, PID, sm=1.0)
    r.fake.set_process(GPU0, PID + 1, sm=0.3)
    r.tick(3)
    r.fake.remove_process(GPU0, PID)
    r.tick()
    assert [p.pid for p in r.gpu(GPU0).processes] == [PID + 1]
    r.fake.set_process(GPU0, PID, sm=0.0)  # the PID is reused: no memory of the old one
    r.tick()
    assert r.process(GPU0, PID).compute == 0.0


def test_mig_device_reports_memory_but_no_compute() -> None:
    r = rig(FakeReader.typical(gpus=2, processes_per_gpu=2, mig=(1,)))
    r.tick(3)
    mig, whole = r.gpu(GPU1), r.gpu(GPU0)
    assert [(p.compute, p.memory) for p in mig.processes] == [(None, 1 * GiB), (None, 2 * GiB)]
    assert mig.status is not None
    assert mig.status.utilization is None
    assert [p.compute for p in whole.processes] == [0.0, pytest.approx(0.1)]


# -- lost GPUs -----------------------------------------------------------------------------


def test_lost_gpu_is_unhealthy_while_the_others_keep_reporting() -> None:
    r = rig()
    for uuid in (GPU0, GPU1, GPU2):
        r.fake.set_process(uuid, PID, sm=0.5)
    r.tick(2)
    r.fake.lose(GPU1)
    r.tick()
    readings = r.sampler.readings()
    assert readings.nvml_up
    assert [(g.healthy, g.status is None, len(g.processes)) for g in readings.gpus] == [
        (True, False, 1),
        (False, True, 0),
        (True, False, 1),
    ]
    assert GPU1 in r.health.snapshot().messages[NVML]


@pytest.mark.parametrize(
    "unlisted",
    [
        pytest.param(False, id="still-listed"),
        pytest.param(True, id="not-listed-after-reopen"),
    ],
)
def test_lost_gpu_recovers_when_nvml_is_reopened(unlisted: bool) -> None:
    r = rig(reopen_interval=30.0)
    r.fake.set_process(GPU1, PID, memory=5 * GiB, sm=0.5)
    r.tick()
    r.fake.lose(GPU1, unlisted=unlisted)
    r.tick(30)  # opened at t=1: reopened at t=31
    assert r.fake.opens == 2
    assert not r.gpu(GPU1).healthy
    assert [d.uuid for d in r.sampler.devices()] == [GPU0, GPU1, GPU2]
    r.fake.recover(GPU1)
    r.tick(29)
    assert not r.gpu(GPU1).healthy
    r.tick()
    gpu = r.gpu(GPU1)
    assert (gpu.healthy, r.fake.opens) == (True, 3)
    assert [p.memory for p in gpu.processes] == [5 * GiB]
    assert NVML not in r.health.snapshot().messages


# -- NVML down -----------------------------------------------------------------------------


def test_nvml_that_will_not_open_is_retried_with_bounded_backoff() -> None:
    r = rig()
    r.fake.fail_open("NVML Shared Library Not Found")
    attempts: list[float] = []
    for _ in range(400):
        r.sampler.sample_once()
        if r.fake.opens > len(attempts):
            attempts.append(r.clock.now)
        r.clock.now += 0.5
    assert attempts == [0, 1, 3, 7, 15, 31, 63, 123, 183]
    readings = r.sampler.readings()
    assert (readings.nvml_up, readings.gpus, readings.sample_age) == (False, (), None)
    assert "Shared Library Not Found" in r.health.snapshot().messages[NVML]
    r.fake.restore()
    r.clock.now = 243
    r.sampler.sample_once()
    assert r.sampler.readings().nvml_up
    assert len(r.sampler.readings().gpus) == 3


def test_nvml_lost_mid_run_closes_the_reader_and_recovers() -> None:
    r = rig()
    r.fake.set_process(GPU0, PID, sm=0.5)
    r.tick(3)
    r.fake.go_down("Driver Not Loaded")
    r.tick()
    readings = r.sampler.readings()
    assert (readings.nvml_up, readings.gpus) == (False, ())
    assert not r.fake.is_open
    assert [d.uuid for d in r.sampler.devices()] == [GPU0, GPU1, GPU2]
    r.fake.restore()
    r.tick(every=0.5)
    assert not r.sampler.readings().nvml_up  # the first retry is 1 s after the failure
    r.tick(every=0.5)
    assert r.sampler.readings().nvml_up
    assert r.process(GPU0, PID).compute == pytest.approx(0.5)
    r.fake.go_down()
    r.tick()
    r.fake.restore()
    r.tick()  # a good open reset the backoff to 1 s
    assert r.sampler.readings().nvml_up


# -- XIDs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "healthy"),
    [
        pytest.param(79, False, id="79-fell-off-the-bus-is-critical"),
        pytest.param(48, False, id="48-double-bit-ecc-is-critical"),
        pytest.param(94, False, id="94-contained-ecc-is-critical"),
        pytest.param(13, True, id="13-graphics-engine-exception-is-the-application"),
        pytest.param(31, True, id="31-mmu-fault-is-the-application"),
        pytest.param(43, True, id="43-channel-stopped-is-the-application"),
        pytest.param(45, True, id="45-preemptive-cleanup-is-the-application"),
        pytest.param(68, True, id="68-video-processor-exception-is-the-application"),
        pytest.param(109, True, id="109-context-switch-timeout-is-the-application"),
    ],
)
def test_xids_are_counted_and_critical_ones_mark_the_gpu_unhealthy(
    code: int, healthy: bool
) -> None:
    r = rig()
    r.tick()
    r.fake.add_xid(GPU2, 13)
    r.fake.add_xid(GPU2, code)
    r.tick(3)
    gpu = r.gpu(GPU2)
    assert (gpu.healthy, gpu.xid_errors, gpu.last_xid) == (healthy, 2, code)
    assert all(g.healthy for g in r.sampler.readings().gpus if g.device.uuid != GPU2)


def test_critical_xid_lasts_until_nvml_reopens_and_the_gpu_answers() -> None:
    r = rig(reopen_interval=10.0)
    r.tick()
    r.fake.add_xid(GPU0, 79)
    r.tick(60)
    assert not r.gpu(GPU0).healthy  # nothing else is wrong, so nothing reopens NVML
    r.fake.lose(GPU2)
    r.tick(10)  # GPU2 is lost: a reopen; GPU0 answers on the fresh NVML
    assert r.gpu(GPU0).healthy
    assert r.gpu(GPU0).xid_errors == 1


# -- health and the thread -----------------------------------------------------------------


@dataclass(frozen=True)
class Trouble:
    before_start: bool  # broken from the first tick, or once running
    cause: Callable[[FakeReader], None]
    fix: Callable[[FakeReader], None]
    warnings: tuple[str, ...]


TROUBLES = {
    "nvml-will-not-open": Trouble(
        True,
        lambda fake: fake.fail_open(),
        FakeReader.restore,
        ("nvml: NVML failed to initialise: NVML Shared Library Not Found",),
    ),
    "nvml-goes-down": Trouble(  # gone, then cannot open: two messages, then quiet
        False,
        lambda fake: fake.go_down(),
        FakeReader.restore,
        ("nvml: NVML: Driver Not Loaded", "nvml: NVML failed to initialise: Driver Not Loaded"),
    ),
    "gpu-lost": Trouble(
        False,
        lambda fake: fake.lose(GPU1),
        lambda fake: fake.recover(GPU1),
        (f"nvml: {GPU1} (index 1): GPU is lost",),
    ),
}


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in TROUBLES])
def test_health_logs_once_per_change_of_state(name: str, caplog: pytest.LogCaptureFixture) -> None:
    trouble = TROUBLES[name]
    r = rig(reopen_interval=5.0)
    caplog.set_level(logging.INFO, logger="test.health")
    if not trouble.before_start:
        r.tick()
    trouble.cause(r.fake)
    r.tick(40)
    trouble.fix(r.fake)
    r.tick(70)
    logged = [(record.levelname, record.getMessage()) for record in caplog.records]
    warnings = [("WARNING", warning) for warning in trouble.warnings]
    assert logged == [*warnings, ("INFO", "nvml recovered")]
    assert r.health.snapshot().up[NVML]
    assert r.health.snapshot().errors[NVML] >= 1


def test_sample_age_and_devices_before_and_after_the_first_tick() -> None:
    r = rig()
    assert (r.sampler.readings().sample_age, r.sampler.devices()) == (None, [])
    r.tick()
    r.clock.now += 2.5
    assert r.sampler.readings().sample_age == 2.5
    assert [d.index for d in r.sampler.devices()] == [0, 1, 2]


def test_thread_samples_until_stopped() -> None:
    fake = FakeReader.typical(gpus=2, processes_per_gpu=4)
    sampler = Sampler(fake, Health(logging.getLogger("test.health")), interval=0.01)
    assert not sampler.alive
    sampler.start()
    eventually(
        "len(fake.utilization_calls) >= 10",
        lambda: len(fake.utilization_calls) >= 10,
        5.0,
        interval=0.005,
    )
    assert sampler.alive
    readings = sampler.readings()
    assert readings.nvml_up
    assert [len(g.processes) for g in readings.gpus] == [4, 4]
    sampler.stop()
    assert not sampler.alive
    assert not fake.is_open
    assert not any(t.name == "gpupack-sampler" for t in threading.enumerate())


class Exploding(FakeReader):
    """A reader with a bug: its status raises a plain exception `failures` times."""

    failures = 0

    def status(self, device: Device) -> DeviceStatus:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("bug below the sampler")
        return super().status(device)


def test_thread_survives_an_exception_and_counts_it() -> None:
    fake = Exploding.typical(gpus=1, processes_per_gpu=1)
    fake.failures = 3
    health = Health(logging.getLogger("test.health"))
    sampler = Sampler(fake, health, interval=0.01)
    sampler.start()
    try:
        eventually(
            "fake.failures == 0 and sampler.readings().gpus != ()",
            lambda: fake.failures == 0 and sampler.readings().gpus != (),
            5.0,
            interval=0.005,
        )
        eventually(
            "health.snapshot().up.get(NVML) is True",
            lambda: health.snapshot().up.get(NVML) is True,
            5.0,
            interval=0.005,
        )
        assert sampler.alive
        assert health.snapshot().errors[NVML] == 3
    finally:
        sampler.stop()
