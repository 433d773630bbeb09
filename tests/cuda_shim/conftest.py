"""Fixtures of the memory shim's tests: the shim and its doubles built once per session
(plain, and under the address and thread sanitizers), and a pretend pod per test."""

from pathlib import Path

import pytest

from doubles.shim_build import Build
from tests.cuda_shim.harness import Pod


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Build:
    return Build(tmp_path_factory.mktemp("shim")).make()


@pytest.fixture(scope="session")
def address_sanitized(tmp_path_factory: pytest.TempPathFactory) -> Build:
    return Build(tmp_path_factory.mktemp("shim-address"), sanitize="address").make()


@pytest.fixture(scope="session")
def thread_sanitized(tmp_path_factory: pytest.TempPathFactory) -> Build:
    return Build(tmp_path_factory.mktemp("shim-thread"), sanitize="thread").make()


@pytest.fixture
def pod(built: Build, tmp_path: Path) -> Pod:
    return Pod(built, tmp_path)
