"""The scale benchmark on a small burst: what it reports, on a cluster of its own (no
timing is asserted; the figures it measures are in docs/scheduler.md)."""

import json

import pytest

from benchmarks.scale import run


@pytest.mark.integration
def test_a_small_burst_reports_both_paces_the_timeline_and_the_capacity(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run.main(["--nodes", "2", "--pods", "8", "--threads", "4"]) == 0

    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["capacity_lower_bound"] == 2  # 8 x 250m
    assert report["capacity_pods_made"] >= report["capacity_lower_bound"]
    assert report["capacity_pods_most_at_once"] <= report["capacity_pods_made"]
    assert report["ratio"] > 0
    stages = report["gpupack_stages"]
    assert stages["admitted"]["count"] == stages["placed"]["count"] == 8
    assert stages["capacity_named"]["count"] == report["capacity_pods_made"]
    assert stages["capacity_created"]["p50"] <= stages["capacity_named"]["p50"]
    assert report["kube_scheduler_stages"]["placed"]["count"] == 8
    assert report["extender_peak_mib"] > 0
    assert report["webhook_peak_mib"] > 0
    assert report["kube_scheduler_peak_mib"] > 0
    assert report["capacity_scheduler_peak_mib"] > 0
    cpu = report["cpu_ms_per_placed_pod"]
    assert cpu["gpupack"] > 0
    assert cpu["kube_scheduler"] > 0
    memory, kept_whole = report["memory"], report["memory"]["objects_whole"]
    assert memory["extender"]["pods"] >= 8 + 8 + 2  # the shares, the whole-GPU pods, capacity
    assert memory["extender"]["nodes"] == 2
    assert memory["webhook"]["pods"] >= 8 + 2
    # Objects as the API server sends them carry managedFields (and more the webhook never
    # reads); the components keep neither.
    for component in ("extender", "webhook"):
        assert 0 < memory[component]["mib_per_10k_pods"] < kept_whole[component]["mib_per_10k_pods"]
    assert 0 < memory["extender"]["mib_per_1k_nodes"] < kept_whole["extender"]["mib_per_1k_nodes"]


def test_more_pods_than_the_nodes_hold_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        run.main(["--nodes", "1", "--pods", "8"])
    assert info.value.code == 2
    assert "1 nodes hold 8 GPUs: too few" in capsys.readouterr().err
