"""The layout's promises that import-linter cannot state: no component imports an HTTP
or Kubernetes client module (not even the standard library's `http.client`), and the
local-cluster harness stays in modules a newcomer can read."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("webhook", "scheduler", "exporter", "node", "ops", "recommender", "certs")
CLIENT_MODULES = ("urllib3", "kubernetes", "http.client")
HACK_MODULE_LINES = 600


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def clients_imported(path: Path) -> list[str]:
    return sorted(
        name
        for name in imported_modules(path)
        if any(name == client or name.startswith(client + ".") for client in CLIENT_MODULES)
    )


@pytest.mark.parametrize(
    "path",
    sorted(p for component in COMPONENTS for p in (ROOT / component).rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_components_talk_to_kubernetes_only_through_the_runtime(path: Path) -> None:
    assert not clients_imported(path), f"use gpupack.runtime instead of {clients_imported(path)}"


def test_the_check_sees_client_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import http.client\nfrom kubernetes import client\nfrom http import server\n"
    )
    assert clients_imported(module) == ["http.client", "kubernetes", "kubernetes.client"]


@pytest.mark.parametrize(
    "path", sorted((ROOT / "hack").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_module_of_the_harness_is_longer_than_600_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= HACK_MODULE_LINES, f"{lines} lines: split it by concept"
