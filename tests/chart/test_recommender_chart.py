"""The recommender's part of the chart: one Deployment that campaigns for its own Lease,
scrapes this release's exporters (or asks Prometheus), and may write only what it owns:
GPURecommendations, the GPUPolicy objects' status and, when rollouts are granted, a
restart of a Deployment or StatefulSet. Also the two CRDs it works with."""

import argparse
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpupack import recommendation
from gpupack.policy import BUILTIN, UpdateMode, policy_from_object
from recommender.cli import build_parser
from tests.chart.test_chart import CHART, KUBERNETES, NAMESPACE, helm, of_kind, render

NAME = "gpupack-recommender"
RELEASE = "gpupack"  # the release name render() uses

Grant = tuple[str, str, str, tuple[str, ...]]  # apiGroup, resource, verb, resourceNames


def named(docs: list[dict[str, Any]], kind: str, name: str = NAME) -> dict[str, Any]:
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


def recommender(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The recommender's container, in the Deployment's pod template."""
    containers: list[dict[str, Any]] = named(docs, "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    (container,) = containers
    assert container["command"] == ["gpupack-recommender"]
    return container


def parsed(container: dict[str, Any]) -> argparse.Namespace:
    """The container's args as gpupack-recommender reads them: every flag must exist.
    `$(POD_NAME)` is left as rendered (the kubelet expands it; it parses as a string)."""
    return build_parser().parse_args(container["args"])


def grants(role: dict[str, Any]) -> set[Grant]:
    return {
        (group, resource, verb, tuple(rule.get("resourceNames", ())))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def rejection(*values: str) -> str:
    """helm template's error output for values the schema must refuse."""
    result = subprocess.run(
        [helm(), "template", RELEASE, str(CHART), f"--kube-version={KUBERNETES}.0", *values],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0, "the schema accepted " + " ".join(values)
    return result.stderr


def crd(plural: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(
        (CHART / "crds" / f"{plural}.gpupack.io.yaml").read_text()
    )
    return document


DEFAULT_ARGS: dict[str, object] = {
    "namespace": NAMESPACE,
    "lease_name": NAME,
    "identity": "$(POD_NAME)",
    "interval": 60.0,
    "checkpoint_interval": 300.0,
    "exporter_port": 9400,
    "exporter_url": [],
    "prometheus_url": None,
    "prometheus_bearer_token_file": None,
    "rollout_drift": 0.5,
    "rollout_cooldown": 3600.0,
    "metrics_port": 9092,
    "log_level": "info",
    "leader_elect": True,
    "lease_duration": 15.0,
    "renew_deadline": 10.0,
    "retry_period": 2.0,
}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([], DEFAULT_ARGS, id="defaults"),
        pytest.param(
            [
                "--set=recommender.intervalSeconds=30",
                "--set=recommender.checkpointIntervalSeconds=600",
                "--set-json=recommender.rolloutDrift=0.25",  # --set makes 0.25 a string
                "--set=recommender.rolloutCooldownSeconds=7200",
                "--set=recommender.metricsPort=9100",
                "--set=recommender.logLevel=debug",
                "--set=recommender.leaderElection.enabled=false",
                "--set=recommender.leaderElection.leaseDurationSeconds=30",
                "--set=recommender.leaderElection.renewDeadlineSeconds=20",
                "--set=recommender.leaderElection.retryPeriodSeconds=5",
                "--set=exporter.port=9500",
            ],
            {
                **DEFAULT_ARGS,
                "interval": 30.0,
                "checkpoint_interval": 600.0,
                "rollout_drift": 0.25,
                "rollout_cooldown": 7200.0,
                "metrics_port": 9100,
                "log_level": "debug",
                "leader_elect": False,
                "lease_duration": 30.0,
                "renew_deadline": 20.0,
                "retry_period": 5.0,
                "exporter_port": 9500,
            },
            id="custom",
        ),
        pytest.param(
            [
                "--set=recommender.prometheus.url=http://prometheus-operated.monitoring:9090",
                "--set=recommender.prometheus.bearerTokenFile=/var/run/secrets/prom/token",
            ],
            {
                **DEFAULT_ARGS,
                "prometheus_url": "http://prometheus-operated.monitoring:9090",
                "prometheus_bearer_token_file": "/var/run/secrets/prom/token",
            },
            id="prometheus",
        ),
    ],
)
def test_every_value_reaches_the_recommender_as_a_flag_it_accepts(
    values: list[str], expected: dict[str, object]
) -> None:
    docs = render(*values)
    for doc in docs:
        if doc["metadata"]["name"].startswith(NAME):
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    container = recommender(docs)
    args = vars(parsed(container))
    assert {key: args[key] for key in expected} == expected
    # The kubelet expands $(POD_NAME) only from the container's own environment.
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    port = args["metrics_port"]
    assert container["ports"] == [{"name": "metrics", "containerPort": port}]
    (service_port,) = named(docs, "Service", f"{NAME}-metrics")["spec"]["ports"]
    assert (service_port["port"], service_port["targetPort"]) == (port, "metrics")


@pytest.mark.parametrize(
    "values",
    [pytest.param([], id="default-port"), pytest.param(["--set=exporter.port=9500"], id="9500")],
)
def test_the_recommender_scrapes_the_exporters_of_its_own_release(values: list[str]) -> None:
    docs = render(*values)
    args = parsed(recommender(docs))
    selector = dict(term.split("=", 1) for term in args.exporter_selector.split(","))
    assert selector["app.kubernetes.io/instance"] == RELEASE
    assert selector["app.kubernetes.io/component"] == "exporter"
    exporter = named(docs, "DaemonSet", "gpupack-exporter")
    assert selector.items() <= exporter["spec"]["template"]["metadata"]["labels"].items()
    (container,) = [
        c for c in exporter["spec"]["template"]["spec"]["containers"] if c["name"] == "exporter"
    ]
    assert [p["containerPort"] for p in container["ports"]] == [args.exporter_port]
    assert args.namespace == exporter["metadata"]["namespace"] == NAMESPACE
    assert args.prometheus_url is None


def test_with_a_prometheus_url_the_recommender_queries_it_and_not_the_exporters() -> None:
    url = "https://prometheus.example.internal"
    container = recommender(render(f"--set=recommender.prometheus.url={url}"))
    assert f"--prometheus-url={url}" in container["args"]
    assert not [a for a in container["args"] if a.startswith("--exporter-")]
    assert not [a for a in container["args"] if a.startswith("--prometheus-bearer-token-file")]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            ["--set=recommender.prometheus.url=ftp://prometheus:9090"],
            "at '/recommender/prometheus/url'",
            id="ftp-url",
        ),
        pytest.param(
            ["--set=recommender.prometheus.url=prometheus:9090"],
            "at '/recommender/prometheus/url'",
            id="url-without-scheme",
        ),
        pytest.param(
            ["--set=recommender.unknown=1"],
            "at '/recommender': additional properties 'unknown' not allowed",
            id="unknown-key",
        ),
        pytest.param(
            ["--set=recommender.prometheus.unknown=1"],
            "at '/recommender/prometheus': additional properties 'unknown' not allowed",
            id="unknown-url",
        ),
        pytest.param(
            ["--set=recommender.leaderElection.unknown=1"],
            "at '/recommender/leaderElection': additional properties 'unknown' not allowed",
            id="unknown-election",
        ),
        pytest.param(
            ["--set=recommender.replicas=0"], "at '/recommender/replicas'", id="no-replicas"
        ),
        pytest.param(
            ["--set=recommender.rolloutDrift=0"], "at '/recommender/rolloutDrift'", id="no-drift"
        ),
        pytest.param(
            ["--set=recommender.logLevel=verbose"], "at '/recommender/logLevel'", id="log-level"
        ),
    ],
)
def test_the_schema_rejects_bad_recommender_values_naming_them(
    values: list[str], message: str
) -> None:
    assert message in rejection(*values)


