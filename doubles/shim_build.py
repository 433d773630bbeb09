"""Builds the memory shim and its test doubles with the machine's C compiler.

`Build(root, sanitize)` compiles, into `root`: libgpupack-cuda.so (the shim, with the
chart image's flags plus `sanitize`), the fake driver `libcuda.so.1` and fake NVML
`libnvidia-ml.so.1` (never sanitized: they stand for NVIDIA's binaries), and `probe`,
linked against the fake driver as an application is against the real one.
"""

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM_DIR = ROOT / "cuda-shim"
HERE = ROOT / "tests" / "cuda_shim"  # the fake driver's and the probe's C sources
# The fake driver's parts (fake_cuda.h says what each models).
FAKE_DRIVER = (
    "fake_cuda.c",
    "fake_memory.c",
    "fake_graphs.c",
    "fake_lookup.c",
    "fake_device.c",
    "fake_clock.c",
)


def shim_sources() -> list[str]:
    """The shim's C files, in a stable order: what the image's builder compiles."""
    return sorted(str(path) for path in SHIM_DIR.glob("*.c"))


# What the image's builder stage uses (the Dockerfile reads the same file); the tests add
# warnings as errors. -Bsymbolic-functions: what the shim hands out as its wrappers are its
# own functions, never an interposer's of the same name loaded before it.
SHIM_FLAGS = tuple((SHIM_DIR / "build-flags").read_text().split())
SANITIZERS = {
    "": (),
    "address": (
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-fno-omit-frame-pointer",
    ),
    "thread": ("-fsanitize=thread",),
}


def compiler() -> str:
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not found:
        raise RuntimeError("no C compiler (cc or gcc) on PATH: the shim's tests build it")
    return found


def compile_c(*args: str) -> None:
    done = subprocess.run([compiler(), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}\n{done.stderr}")


@dataclass(frozen=True)
class Build:
    root: Path
    sanitize: str = ""

    @property
    def shim(self) -> Path:
        return self.root / "libgpupack-cuda.so"

    @property
    def probe(self) -> Path:
        return self.root / "probe"

    def make(self) -> "Build":
        self.root.mkdir(parents=True, exist_ok=True)
        extra = SANITIZERS[self.sanitize]
        warnings = ("-g", "-Wall", "-Wextra", "-Werror")
        compile_c(
            *SHIM_FLAGS,
            *warnings,
            *extra,
            "-I",
            str(SHIM_DIR),
            "-o",
            str(self.shim),
            *shim_sources(),
            "-ldl",
            "-lpthread",
        )
        device = str(HERE / "fake_device.c")
        compile_c(
            "-O1",
            "-g",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wl,-soname,libcuda.so.1",
            "-Wl,-Bsymbolic",  # its lookup hands out its own functions, as NVIDIA's does
            "-o",
            str(self.root / "libcuda.so.1"),
            *(str(HERE / name) for name in FAKE_DRIVER),
            "-lpthread",
        )
        compile_c(
            "-O1",
            "-g",
            "-fPIC",
            "-shared",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(self.root / "libnvidia-ml.so.1"),
            str(HERE / "fake_nvml.c"),
            device,
        )
        link = self.root / "libcuda.so"
        link.unlink(missing_ok=True)
        link.symlink_to("libcuda.so.1")
        compile_c(
            "-O1",
            *warnings,
            *extra,
            "-o",
            str(self.probe),
            str(HERE / "probe.c"),
            f"-L{self.root}",
            "-Wl,--no-as-needed",  # its references are weak: libcuda is needed all the same
            "-lcuda",
            "-ldl",
            "-lpthread",
            "-Wl,-rpath,$ORIGIN",
        )
        return self
