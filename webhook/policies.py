"""Which policy a pod gets, and why: pod annotation, namespace annotation, auto-detection.

Auto-detection reads the controlling owner's kind, well-known labels of training
operators, notebook servers, Ray and model-serving frameworks, and model-server images.
The returned `source` is written to the audit log so an operator can see how each choice was made.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpupack import keys
from gpupack.codec import read_policy
from gpupack.errors import ContractError
from gpupack.kube import JSON, Pod, annotations_of, labels_of
from gpupack.policy import DEFAULT_POLICY, Policy

# Owner kinds (of the pod's controlling owner) and what they usually run.
TRAINING_OWNERS: Final = frozenset(
    {
        "Job",
        "PyTorchJob",
        "TFJob",
        "MPIJob",
        "XGBoostJob",
        "PaddleJob",
        "JAXJob",
        "MXJob",
        "TrainJob",
        "JobSet",
        "RayJob",
        "VolcanoJob",
    }
)
NOTEBOOK_OWNERS: Final = frozenset({"Notebook"})
SERVING_OWNERS: Final = frozenset({"InferenceService", "SeldonDeployment", "RayService"})

# (label key, required value or None for "any value", policy, why)
LABEL_RULES: Final[tuple[tuple[str, str | None, str, str], ...]] = (
    ("training.kubeflow.org/job-name", None, "training", "Kubeflow training job"),
    ("trainer.kubeflow.org/trainjob-name", None, "training", "Kubeflow TrainJob"),
    ("jobset.sigs.k8s.io/jobset-name", None, "training", "JobSet"),
    ("notebook-name", None, "build", "Kubeflow notebook"),
    ("component", "singleuser-server", "build", "JupyterHub single-user server"),
    ("serving.kserve.io/inferenceservice", None, "real-time", "KServe InferenceService"),
    ("seldon-deployment-id", None, "real-time", "Seldon deployment"),
    ("serving.knative.dev/service", None, "real-time", "Knative service"),
    ("ray.io/originated-from-crd", "RayService", "real-time", "RayService"),
    ("ray.io/originated-from-crd", "RayJob", "training", "RayJob"),
    ("ray.io/originated-from-crd", "RayCluster", "batch", "RayCluster"),
)
SERVING_APPS: Final = frozenset(
    {"triton", "tritonserver", "vllm", "text-generation-inference", "tgi", "torchserve", "ollama"}
)
# Image repository names (the part after the last "/", before the tag) of model servers.
SERVING_IMAGES: Final = (
    "vllm",
    "tritonserver",
    "text-generation-inference",
    "torchserve",
    "ollama",
    "sglang",
    "tensorrt-llm",
    "llama.cpp",
)


def serving_image(pod: Pod) -> str | None:
    """The first container image that is a known model server, if any."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        image = str(container.get("image", ""))
        repository = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0].lower()
        if any(name in repository for name in SERVING_IMAGES):
            return image
    return None


class UnknownPolicyError(ValueError):
    """A policy name that is neither a GPUPolicy object nor a built-in."""


@dataclass(frozen=True, slots=True)
class PolicyChoice:
    policy: Policy
    source: str  # pod-annotation | namespace-annotation | auto: <why> | default
    warning: str | None = None  # e.g. an unusable namespace annotation that was ignored


def detect(pod: Pod, owner_kind: str) -> tuple[str, str]:
    """(policy name, why) from owner kind and labels; the default when nothing matches."""
    labels = labels_of(pod)
    for key, value, policy, why in LABEL_RULES:
        if key in labels and (value is None or labels[key] == value):
            return policy, f"label {key} ({why})"
    app = labels.get("app.kubernetes.io/name", labels.get("app", "")).lower()
    if app in SERVING_APPS:
        return "real-time", f"serving framework {app!r}"
    image = serving_image(pod)
    if image is not None:
        return "real-time", f"model-server image {image}"
    if owner_kind in TRAINING_OWNERS:
        return "training", f"owner kind {owner_kind}"
    if owner_kind in NOTEBOOK_OWNERS:
        return "build", f"owner kind {owner_kind}"
    if owner_kind in SERVING_OWNERS:
        return "real-time", f"owner kind {owner_kind}"
    if owner_kind in ("Deployment", "ReplicaSet", "StatefulSet"):
        return "near-real-time", f"owner kind {owner_kind} (long-running service)"
    return DEFAULT_POLICY, "no owner kind or label matched; the default policy"


def _lookup(name: str, policies: Mapping[str, Policy], where: str) -> Policy:
    policy = policies.get(name)
    if policy is None:
        known = ", ".join(sorted(policies))
        raise UnknownPolicyError(f"{where} {keys.POLICY}: unknown policy {name!r}; known: {known}")
    return policy


def resolve_policy(
    pod: Pod, owner_kind: str, namespace: JSON | None, policies: Mapping[str, Policy]
) -> PolicyChoice:
    """The policy for a pod. Raises ContractError or UnknownPolicy for a bad pod annotation
    (the caller denies the pod); a bad namespace annotation is ignored with a warning."""
    name = read_policy(annotations_of(pod))
    if name is not None:
        return PolicyChoice(_lookup(name, policies, "pod annotation"), "pod-annotation")
    warning = None
    if namespace is not None:
        try:
            ns_name = read_policy(annotations_of(namespace))
            if ns_name is not None:
                policy = _lookup(ns_name, policies, "namespace annotation")
                return PolicyChoice(policy, "namespace-annotation")
        except (ContractError, UnknownPolicyError) as exc:
            warning = f"ignored the namespace's policy: {exc}"
    detected, why = detect(pod, owner_kind)
    policy = policies.get(detected) or _lookup(DEFAULT_POLICY, policies, "default")
    return PolicyChoice(policy, f"auto: {why}", warning)