READ: set[Grant] = {("", "pods", verb, ()) for verb in ("get", "list", "watch")}
RECOMMENDATIONS: set[Grant] = {
    ("gpupack.io", "gpurecommendations", verb, ())
    for verb in ("get", "list", "watch", "create", "patch", "delete")
}
EVENTS: set[Grant] = {("events.k8s.io", "events", "create", ())}
ROLLOUTS: set[Grant] = {
    ("apps", "deployments", "patch", ()),
    ("apps", "statefulsets", "patch", ()),
}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([], READ | RECOMMENDATIONS | EVENTS, id="default"),
        pytest.param(
            ["--set=recommender.rollouts=true"],
            READ | RECOMMENDATIONS | EVENTS | ROLLOUTS,
            id="rollouts",
        ),
    ],
)
def test_the_recommender_may_restart_workloads_only_when_rollouts_are_granted(
    values: list[str], expected: set[Grant]
) -> None:
    docs = render(*values)
    assert grants(named(docs, "ClusterRole")) == expected
    binding = named(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == NAME
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    template = named(docs, "Deployment")["spec"]["template"]["spec"]
    assert template["serviceAccountName"] == NAME


def test_in_its_namespace_the_recommender_reads_policies_writes_their_status_and_its_lease() -> (
    None
):
    docs = render()
    role = named(docs, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert grants(role) == {
        ("gpupack.io", "gpupolicies", "get", ()),
        ("gpupack.io", "gpupolicies", "list", ()),
        ("gpupack.io", "gpupolicies", "watch", ()),
        ("gpupack.io", "gpupolicies/status", "patch", ()),
        # RBAC cannot check a name on create: creating is harmless, changing is not.
        ("coordination.k8s.io", "leases", "create", ()),
        ("coordination.k8s.io", "leases", "get", (NAME,)),
        ("coordination.k8s.io", "leases", "update", (NAME,)),
    }
    binding = named(docs, "RoleBinding")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": NAME,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    assert parsed(recommender(docs)).lease_name == NAME  # the Lease the Role names


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="default"),
        pytest.param(["--set=recommender.rollouts=true"], id="rollouts"),
    ],
)
def test_no_recommender_rule_uses_a_wildcard(values: list[str]) -> None:
    docs = render(*values)
    for role in (named(docs, "ClusterRole"), named(docs, "Role")):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, ()), (role["kind"], rule)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(["--set=recommender.enabled=false"], id="disabled"),
        pytest.param(
            ["--set=recommender.enabled=false", "--set=recommender.rollouts=true"],
            id="disabled-with-rollouts",
        ),
    ],
)
def test_the_recommender_can_be_left_out(values: list[str]) -> None:
    docs = render(*values)
    assert not [d for d in docs if d["metadata"]["name"].startswith(NAME)]
    assert named(docs, "Deployment", "gpupack-webhook")  # the rest still renders


