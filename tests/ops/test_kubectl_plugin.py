"""`kubectl gpupack`'s commands over an in-memory API (the reports themselves are
tests/ops/test_report.py; the plugin through real kubectl is in tests/integration)."""

import json
from collections.abc import Mapping
from typing import Any

import pytest

from ops import kubectl
from webhook.audit import AUDIT_MARKER

JSON = dict[str, Any]


def line(uid: str, time: str, namespace: str = "ml") -> str:
    record = {
        "audit": AUDIT_MARKER,
        "uid": uid,
        "time": time,
        "namespace": namespace,
        "outcome": "mutated",
        "reason": "mutated",
    }
    return "some-prefix " + json.dumps(record)


class Api:
    """Two webhook replicas with their logs; records what was asked."""

    def __init__(self) -> None:
        self.logs = {
            "webhook-a": "\n".join([line("a1", "2026-11-23T10:00:02+00:00"), "not audit"]),
            "webhook-b": "\n".join(
                [
                    line("b1", "2026-11-23T10:00:01+00:00"),
                    line("b2", "2026-11-23T10:00:03+00:00", "web"),
                ]
            ),
        }
        self.asked: list[tuple[str, Mapping[str, str]]] = []

    def list(self, path: str, params: Mapping[str, str]) -> JSON:
        self.asked.append((path, params))
        return {"items": [{"metadata": {"name": name}} for name in self.logs]}

    def text(self, path: str, params: Mapping[str, str] | None = None) -> str:
        self.asked.append((path, params or {}))
        return self.logs[path.split("/")[-2]]


def test_decisions_are_read_from_every_replica_and_merged_by_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = Api()
    args = kubectl.build_parser().parse_args(["decisions", "-o", "json", "-n", "ml"])

    assert kubectl.run_decisions(args, api) == 0  # type: ignore[arg-type]

    uids = [json.loads(row)["uid"] for row in capsys.readouterr().out.splitlines()]
    assert uids == ["b1", "a1"]  # both replicas, by time; the other namespace filtered out
    (_, params), *_ = api.asked
    assert params["labelSelector"] == kubectl.WEBHOOK_PODS
    logs = [(p, q) for p, q in api.asked if p.endswith("/log")]
    assert [p for p, _ in logs] == [
        "/api/v1/namespaces/gpupack-system/pods/webhook-a/log",
        "/api/v1/namespaces/gpupack-system/pods/webhook-b/log",
    ]
    assert all(q["container"] == "webhook" for _, q in logs)


def test_since_is_passed_to_the_api_server(capsys: pytest.CaptureFixture[str]) -> None:
    api = Api()
    args = kubectl.build_parser().parse_args(["decisions", "--since", "2026-11-23T10:00:00"])
    kubectl.run_decisions(args, api)  # type: ignore[arg-type]
    sent = [q for p, q in api.asked if p.endswith("/log")]
    assert all(q["sinceTime"] == "2026-11-23T10:00:00Z" for q in sent)


def test_without_a_kubeconfig_it_exits_2_naming_the_problem(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert kubectl.main(["status"]) == 2
    assert "kubectl gpupack:" in capsys.readouterr().err
