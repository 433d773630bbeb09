"""The shim is loaded into every process of a pod, so it must be safe in each: beside other
interposers and tracers, in setuid programs run by anyone, over a budget that is not what
it should be; and where it cannot keep the pod's limit, it says so and gives nothing."""

import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from doubles.shim_build import HERE, Build, compile_c
from tests.cuda_shim.harness import CONTEXT, GIB, LIMIT, MIB, OK, OOM, Pod

# A tracer as users preload them: it wraps cuMemAlloc_v2 and finds the next one with
# dlsym(RTLD_NEXT), from a library loaded before the shim (LD_PRELOAD comes before
# /etc/ld.so.preload).
TRACER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
typedef int (*alloc_fn)(unsigned long long *, size_t);
int cuMemAlloc_v2(unsigned long long *p, size_t n) {
  static alloc_fn next;
  if (!next) next = (alloc_fn)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
  fprintf(stderr, "tracer: cuMemAlloc_v2 of %zu\n", n);
  return next ? next(p, n) : 999;
}
"""


@pytest.fixture(scope="module")
def tracer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tracer")
    (root / "tracer.c").write_text(TRACER)
    compile_c(
        "-O1", "-fPIC", "-shared", "-o", str(root / "libtracer.so"), str(root / "tracer.c"), "-ldl"
    )
    return root / "libtracer.so"


# Linked, the program calls the tracer, which calls the shim; through dlsym on libcuda's
# handle it asks libcuda itself, which the tracer never stood in front of.
@pytest.mark.parametrize(("mode", "traced"), [("linked", 2), ("dlsym", 0)])
def test_an_interposer_preloaded_before_the_shim_finds_it_through_rtld_next(
    pod: Pod, tracer: Path, mode: str, traced: int
) -> None:
    run = pod.probe(
        mode, "ctx", f"alloc:{700 * MIB}", f"alloc:{700 * MIB}", "info",
        LD_PRELOAD=f"{tracer}:{pod.build.shim}",
    )  # fmt: skip
    assert run.stderr.count("tracer: cuMemAlloc_v2") == traced
    assert run.rc(f"alloc:{700 * MIB}") == OK
    assert run.rc(f"alloc:{700 * MIB}", 1) == OOM  # and the shim behind it held the pod
    assert run.value("info", "free") == LIMIT - CONTEXT - 700 * MIB


def test_a_budget_that_is_a_symbolic_link_is_not_followed(pod: Pod, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not a budget\n")
    elsewhere.chmod(0o600)
    (pod.directory / "budget").symlink_to(elsewhere)
    run = pod.probe("linked", "ctx", "info", f"alloc:{MIB}")
    assert run.value("info", "free") == 0  # a limit it cannot keep: nothing is free
    assert run.rc(f"alloc:{MIB}") == OOM
    assert "cannot use the budget" in run.stderr
    assert elsewhere.read_text() == "not a budget\n"
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"GPUPACK1" + bytes(65592), "it is 65600 bytes, not the 200704 of this shim's layout"),
        (b"GPUPACK9" + bytes(200696), "another version of the shim made it (GPUPACK9"),
    ],
)
def test_a_budget_of_another_layout_is_not_used(pod: Pod, content: bytes, said: str) -> None:
    (pod.directory / "budget").write_bytes(content)
    run = pod.probe("linked", "ctx", "info", f"alloc:{MIB}", "total")
    assert said in run.stderr
    assert run.value("info", "free") == 0
    assert run.value("total", "total") == LIMIT
    assert run.rc(f"alloc:{MIB}") == OOM
    assert (pod.directory / "budget").read_bytes() == content  # untouched


def test_a_budget_it_cannot_open_reports_nothing_free_and_refuses(pod: Pod) -> None:
    (pod.directory / "budget").mkdir()
    run = pod.probe("gpa", "ctx", "info", f"alloc:{MIB}", "info1")
    assert run.value("info", "free") == 0
    assert run.value("info1", "free") == 0
    assert run.rc(f"alloc:{MIB}") == OOM


# ---- setuid programs ----

NOBODY = 65534


@pytest.fixture
def setuid_probe(built: Build) -> Iterator[Path]:
    """The probe as a setuid-root program, with its libraries where a setuid program
    finds them (an absolute run path: LD_LIBRARY_PATH is ignored there), in a directory
    an unprivileged user reaches."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it makes a setuid-root program and a mount namespace")
    base = Path(tempfile.mkdtemp(prefix="gpupack-setuid-", dir="/tmp"))
    try:
        base.chmod(0o755)
        lib = base / "lib"
        lib.mkdir(mode=0o755)
        for name in ("libgpupack-cuda.so", "libcuda.so.1", "libnvidia-ml.so.1"):
            shutil.copy(built.root / name, lib / name)
            (lib / name).chmod(0o755)
        (lib / "libcuda.so").symlink_to("libcuda.so.1")
        probe = base / "probe"
        compile_c(
            "-O1", "-o", str(probe), str(HERE / "probe.c"), f"-L{lib}", "-Wl,--no-as-needed", "-lcuda", "-ldl",
            "-lpthread", f"-Wl,-rpath,{lib}",
        )  # fmt: skip
        os.chown(probe, 0, 0)
        probe.chmod(0o4755)
        yield probe
    finally:
        shutil.rmtree(base)


def test_a_setuid_program_ignores_the_callers_directory_and_writes_nothing_through_links(
    setuid_probe: Path, tmp_path: Path
) -> None:
    """An unprivileged user runs a setuid program linked against libcuda, with the shim in
    /etc/ld.so.preload (a private mount namespace's), naming their own directory whose
    `budget` links to a root-owned 0600 file."""
    base = setuid_probe.parent
    secret = base / "secret"
    secret.write_text("root's own\n")
    secret.chmod(0o600)
    attack = base / "attack"
    attack.mkdir()
    (attack / "limit").write_text(f"{GIB}\n")
    (attack / "budget").symlink_to(secret)
    os.chown(attack, NOBODY, NOBODY)
    upper, work = tmp_path / "upper", tmp_path / "work"
    upper.mkdir()
    work.mkdir()
    (upper / "ld.so.preload").write_text(f"{base / 'lib' / 'libgpupack-cuda.so'}\n")
    script = (
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc && "
        f"exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups "
        f"env GPUPACK_CUDA_DIR={attack} FAKE_CUDA_STATE={base / 'device'} "
        f"{setuid_probe} linked ctx alloc:{2 * GIB} info"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"alloc:{2 * GIB} rc=0" in done.stdout  # no limit: the pod's directory is not here
    assert str(attack) not in done.stderr
    assert secret.read_text() == "root's own\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.stat().st_size == len("root's own\n")


def test_the_shim_needs_nothing_but_glibc(built: Build) -> None:
    """It loads into any image's processes: no libm, and no thread-local storage that
    would make it need the dynamic loader itself (the image's test checks the same of the
    image's build; this catches it before an image is built)."""
    needed = subprocess.run(
        ["readelf", "-d", str(built.shim)], capture_output=True, text=True, check=True
    ).stdout
    libraries = set(re.findall(r"\(NEEDED\).*\[(.+)\]", needed))
    assert libraries <= {"libc.so.6", "libdl.so.2", "libpthread.so.0"}, libraries
