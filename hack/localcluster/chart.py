"""What the chart installs, as the harness installs it: every local component runs with the
RBAC `helm template` renders from `charts/gpupack`, bound to the chart's ServiceAccounts
(each local process authenticates with a client certificate as its ServiceAccount's
user, `system:serviceaccount:<namespace>:<name>`, so RBAC and the admission policies'
exemptions see whom they see in a cluster), and the webhook is registered with the
chart's configuration, so a test proves the permissions and selectors users get, not a
hand-written copy of them."""

import subprocess
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import yaml

from hack.localcluster.client import JSON

SYSTEM_NAMESPACE: Final = "gpupack-system"
WEBHOOK_NAME: Final = "gpupack-webhook"
SCHEDULER_NAME: Final = "gpupack-scheduler"
EXPORTER_NAME: Final = "gpupack-exporter"
CSI_NAME: Final = "gpupack-csi"
RECOMMENDER_NAME: Final = "gpupack-recommender"
ADMISSION_POLICIES: Final = "templates/admission-policies.yaml"
CHART_DIR: Final = Path(__file__).resolve().parents[2] / "charts" / "gpupack"


def render_chart(
    helm: Path, template: str, namespace: str = SYSTEM_NAMESPACE, sets: Sequence[str] = ()
) -> str:
    """What `helm template` renders of one of the chart's templates (charts/gpupack)."""
    return subprocess.run(  # noqa: S603 (our helm, fixed arguments)
        [
            str(helm),
            "template",
            "gpupack",
            str(CHART_DIR),
            f"--namespace={namespace}",
            "--kube-version=1.35.0",
            f"--show-only={template}",
            *(f"--set={value}" for value in sets),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def chart_webhook_configuration(helm: Path, namespace: str = SYSTEM_NAMESPACE) -> JSON:
    """The MutatingWebhookConfiguration the chart renders, so the local cluster registers
    the webhook with the chart's selectors and settings."""
    template = "templates/mutatingwebhookconfiguration.yaml"
    config: JSON = yaml.safe_load(render_chart(helm, template, namespace))
    return config


def chart_rbac(
    helm: Path,
    template: str,
    namespace: str = SYSTEM_NAMESPACE,
    sets: Sequence[str] = (),
) -> list[JSON]:
    """The ClusterRoles, Roles and their bindings a chart template renders, as rendered:
    the local processes run as the chart's ServiceAccounts, with its permissions."""
    rendered = render_chart(helm, template, namespace, sets)
    kinds = ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
    return [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] in kinds]


def service_account_user(name: str, namespace: str = SYSTEM_NAMESPACE) -> tuple[str, list[str]]:
    """The user name and groups the API server gives ServiceAccount `name`'s tokens."""
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    return f"system:serviceaccount:{namespace}:{name}", groups


def chart_state_configmaps(
    helm: Path, namespace: str = SYSTEM_NAMESPACE, sets: Sequence[str] = ()
) -> list[JSON]:
    """The ConfigMaps templates/scheduler.yaml renders for the scheduler to write (no
    data of the chart's own: the consolidation budgets), as rendered."""
    rendered = render_chart(helm, "templates/scheduler.yaml", namespace, sets)
    return [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] == "ConfigMap" and not doc.get("data")
    ]


def chart_scheduler_config(
    helm: Path,
    namespace: str = SYSTEM_NAMESPACE,
    sets: Sequence[str] = (),
    key: str = "config.yaml",
) -> JSON:
    """A KubeSchedulerConfiguration the chart gives one of gpupack's kube-schedulers (the
    `key` of its ConfigMap: `config.yaml` for fractional pods, `capacity.yaml` for
    capacity pods), so the local kube-scheduler runs exactly that."""
    for doc in yaml.safe_load_all(render_chart(helm, "templates/scheduler.yaml", namespace, sets)):
        if doc and doc["kind"] == "ConfigMap" and key in (doc.get("data") or {}):
            config: JSON = yaml.safe_load(doc["data"][key])
            return config
    raise LookupError(f"templates/scheduler.yaml renders no ConfigMap with {key}")


def webhook_path(entry: JSON) -> str:
    """The path a webhook entry calls (`/mutate`, `/devices`), from its Service or URL."""
    config = entry.get("clientConfig") or {}
    service = config.get("service") or {}
    if service.get("path"):
        return str(service["path"])
    return urllib.parse.urlsplit(str(config.get("url", ""))).path or "/mutate"
