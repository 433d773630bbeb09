"""Variants of the openb trace: each kind weighs what its name says, from the trace alone."""

import random
from pathlib import Path

import pytest

from benchmarks.openb import trace, variants
from benchmarks.openb.trace import TraceNode, TracePod

NODES = [TraceNode("n0", 32000, 131072, 2, "T4"), TraceNode("n1", 96000, 393216, 8, "G2")]


def pods() -> list[TracePod]:
    """A trace with every kind: sharing, whole-GPU, multi-GPU and CPU-only pods."""
    rng = random.Random(1)
    out: list[TracePod] = []
    for i in range(400):
        kind = rng.random()
        if kind < 0.3:
            out.append(TracePod(f"p{i}", 4000, 8192, 1, rng.choice([230, 470, 810])))
        elif kind < 0.7:
            out.append(TracePod(f"p{i}", 8000, 16384, 1, 1000))
        elif kind < 0.75:
            out.append(TracePod(f"p{i}", 32000, 65536, rng.choice([2, 4, 8]), 1000))
        else:
            out.append(TracePod(f"p{i}", 2000, 4096, 0, 0))
    return out


def share_of(made: list[TracePod], kind: str) -> float:
    demand = sum(p.gpu_milli for p in made)
    if kind == "sharing":
        return sum(p.gpu_milli for p in made if variants.is_sharing(p)) / demand
    return sum(p.gpu_milli for p in made if p.gpus > 1) / demand


@pytest.mark.parametrize("percent", [20, 60, 100])
def test_share_sets_the_sharing_pods_part_of_the_gpu_demand(percent: int) -> None:
    base = pods()
    made = variants.make(f"share{percent}", base, NODES, seed=0)

    assert share_of(made, "sharing") == pytest.approx(percent / 100, abs=0.03)
    assert sum(p.gpus > 0 for p in made) == sum(p.gpus > 0 for p in base)
    assert sum(p.gpus == 0 for p in made) == sum(p.gpus == 0 for p in base)


def test_multi_adds_multi_gpu_pods_until_their_part_of_the_demand() -> None:
    made = variants.make("multi40", pods(), NODES, seed=0)

    assert 0.4 <= share_of(made, "multi") < 0.45


def test_cpu_sets_the_cpu_only_pods_part_of_the_pods() -> None:
    base = pods()
    made = variants.make("cpu40", base, NODES, seed=0)

    assert sum(p.gpus == 0 for p in made) / len(made) == pytest.approx(0.4, abs=0.01)
    assert sum(p.gpus > 0 for p in made) == sum(p.gpus > 0 for p in base)


def test_spec_binds_that_part_of_the_gpu_pods_to_models_the_cluster_has() -> None:
    made = variants.make("spec30", pods(), NODES, seed=0)
    gpu_pods = [p for p in made if p.gpus > 0]
    bound = [p for p in gpu_pods if p.spec]

    assert len(bound) / len(gpu_pods) == pytest.approx(0.3, abs=0.01)
    assert all(set(p.spec.split("|")) & {"T4", "G2"} for p in bound)
    assert not any(p.spec for p in made if p.gpus == 0)


def test_kinds_join_left_to_right() -> None:
    made = variants.make("multi30-share60", pods(), NODES, seed=0)

    assert share_of(made, "sharing") == pytest.approx(0.6, abs=0.03)
    assert share_of(made, "multi") > 0.1


def test_a_variant_is_the_same_for_a_seed_and_differs_with_another() -> None:
    base = pods()

    first = variants.make("share50-cpu20", base, NODES, seed=3)

    assert first == variants.make("share50-cpu20", base, NODES, seed=3)
    assert first != variants.make("share50-cpu20", base, NODES, seed=4)
    assert [p.name for p in first[:2]] == ["openb-pod-0000", "openb-pod-0001"]


@pytest.mark.parametrize("name", ["gpushare40", "share", "share140", "share50-", "spec-20"])
def test_a_name_that_is_no_variant_says_what_is_accepted(name: str) -> None:
    with pytest.raises(ValueError, match="share<P>, multi<P>, cpu<P>, spec<P>"):
        variants.make(name, pods(), NODES, seed=0)


def test_a_written_variant_reads_back_as_the_same_pods(tmp_path: Path) -> None:
    made = variants.make("spec20-share70", pods(), NODES, seed=0)
    path = tmp_path / "openb_pod_list_spec20-share70.csv"

    variants.write(path, made)

    assert trace.read_pods(path) == made


def test_the_cli_writes_the_held_out_variants(tmp_path: Path) -> None:
    nodes, pods_file = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\n")
    variants.write(pods_file, pods())

    inputs = ["--pods", str(pods_file), "--nodes", str(nodes)]

    assert variants.main(["--out", str(tmp_path / "out"), *inputs]) == 0
    assert variants.main(["share30", "--out", str(tmp_path / "one"), *inputs]) == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted(f"openb_pod_list_{n}.csv" for n in variants.HELD_OUT)
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["openb_pod_list_share30.csv"]