def test_the_gpurecommendation_crd_ships_with_the_chart_and_shows_the_recommendation() -> None:
    definition = crd(recommendation.PLURAL)
    included = of_kind(render("--include-crds"), "CustomResourceDefinition")
    assert definition in included  # helm installs it from crds/
    spec = definition["spec"]
    group, version = recommendation.API_VERSION.split("/")
    assert (spec["group"], spec["names"]["kind"]) == (group, recommendation.KIND)
    assert definition["metadata"]["name"] == f"{recommendation.PLURAL}.{group}"
    (served,) = spec["versions"]
    assert (served["name"], served["served"], served["storage"]) == (version, True, True)
    columns = {c["name"]: c["jsonPath"] for c in served["additionalPrinterColumns"]}
    assert {name: columns.get(name) for name in ("Compute", "Memory", "Confidence")} == {
        "Compute": ".status.compute",
        "Memory": ".status.memory",
        "Confidence": ".status.confidence",
    }


@pytest.mark.parametrize(
    "plural",
    [
        pytest.param(recommendation.PLURAL),
        pytest.param("gpupolicies"),
    ],
)
def test_the_crds_are_valid_custom_resource_definitions(plural: str) -> None:
    kubernetes_validate.validate(crd(plural), KUBERNETES, strict=True)


# The schema type behind each printer column type (`date`: an RFC 3339 string).
COLUMN_TYPES = {"string": "string", "number": "number", "integer": "integer", "date": "string"}


@pytest.mark.parametrize("plural", [recommendation.PLURAL, "gpupolicies"])
def test_every_printer_column_shows_a_field_the_schema_declares(plural: str) -> None:
    (served,) = crd(plural)["spec"]["versions"]
    for column in served["additionalPrinterColumns"]:
        schema = served["schema"]["openAPIV3Schema"]
        for step in column["jsonPath"].lstrip(".").split("."):
            schema = schema["properties"][step]
        assert COLUMN_TYPES[column["type"]] == schema["type"], column
        if column["type"] == "date":
            assert schema["format"] == "date-time", column


def test_the_gpupolicy_crd_offers_every_update_mode_and_the_status_the_recommender_writes() -> None:
    definition = crd("gpupolicies")
    (served,) = definition["spec"]["versions"]
    mode = served["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["updateMode"]
    assert mode["enum"] == [m.value for m in UpdateMode]
    assert mode["default"] == UpdateMode.INITIAL.value
    # The Role grants gpupolicies/status: a subresource that exists only when declared.
    assert served["subresources"] == {"status": {}}


def test_every_builtin_gpupolicy_applies_recommendations_initially_and_is_its_builtin() -> None:
    policies = {p["metadata"]["name"]: p for p in of_kind(render(), "GPUPolicy")}
    assert set(policies) == set(BUILTIN)
    for name, obj in policies.items():
        assert obj["metadata"]["namespace"] == NAMESPACE
        assert obj["spec"]["updateMode"] == UpdateMode.INITIAL.value
        assert policy_from_object(obj) == BUILTIN[name]
