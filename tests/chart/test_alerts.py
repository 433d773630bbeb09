"""The chart's alerts: valid rules, each tested with `promtool test rules`
(tests/chart/alerts/gpupack.test.yaml), each with a runbook, shipped as a
PrometheusRule only where that API exists."""

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.test_chart import CHART, of_kind, render

RULES = CHART / "alerts" / "gpupack.rules.yaml"
TESTS = Path(__file__).parent / "alerts" / "gpupack.test.yaml"
RUNBOOKS = CHART.parents[1] / "docs" / "alerts.md"
API = "--api-versions=monitoring.coreos.com/v1/PrometheusRule"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = Path(os.environ.get("GPUPACK_BIN_DIR", ""), "promtool")
    assert path.is_file(), "promtool is built by hack/lib/binaries.sh: run through hack/test"
    return subprocess.run(
        [str(path), *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_rules_are_valid_prometheus_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_fires_and_stays_quiet_as_its_promtool_tests_say() -> None:
    result = promtool("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_promtool_test() -> None:
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    firing = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {rule["alert"] for rule in rules()} <= firing


@pytest.mark.parametrize("rule", [pytest.param(r, id=r["alert"]) for r in rules()])
def test_every_alert_has_a_severity_a_for_a_text_and_a_runbook(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in ("critical", "warning")
    assert re.fullmatch(r"\d+[smh]", rule["for"])
    assert rule["annotations"]["summary"]
    assert rule["annotations"]["description"]
    runbook = RUNBOOKS.read_text()
    section = re.search(rf"^### {rule['alert']}\n(.*?)(?=^##|\Z)", runbook, re.M | re.S)
    assert section, f"docs/alerts.md has no '### {rule['alert']}' runbook"
    for part in ("Threshold", "Impact", "Check", "Fix"):
        assert f"**{part}**" in section.group(1), f"{rule['alert']}: runbook lacks {part}"


def test_the_prometheus_rule_ships_every_alert_with_its_runbook_link(tmp_path: Path) -> None:
    (rule,) = of_kind(
        render(API, "--set=metrics.prometheusRule.additionalLabels.team=ml"), "PrometheusRule"
    )
    rendered = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert [r["alert"] for r in rendered] == [r["alert"] for r in rules()]
    for shipped, source in zip(rendered, rules(), strict=True):
        assert shipped["expr"] == source["expr"]
        assert shipped["labels"] == {**source["labels"], "team": "ml"}
        url = shipped["annotations"]["runbook_url"]
        assert url.endswith(f"docs/alerts.md#{source['alert'].lower()}")
    # What Helm rendered is still a valid rule file.
    rendered_file = tmp_path / "rendered.rules.yaml"
    rendered_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = promtool("check", "rules", str(rendered_file))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="no-prometheus-operator"),
        pytest.param([API, "--set=metrics.prometheusRule.enabled=false"], id="disabled"),
    ],
)
def test_no_prometheus_rule_without_the_api_or_when_disabled(values: list[str]) -> None:
    assert of_kind(render(*values), "PrometheusRule") == []


def test_service_monitor_relabelings_reach_the_endpoint() -> None:
    relabel = "--set=metrics.serviceMonitor.relabelings[0].targetLabel=cluster"
    drop = "--set=metrics.serviceMonitor.metricRelabelings[0].action=drop"
    (monitor,) = of_kind(
        render("--set=metrics.serviceMonitor.enabled=true", relabel, drop), "ServiceMonitor"
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["relabelings"] == [{"targetLabel": "cluster"}]
    assert endpoint["metricRelabelings"] == [{"action": "drop"}]
