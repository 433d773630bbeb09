"""What the chart installs, as the harness installs it: every local component runs with
the RBAC `helm template` renders from `charts/gpupack` (bound to a local user instead of
the ServiceAccount) and the webhook is registered with the chart's configuration, so a
test proves the permissions and selectors users get, not a hand-written copy of them."""

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import yaml

from hack.localcluster.client import JSON

SYSTEM_NAMESPACE: Final = "gpupack-system"
WEBHOOK_NAME: Final = "gpupack-webhook"
SCHEDULER_NAME: Final = "gpupack-scheduler"
EXPORTER_NAME: Final = "gpupack-exporter"
RECOMMENDER_NAME: Final = "gpupack-recommender"
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
    user: str,
    namespace: str = SYSTEM_NAMESPACE,
    sets: Sequence[str] = (),
) -> list[JSON]:
    """The ClusterRoles and Roles a chart template renders, bound to the local `user`
    instead of the ServiceAccount: the local processes run with the chart's permissions."""
    rendered = render_chart(helm, template, namespace, sets)
    out: list[JSON] = []
    subject = [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]
    for doc in yaml.safe_load_all(rendered):
        if doc and doc["kind"] in ("ClusterRole", "Role"):
            out.append(doc)
        elif doc and doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            out.append({**doc, "subjects": subject})
    return out


def chart_scheduler_config(
    helm: Path, namespace: str = SYSTEM_NAMESPACE, sets: Sequence[str] = ()
) -> JSON:
    """The KubeSchedulerConfiguration the chart gives the gpupack kube-scheduler (the
    `config.yaml` of its ConfigMap), so the local kube-scheduler runs exactly that."""
    for doc in yaml.safe_load_all(render_chart(helm, "templates/scheduler.yaml", namespace, sets)):
        if doc and doc["kind"] == "ConfigMap" and "config.yaml" in (doc.get("data") or {}):
            config: JSON = yaml.safe_load(doc["data"]["config.yaml"])
            return config
    raise LookupError("templates/scheduler.yaml renders no kube-scheduler ConfigMap")
