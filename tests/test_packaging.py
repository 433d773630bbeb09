"""The image carries every package the distribution ships, and installs what the locks
pin."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def test_the_dockerfile_copies_every_package_and_every_entrypoint_is_installed() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    copied = set(re.findall(r"^COPY (\w+) \1$", (ROOT / "Dockerfile").read_text(), re.MULTILINE))

    assert packages <= copied, f"not copied into the image: {packages - copied}"
    for entry in project["project"]["scripts"].values():
        assert entry.split(".")[0] in packages, entry


NOT_SHIPPED = frozenset({"hack", "tests", "benchmarks", "doubles"})  # the repository's own


def test_every_package_on_disk_is_shipped_type_checked_layered_and_hashed_for_the_image() -> None:
    # A room added or renamed must reach every list that names the rooms: one it misses is
    # missing from the image, unchecked by mypy or outside the import contracts.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    on_disk = {
        p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name not in NOT_SHIPPED
    }
    shipped = {p.split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    hashed = (ROOT / "hack" / "lib" / "image.sh").read_text()
    listed = re.search(r"git ls-files([^|]*)\|", hashed, re.DOTALL)
    assert listed, "hack/lib/image.sh no longer lists the image's inputs with git ls-files"
    image_inputs = set(listed[1].split())

    assert on_disk == shipped
    assert on_disk <= set(project["tool"]["mypy"]["packages"])
    # The harness and the doubles are layered too: the product never imports them.
    assert on_disk == set(project["tool"]["importlinter"]["root_packages"]) - NOT_SHIPPED
    assert on_disk <= image_inputs, f"the image's hash ignores {on_disk - image_inputs}"


def test_the_contract_layer_rule_covers_every_module_of_the_contract() -> None:
    # The standard-library-only contract names its modules one by one (the runtime, a
    # subpackage, is not held to it): a new module of gpupack/ must join the list.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(
        c
        for c in project["tool"]["importlinter"]["contracts"]
        if c["name"].startswith("The contract (gpupack, less its runtime)")
    )
    modules = {f"gpupack.{p.stem}" for p in (ROOT / "gpupack").glob("*.py") if p.stem != "__init__"}
    assert set(contract["source_modules"]) == modules


def _pins(lock: str) -> dict[str, Version]:
    text = (ROOT / "hack" / lock).read_text()
    return {
        canonicalize_name(name): Version(version)
        for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.MULTILINE)
    }


def _requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"]]
    for extra in extras:
        declared += project["optional-dependencies"][extra]
    return [r for r in map(Requirement, declared) if r.marker is None or r.marker.evaluate()]


@pytest.mark.parametrize(
    ("lock", "extras"),
    [
        pytest.param("requirements.lock", (), id="image"),
        pytest.param("requirements-dev.lock", ("dev",), id="dev"),
        pytest.param("requirements-floors.lock", ("dev",), id="floors"),
    ],
)
def test_every_lock_pins_each_declared_dependency_within_its_range(
    lock: str, extras: tuple[str, ...]
) -> None:
    # The image and CI install only the locks (hack/lock writes them): a range changed in
    # pyproject.toml without `hack/lock` would test something else than users get.
    pins = _pins(lock)
    for requirement in _requirements(*extras):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{lock} does not pin {name}: run hack/lock"
        assert requirement.specifier.contains(pins[name]), f"{lock}: {name}=={pins[name]}"


def test_the_floors_lock_installs_every_runtime_dependency_at_its_floor() -> None:
    # A floor CI never installs is a guess: uvicorn>=0.30 was declared while the webhook
    # needed 0.53.
    pins = _pins("requirements-floors.lock")
    exact = {canonicalize_name(r.name) for r in _requirements("dev") if "==" in str(r.specifier)}
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert floors, f"{name} declares no floor (>=)"
        if name in exact:
            continue  # the dev tools pin it exactly; that pin is what runs
        assert pins[name].release[: len(floors[0].release)] == floors[0].release, (
            f"{name}: floor {floors[0]}, floors lock {pins[name]}"
        )
