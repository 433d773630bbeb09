"""The churn replay on a hand-written trace (no timing): what it counts, and that
consolidation empties the GPUs churn left part-used."""

import json
from pathlib import Path

import pytest

from benchmarks.churn import __main__ as churn
from benchmarks.churn import scaledown
from benchmarks.churn.replay import read_timed, replay
from benchmarks.openb import trace
from gpupack.policy import ConsolidationMode

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
"""
# Two 600m pods take a GPU each; two 400m pods fill the room beside them; the 600m pods
# leave at 50 s: two GPUs hold 400m each until 1000 s, where one would do. (The node has
# two GPUs: in a cluster only held GPUs exist, and a moved pod has the other to go to.)
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
big-0,1000,1024,1,600,,LS,Running,0,50,0
big-1,1000,1024,1,600,,LS,Running,0,50,0
small-0,1000,1024,1,400,,LS,Running,1,1000,1
small-1,1000,1024,1,400,,LS,Running,2,1000,2
never,1000,1024,1,500,,LS,Pending,3,900,
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_pods_that_never_ran_are_left_out_and_lists_without_times_are_none(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    timed = read_timed(files[1])

    assert timed is not None
    assert [t.pod.name for t in timed] == ["big-0", "big-1", "small-0", "small-1"]
    five = tmp_path / "openb_pod_list_multigpu.csv"
    five.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\n")
    assert read_timed(five) is None


@pytest.mark.parametrize("policy", churn.POLICIES)
def test_consolidation_empties_the_gpu_churn_left_part_used(
    files: tuple[Path, Path], policy: str
) -> None:
    nodes, pods = trace.read_nodes(files[0]), read_timed(files[1])
    assert pods is not None

    off = replay("tiny", policy, ConsolidationMode.OFF, nodes, pods)
    on = replay("tiny", policy, ConsolidationMode.ON, nodes, pods, interval=10)

    # Over [50, 1000) two GPUs held for a bound of one; over [0, 50) two for two.
    assert off.gpu_ratio == pytest.approx((2 * 950 + 2 * 50) / (1 * 950 + 2 * 50), rel=0.01)
    assert on.evictions == 1
    assert on.gpu_ratio < off.gpu_ratio
    assert on.gpu_ratio == pytest.approx(1.0, abs=0.02)
    assert off.evictions == 0
    # IdleGPUs moves nothing: 400m is above the default idleBelow (0.25 of a GPU).
    idle = replay("tiny", policy, ConsolidationMode.IDLE, nodes, pods, interval=10)
    assert idle.evictions == 0


def test_the_last_line_is_one_json_object_per_workload_policy_and_mode(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert churn.main(["--nodes", str(files[0]), "--pods", str(files[1]), "--policy", "fgd"]) == 0

    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["workloads"]["tiny"]["fgd"]) == {"Off", "IdleGPUs", "On"}
    assert out["workloads"]["tiny"]["fgd"]["On"]["evictions"] == 1


def test_a_live_deletion_cost_and_consolidation_each_hold_fewer_gpus_than_no_cost() -> None:
    default, _ = scaledown.run("default", 0, 300, nodes=4, deployments=6)
    live, _ = scaledown.run("live-cost", 0, 300, nodes=4, deployments=6)
    moved, evictions = scaledown.run("consolidation", 0, 300, nodes=4, deployments=6)

    assert live < default
    assert moved < default
    assert evictions > 0
