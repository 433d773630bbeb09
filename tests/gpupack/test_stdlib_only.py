"""The contract package imports nothing but the standard library and itself (never its
runtime: `gpupack.runtime` is the I/O layer the components use).

import-linter's forbidden contract names known packages; this catches any other one.
"""

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gpupack"


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_contract_module_imports_only_the_standard_library(path: Path) -> None:
    foreign = imported_roots(path) - set(sys.stdlib_module_names) - {"gpupack"}
    assert not foreign, f"{path.name} imports {sorted(foreign)}"
    assert "gpupack.runtime" not in path.read_text(), f"{path.name} imports the runtime"


def test_the_check_sees_third_party_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import yaml\nfrom kubernetes import client\nimport json\n")
    assert imported_roots(module) - set(sys.stdlib_module_names) == {"yaml", "kubernetes"}
