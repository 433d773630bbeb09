"""The image users pull, as `hack/test` builds it from the Dockerfile (hack/lib/image.sh:
buildah on a Debian-made Python base): what it holds and that every entrypoint starts in
it under a real OCI runtime (runc), as the user the Dockerfile names."""

import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def archive() -> Path:
    path = os.environ.get("GPUPACK_IMAGE_ARCHIVE", "")
    assert path, (
        "GPUPACK_IMAGE_ARCHIVE is set by hack/lib/image.sh: run the tests through hack/test"
    )
    return Path(path)


@pytest.fixture(scope="module")
def layout(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive unpacked: an OCI image layout."""
    folder = tmp_path_factory.mktemp("image")
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    return folder


def blob(layout: Path, digest: str) -> bytes:
    algorithm, value = digest.split(":")
    return (layout / "blobs" / algorithm / value).read_bytes()


@pytest.fixture(scope="module")
def manifest(layout: Path) -> dict[str, Any]:
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    found: dict[str, Any] = json.loads(blob(layout, entry["digest"]))
    return found


def test_the_image_runs_as_the_dockerfiles_non_root_user_with_the_venv_on_path(
    layout: Path, manifest: dict[str, Any]
) -> None:
    config = json.loads(blob(layout, manifest["config"]["digest"]))["config"]
    assert config["User"] == "65532:65532"
    path = next(e for e in config["Env"] if e.startswith("PATH="))
    assert path.startswith("PATH=/opt/gpupack/bin:")


def test_the_image_installs_the_locked_versions_and_no_compiler(
    layout: Path, manifest: dict[str, Any]
) -> None:
    names: set[str] = set()
    for layer in manifest["layers"]:
        algorithm, value = layer["digest"].split(":")
        with tarfile.open(layout / "blobs" / algorithm / value) as tar:
            names.update(tar.getnames())
    site = "opt/gpupack/lib/python3.11/site-packages"
    lock = (ROOT / "hack" / "requirements.lock").read_text()
    for package in ("uvicorn", "starlette", "kubernetes", "cryptography", "grpcio"):
        (version,) = re.findall(rf"^{package}==(\S+)", lock, re.MULTILINE)
        assert f"{site}/{package}-{version}.dist-info/METADATA" in names, package
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for script in scripts:
        assert f"opt/gpupack/bin/{script}" in names, script
    assert not [n for n in names if re.search(r"(^|/)bin/(gcc|cc|g\+\+|go)(-[0-9.]+)?$", n)]
    # The memory shim the node agents hand out, built in its own stage.
    assert "opt/gpupack/lib/libgpupack-cuda.so" in names


def test_the_images_memory_shim_exports_what_it_wraps_and_links_only_glibc(bundle: Path) -> None:
    shim = bundle / "rootfs" / "opt" / "gpupack" / "lib" / "libgpupack-cuda.so"
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(shim)], capture_output=True, text=True, check=True
    ).stdout.split()
    for name in ("cuMemAlloc_v2", "cuMemCreate", "cuMemGetInfo_v2", "cuGetProcAddress_v2",
                 "nvmlDeviceGetMemoryInfo", "dlsym"):  # fmt: skip
        assert name in symbols, name
    needed = subprocess.run(
        ["readelf", "-d", str(shim)], capture_output=True, text=True, check=True
    ).stdout
    libraries = re.findall(r"\(NEEDED\).*\[(.+)\]", needed)
    assert set(libraries) <= {"libc.so.6", "libdl.so.2", "libpthread.so.0"}, libraries
    assert oct(shim.stat().st_mode & 0o777) == "0o644"


@pytest.fixture(scope="module")
def bundle(
    layout: Path, manifest: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """An OCI runtime bundle of the image (umoci unpack: its config.json carries the
    image's user, environment and working directory)."""
    for tool in ("umoci", "runc"):
        assert shutil.which(tool), (
            f"{tool} is installed by hack/lib/image.sh: run through hack/test"
        )
    reference = manifest.get("annotations", {}).get("org.opencontainers.image.ref.name")
    index = json.loads((layout / "index.json").read_text())
    tag = reference or index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    folder = tmp_path_factory.mktemp("bundle") / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{layout}:{tag}", str(folder)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_every_entrypoint_starts_in_the_image_under_runc(bundle: Path) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    config = json.loads((bundle / "config.json").read_text())
    checks = " && ".join(f"{script} --help >/dev/null" for script in sorted(scripts))
    config["process"]["args"] = ["sh", "-c", f"id -u && {checks} && echo entrypoints-ok"]
    config["process"]["terminal"] = False
    (bundle / "config.json").write_text(json.dumps(config))
    result = subprocess.run(
        ["runc", "run", "--bundle", str(bundle), f"gpupack-image-test-{os.getpid()}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["65532", "entrypoints-ok"]
