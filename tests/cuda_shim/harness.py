"""A pretend pod for the memory shim's tests: its directory, the fake GPUs its processes
share, and the ways to run programs in it.

Each case runs the C probe (probe.c) or Python through ctypes in fresh processes with the
shim in LD_PRELOAD, as /etc/ld.so.preload loads it in a pod, over the pod's directory
(`limit`, `budget`). The fake devices are a file the test's processes share, so what the
driver really holds is checked (`used`, `peak`), not what the shim says it holds.
"""

import os
import signal
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from doubles.shim_build import Build
from gpupack import cuda
from gpupack.budget import Budget, read_budget

MIB = 1 << 20
GIB = 1 << 30
LIMIT = GIB
CONTEXT = 64 * MIB  # what a context takes on the fake device
MODES = ("linked", "dlsym", "gpa", "gpa-ptds")
OK, OOM = 0, 2
GPU0 = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"  # the fake device 0's UUID


@dataclass
class Run:
    stdout: str
    stderr: str

    def rc(self, op: str, nth: int = 0) -> int:
        found = [line for line in self.stdout.splitlines() if line.startswith(f"{op} rc=")]
        return int(found[nth].split("rc=")[1].split()[0])

    def value(self, op: str, key: str, nth: int = 0) -> int:
        found = [line for line in self.stdout.splitlines() if line.startswith(f"{op} ")]
        fields = dict(part.split("=", 1) for part in found[nth].split()[1:])
        return int(fields[key])

    def values(self, op: str, key: str) -> list[int]:
        found = [line for line in self.stdout.splitlines() if line.startswith(f"{op} ")]
        return [int(dict(p.split("=", 1) for p in line.split()[1:])[key]) for line in found]


@dataclass
class Pod:
    """A pretend pod: its shim directory and the fake GPUs its processes share (in `root`,
    or in `gpus` where several pods share them: `SharedGpu`)."""

    build: Build
    root: Path
    limit: int | None = LIMIT
    gpus: Path | None = None

    def __post_init__(self) -> None:
        (self.root / "pod").mkdir(parents=True, exist_ok=True)
        if self.limit is not None:
            (self.root / "pod" / "limit").write_text(f"{self.limit}\n")

    @property
    def directory(self) -> Path:
        return self.root / "pod"

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        (self.directory / "limit").write_text(f"{limit}\n")

    def env(self, *, shim: bool = True, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(self.build.root),
            "GPUPACK_CUDA_DIR": str(self.directory),
            "FAKE_CUDA_STATE": str((self.gpus or self.root) / "device"),
            "FAKE_CUDA_CLOCK": str((self.gpus or self.root) / "clock"),
            "FAKE_CUDA_CONTEXT": str(CONTEXT),
            "ASAN_OPTIONS": "verify_asan_link_order=0:halt_on_error=1",
            "TSAN_OPTIONS": "halt_on_error=1",
            "LSAN_OPTIONS": f"suppressions={Path(__file__).parent / 'lsan.supp'}:print_suppressions=0",
        }
        if shim:
            env["LD_PRELOAD"] = str(self.build.shim)
        env.update(extra or {})
        return env

    def probe(self, mode: str, *ops: str, shim: bool = True, **extra: str) -> Run:
        done = subprocess.run(
            [str(self.build.probe), mode, *ops],
            env=self.env(shim=shim, extra=extra),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return Run(done.stdout, done.stderr)

    def start(self, mode: str, *ops: str, **extra: str) -> "subprocess.Popen[str]":
        proc = subprocess.Popen(
            [str(self.build.probe), mode, *ops, "hold"],
            env=self.env(extra=extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "holding":
                return proc
        raise AssertionError(f"the probe never held: {proc.communicate()}")

    @staticmethod
    def kill(proc: "subprocess.Popen[str]") -> None:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()

    def python(self, source: str, *, args: tuple[str, ...] = (), **extra: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", source, *args],
            env=self.env(extra=extra),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return str(done.stdout)

    def budget(self) -> Budget:
        return read_budget((self.directory / "budget").read_bytes())


def cubin(globals_bytes: int) -> bytes:
    """A cubin (ELF for EM_CUDA) whose __device__ globals take `globals_bytes`: a
    .nv.global section (uninitialised, as nvcc writes large arrays) beside a kernel's."""
    names = b"\0.shstrtab\0.nv.global\0.text.kernel\0"
    text = bytes(16)
    names_at, text_at = 64, 64 + len(names)
    table_at = (text_at + len(text) + 7) // 8 * 8
    header = b"\x7fELF\x02\x01\x01" + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 1, 190, 1, 0, 0, table_at, 0, 64, 0, 0, 64, 4, 1)

    def section(name: int, kind: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)

    table = (
        section(0, 0, 0, 0)
        + section(1, 3, names_at, len(names))  # .shstrtab: STRTAB
        + section(11, 8, 0, globals_bytes)  # .nv.global: NOBITS
        + section(22, 1, text_at, len(text))  # .text.kernel: PROGBITS
    )
    body = header + names + text
    return body + bytes(table_at - len(body)) + table


def fake_module(globals_bytes: int) -> bytes:
    """An image only the driver can size (PTX, a compressed fatbin): the fake driver
    takes `globals_bytes` when it loads it."""
    return f"FAKEMOD globals={globals_bytes}".encode() + b"\0"


@dataclass
class SharedGpu:
    """Pods on one fake GPU: its memory and clock, and the `gpu-time` file the node agent
    links into the directory of each pod of the GPU (`gpupack.cuda.GPU_TIME`)."""

    build: Build
    root: Path

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / cuda.GPU_TIME).write_bytes(bytes(cuda.GPU_TIME_BYTES))

    def pod(self, name: str, compute: str | None) -> Pod:
        """A pod of the GPU; `compute` is its `compute` file ("300 share"), None for none."""
        pod = Pod(self.build, self.root / name, gpus=self.root)
        if compute is not None:
            (pod.directory / cuda.COMPUTE).write_text(f"{compute}\n")
        os.link(self.root / cuda.GPU_TIME, pod.directory / cuda.GPU_TIME)
        return pod
