"""The openb replay harness on a tiny hand-written cluster and trace (no timing)."""

import json
from pathlib import Path

import pytest

from benchmarks.openb import run, table, trace
from benchmarks.openb.replay import POLICIES, replay

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
n1,16000,65536,1,P100
n2,96000,393216,8,G2
"""
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,4000,8192,1,500,,LS,Running,0,10,0
p1,4000,8192,1,500,,LS,Running,0,10,0
p2,8000,16384,1,1000,,LS,Running,0,10,0
p3,2000,4096,0,0,,BE,Running,0,10,0
p4,16000,32768,4,1000,,LS,Running,0,10,0
p5,3000,8192,1,300,T4|P100,LS,Running,0,10,0
p6,60000,65536,2,1000,,LS,Running,0,10,0
"""
MULTIGPU_PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli
p0,4000,8192,1,500
p1,8000,16384,2,1000
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_arrivals_clone_pods_up_to_130_percent_of_capacity(files: tuple[Path, Path]) -> None:
    nodes, pods = trace.read_nodes(files[0]), trace.read_pods(files[1])
    capacity = trace.capacity(nodes)

    arriving = trace.arrivals(pods, 42, capacity)

    total = sum(p.gpu_milli for p in arriving)
    assert capacity == 11_000
    assert total <= 1.3 * capacity
    assert len(arriving) > len(pods)
    assert arriving == trace.arrivals(pods, 42, capacity)
    assert arriving != trace.arrivals(pods, 43, capacity)


def test_arrivals_drop_pods_when_the_trace_alone_exceeds_the_target(
    files: tuple[Path, Path],
) -> None:
    pods = trace.read_pods(files[1])

    arriving = trace.arrivals(pods, 42, 5000)

    assert sum(p.gpu_milli for p in arriving) <= 1.3 * 5000
    assert len(arriving) < len(pods)


def test_requests_carry_the_trace_pod_and_no_gpu_memory() -> None:
    pod = trace.TracePod("p", 3000, 1024, 1, 300, "T4|P100")

    request = trace.request(pod, 7)

    assert (request.key, request.cpu, request.memory) == ("openb/p-7", 3000, 1024 * 2**20)
    assert (request.compute, request.gpus, request.gpu_memory) == (300, 1, 0)
    assert request.models == frozenset({"T4", "P100"})
    assert trace.request(trace.TracePod("c", 1000, 1, 0, 0), 0).gpus == 0


def test_gpus_carry_their_model_memory(files: tuple[Path, Path]) -> None:
    snapshot = trace.snapshot(trace.read_nodes(files[0]), replicas=2)

    assert len(snapshot.nodes) == 6
    assert snapshot.gpus["n0-gpu1"].memory == 15109 * 2**20
    assert snapshot.gpus["n2-x1-gpu7"].model == "G2"


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_replays_deterministically(files: tuple[Path, Path], policy: str) -> None:
    nodes, pods = trace.read_nodes(files[0]), trace.read_pods(files[1])

    first = replay(policy, 42, nodes, pods)
    again = replay(policy, 42, nodes, pods)

    assert first.alloc_pct == pytest.approx(again.alloc_pct, nan_ok=True)
    assert (first.failed, first.gpus_used, first.nodes_used) == (
        again.failed,
        again.gpus_used,
        again.nodes_used,
    )
    assert 0 <= first.unallocated_pct <= 100
    assert first.failed > 0  # 130 % of the capacity arrives: something must fail
    assert first.first_failure_arrived_pct is not None
    assert 0 < first.gpus_used <= 11
    assert 0 < first.nodes_used <= 3


def test_the_cli_prints_one_json_line_last(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    multigpu = tmp_path / "openb_pod_list_multigpu.csv"
    multigpu.write_text(MULTIGPU_PODS)

    code = run.main(
        [
            "--nodes", str(files[0]),
            "--pods", str(multigpu),
            "--seeds", "42,43",
            "--policy", "gpupack", "bestfit",
            "--workers", "1",
            "--published", str(tmp_path / "missing.csv"),
        ]
    )  # fmt: skip

    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["seeds"] == [42, 43]
    assert set(report["policies"]) == {"gpupack", "bestfit"}
    assert 0 <= report["policies"]["bestfit"]["unallocated_pct"] <= 100
    assert "GPU memory derived" in report["gpu_memory"]


@pytest.mark.parametrize(
    ("text", "seeds"),
    [pytest.param("42..45", [42, 43, 44, 45], id="range"), pytest.param("7,9", [7, 9], id="list")],
)
def test_seeds_are_a_range_or_a_list(text: str, seeds: list[int]) -> None:
    assert run.parse_seeds(text) == seeds


def test_the_table_replays_every_workload_and_compares_with_the_published(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "openb_pod_list_multigpu.csv").write_text(MULTIGPU_PODS)
    published = tmp_path / "fgd_expected_results" / "summary_by_arrival.csv"
    published.parent.mkdir()
    rows = ["workload,policy,arrived_pct,alloc_pct_mean"]
    rows += [f"tiny,FGD,{pct},{0.0 if pct < 100 else 1.0}" for pct in range(101)]
    published.write_text("\n".join(rows) + "\n")

    code = table.main(
        [
            "--data", str(tmp_path),
            "--nodes", str(files[0]),
            "--seeds", "42,43",
            "--policy", "gpupack", "fgd",
            "--workers", "1",
            "--markdown",
        ]
    )  # fmt: skip

    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads(lines[-1])
    by_workload = {r["workload"]: r for r in report["rows"]}
    assert set(by_workload) == {"multigpu", "tiny"}
    tiny = by_workload["tiny"]
    assert tiny["published_FGD"] == 99.0  # 100 - alloc % at 100 % arrived
    assert tiny["vs_published_fgd"] == round(tiny["gpupack"] - 99.0, 2)
    assert tiny["vs_fgd"] == round(tiny["gpupack"] - tiny["fgd"], 2)
    assert "published_FGD" not in by_workload["multigpu"]
    assert any(line.startswith("| tiny |") for line in lines)


def test_the_table_names_a_workload_it_cannot_find(files: tuple[Path, Path]) -> None:
    with pytest.raises(SystemExit, match="no pod list for nope"):
        table.main(["--data", str(files[1].parent), "--workload", "nope", "--workers", "1"])


def test_the_table_replays_variants_made_from_the_default_trace(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "openb_pod_list_default.csv").write_text(PODS)
    common = ["--data", str(data), "--nodes", str(files[0]), "--seeds", "42", "--workers", "1"]

    code = table.main([*common, "--policy", "gpupack", "--variants", "share50", "cpu30"])

    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["workload"] for r in report["rows"]] == ["share50", "cpu30"]
    with pytest.raises(SystemExit):
        table.main([*common, "--variants", "gpushare40"])
    assert "share<P>, multi<P>, cpu<P>, spec<P>" in capsys.readouterr().err
