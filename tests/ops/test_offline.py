"""`kubectl gpupack explain` and `decisions` offline, as a user runs them: through main(),
on files and stdin, with no cluster."""

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from doubles.pods import deployment_pod, request
from gpupack import keys
from ops.kubectl import main
from webhook.audit import AuditLog, audit_line
from webhook.decision import CapacityOutcome
from webhook.mutate import MutationContext, decide

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llm-deployment.yaml"


def test_explain_a_deployment_prints_the_decision_and_the_pod(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "-f", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "#   outcome: mutated" in out
    assert "#   policy: real-time" in out  # a vLLM image
    pod = yaml.safe_load(out)
    assert pod["spec"]["schedulerName"] == keys.SCHEDULER_NAME
    assert pod["metadata"]["annotations"][keys.GPU_COMPUTE] == "300m"
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["limits"]


def test_explain_patch_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-f", str(EXAMPLE), "--patch", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decision"]["outcome"] == "mutated"
    assert {"op": "add", "path": "/spec/schedulerName", "value": "gpupack-scheduler"} in doc[
        "patch"
    ]


def test_explain_shows_an_mps_pods_wiring_and_what_mps_isolates(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["template"]["metadata"].setdefault("annotations", {})[keys.POLICY] = (
        "real-time-mps"
    )
    path = tmp_path / "mps.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["explain", "-f", str(path), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    decision = doc["decision"]
    assert decision["enforcement"] == "mps,memory"  # the shim closes MPS's memory escape
    assert decision["mps"]["limits"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert "mps.gpupack.io" in decision["mps"]["volume"]
    assert "faults" in decision["mps"]["doesNotIsolate"]
    (container,) = doc["pod"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"  # what it says is what it writes
    volumes = doc["pod"]["spec"]["volumes"]
    assert {"name": "gpupack-mps", "csi": {"driver": "mps.gpupack.io"}} in volumes
    assert {"name": "gpupack-cuda", "csi": {"driver": "cuda.gpupack.io"}} in volumes
    paths = [m["mountPath"] for m in container["volumeMounts"]]
    assert paths == [
        "/run/gpupack/mps", "/dev/shm", "/run/gpupack/cuda", "/run/gpupack/cuda/budget",
        "/etc/ld.so.preload",
    ]  # fmt: skip


def test_explain_says_a_shared_pods_memory_is_held_by_the_shim(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "-f", str(EXAMPLE), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    decision = doc["decision"]
    assert decision["enforcement"] == "memory"
    assert "mps" not in decision
    memory = decision["memory"]
    assert memory["limit"] == doc["pod"]["metadata"]["annotations"][keys.GPU_MEMORY]
    assert "bandwidth" in memory["notEnforced"]
    (container,) = doc["pod"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_GPU_MEMORY_LIMIT"] == memory["driver"]["NVIDIA_GPU_MEMORY_LIMIT"]
    assert {"name": "gpupack-cuda", "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload",
            "readOnly": True} in container["volumeMounts"]  # fmt: skip


def test_explain_says_a_shared_pods_shares_are_accounting_without_the_shim(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "-f", str(EXAMPLE), "-o", "json", "--no-memory-enforcement"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decision"]["enforcement"] == "accounting"
    assert "memory" not in doc["decision"]
    assert "volumes" not in doc["pod"]["spec"]


@pytest.mark.parametrize(
    ("kind", "template_path", "policy"),
    [
        pytest.param("Job", ("spec", "template"), "training", id="job"),
        pytest.param(
            "CronJob", ("spec", "jobTemplate", "spec", "template"), "training", id="cronjob"
        ),
        pytest.param("StatefulSet", ("spec", "template"), "near-real-time", id="statefulset"),
        pytest.param("DaemonSet", ("spec", "template"), "near-real-time", id="daemonset"),
    ],
)
def test_explain_takes_every_workload_kind(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    template_path: tuple[str, ...],
    policy: str,
) -> None:
    pod = deployment_pod()
    template: dict[str, object] = {"metadata": {"labels": {"app": "x"}}, "spec": pod["spec"]}
    for key in reversed(template_path):
        template = {key: template}
    manifest = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": "w", "namespace": "ml"},
        **template,
    }
    path = tmp_path / "m.json"
    path.write_text(json.dumps(manifest))
    assert main(["explain", "-f", str(path), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["decision"]["policy"] == policy


def test_explain_with_a_namespace_that_is_not_opted_in(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-f", str(EXAMPLE), "--namespace-label", "team=a", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["decision"]["reason"] == "not-opted-in"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(
            "kind: Service\nmetadata: {name: s}\n",
            "kind 'Service' is not supported",
            id="unsupported-kind",
        ),
        pytest.param("a: [1\n", "not valid YAML", id="bad-yaml"),
        pytest.param("", "no Kubernetes object", id="empty"),
        pytest.param(
            "kind: Deployment\nmetadata: {name: d}\nspec: {}\n", "no pod template", id="no-template"
        ),
        pytest.param("- 1\n", "not a Kubernetes object", id="list"),
    ],
)
def test_explain_bad_manifests_exit_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(content)
    assert main(["explain", "-f", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_explain_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-f", "/nonexistent.yaml"]) == 2
    assert "cannot read /nonexistent.yaml" in capsys.readouterr().err


def audit_log(tmp_path: Path) -> Path:
    """Real audit lines, written by AuditLog, mixed with other log output."""
    stream = io.StringIO()
    log = AuditLog(stream=stream)
    stream.write("INFO starting\n")
    for uid, namespace, pod, when in [
        ("a", "ml", deployment_pod(), "2026-11-20T10:00:00+00:00"),
        (
            "b",
            "ml",
            deployment_pod(containers=[{"name": "c", "image": "x"}]),
            "2026-11-20T11:00:00+00:00",
        ),
        ("c", "web", deployment_pod(), "2026-11-20T12:00:00+00:00"),
    ]:
        pod["metadata"]["namespace"] = namespace
        req = request(pod, uid=uid)
        decision = decide(req, MutationContext())
        log.write(
            audit_line(
                req,
                decision,
                CapacityOutcome("needed", "", {"missing": 1}),
                0.0012,
                datetime.fromisoformat(when),
            )
        )
    path = tmp_path / "webhook.log"
    path.write_text(
        "".join(
            f"[pod/gpupack-webhook-1/webhook] {line}\n" for line in stream.getvalue().splitlines()
        )
    )
    return path


def test_decisions_table_filters_by_namespace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["decisions", str(audit_log(tmp_path)), "--namespace", "ml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["TIME", "NAMESPACE", "POD", "WORKLOAD"]
    assert len(lines) == 3
    assert "Deployment/llm" in lines[1]
    assert "mutated" in lines[1]
    assert "needed:1" in lines[1]
    assert "no-gpu" in lines[2]


@pytest.mark.parametrize(
    ("args", "uids"),
    [
        pytest.param(["--outcome", "skipped"], ["b"], id="outcome"),
        pytest.param(["--reason", "mutated"], ["a", "c"], id="reason"),
        pytest.param(["--workload", "Deployment/llm", "-n", "web"], ["c"], id="workload"),
        pytest.param(["--workload", "other"], [], id="no-match"),
        pytest.param(
            ["--since", "2026-11-20T10:30:00+00:00", "--until", "2026-11-20T11:30:00"],
            ["b"],
            id="time",
        ),
    ],
)
def test_decisions_filters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], uids: list[str]
) -> None:
    assert main(["decisions", str(audit_log(tmp_path)), "-o", "json", *args]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["uid"] for r in records] == uids


def test_decisions_reads_stdin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(audit_log(tmp_path).read_text()))
    assert main(["decisions", "-", "-o", "json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_decisions_bad_time_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["decisions", "--since", "yesterday"])
    assert info.value.code == 2
    assert "expected a duration" in capsys.readouterr().err


def test_audit_line_has_every_field_the_issue_names() -> None:
    req = request(deployment_pod(), uid="u-1", dry_run=True)
    decision = decide(req, MutationContext())
    line = audit_line(
        req,
        decision,
        CapacityOutcome(
            "needed", "the pool lacks 1 GPU(s)", {"pool": "p", "gpus": 0, "missing": 1}
        ),
        0.002,
        datetime(2026, 11, 21, tzinfo=UTC),
    )
    assert line["time"] == "2026-11-21T00:00:00.000+00:00"
    assert line["generateName"] == "llm-6d5f8b9c7-"
    assert (line["ownerKind"], line["ownerName"], line["operation"], line["dryRun"]) == (
        "Deployment",
        "llm",
        "CREATE",
        True,
    )
    assert (line["outcome"], line["reason"], line["policy"]) == (
        "mutated",
        "mutated",
        "near-real-time",
    )
    assert line["policySource"].startswith("auto:")
    assert line["gpuRequest"] == {"container": "main", "count": 1, "in": ["limits"]}
    assert (line["compute"], line["memory"], line["allocationSource"]) == (
        "400m",
        "8Gi",
        "policy-initial",
    )
    assert line["capacity"] == {
        "action": "needed",
        "pool": "p",
        "gpus": 0,
        "missing": 1,
        "detail": "the pool lacks 1 GPU(s)",
    }
    assert line["patchOps"] == len(decision.patch)
    assert line["latencyMs"] == 2.0
