"""The image carries every package the distribution ships."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_dockerfile_copies_every_package_and_every_entrypoint_is_installed() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    copied = set(re.findall(r"^COPY (\w+) \1$", (ROOT / "Dockerfile").read_text(), re.MULTILINE))

    assert packages <= copied, f"not copied into the image: {packages - copied}"
    for entry in project["project"]["scripts"].values():
        assert entry.split(".")[0] in packages, entry
