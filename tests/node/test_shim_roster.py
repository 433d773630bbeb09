"""The node agent's roster of memory-shim processes: what it answers, and what it refuses."""

from pathlib import Path

import pytest

from gpupack import budget
from node import shim_roster

UID = "5b1c0d3e-0000-4000-8000-000000000001"


def test_a_pod_without_a_budget_has_no_processes(tmp_path: Path) -> None:
    assert budget.read_roster(shim_roster.answer(tmp_path, UID.encode() + b"\n")) == frozenset()


@pytest.mark.parametrize("request_", [b"../../etc\n", b"\n", b"5b1c0d3e/../x\n", b"\xff\xfe\n"])
def test_anything_but_a_pod_uid_is_refused(tmp_path: Path, request_: bytes) -> None:
    with pytest.raises(budget.BudgetError, match="not a pod UID"):
        budget.read_roster(shim_roster.answer(tmp_path, request_))


def test_a_budget_of_another_layout_is_an_error_naming_the_pod(tmp_path: Path) -> None:
    path = shim_roster.budget_path(tmp_path, UID)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GPUPACK1" + bytes(budget.BYTES))
    with pytest.raises(budget.BudgetError, match=f"the budget of pod {UID}: not a GPUPACK2"):
        budget.read_roster(shim_roster.answer(tmp_path, UID.encode()))


def test_an_unused_budget_has_no_processes(tmp_path: Path) -> None:
    path = shim_roster.budget_path(tmp_path, UID)
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(budget.BYTES))  # as the CSI driver makes it
    assert budget.read_roster(shim_roster.answer(tmp_path, UID.encode())) == frozenset()
