"""Which policy a pod gets, and why: pod annotation, namespace annotation, auto-detection.

Auto-detection reads the controlling owner's kind, well-known labels of training
operators, notebook servers, Ray and model-serving frameworks, and model-server images.
The returned `source` is written to the audit log so an operator can see how each choice was made.

The policies come as a `PolicySet` (built-ins overlaid by the GPUPolicy objects). A
GPUPolicy object that does not parse never denies a pod: the built-in of its name
applies, or, for an operator's own policy, the auto-detected one, with a warning.
"""

from dataclasses import dataclass
from typing import Final

from gpupack import keys
from gpupack.codec import read_policy
from gpupack.errors import ContractError
from gpupack.objects import JSON, Pod, annotations_of, labels_of
from gpupack.policy import BUILTIN, DEFAULT_POLICY, Policy, PolicySet

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


# The policies in force when there are no GPUPolicy objects (or no cluster to read them).
BUILTIN_POLICIES: Final = PolicySet(BUILTIN, {}, frozenset())


class UnknownPolicyError(ValueError):
    """A policy name that is neither a GPUPolicy object nor a built-in."""


@dataclass(frozen=True, slots=True)
class PolicyChoice:
    policy: Policy
    source: str  # pod-annotation | namespace-annotation | auto: <why> | default
    origin: str = "built-in"  # PolicySet.source: GPUPolicy | built-in | built-in (... invalid)
    warnings: tuple[str, ...] = ()  # e.g. an unusable namespace annotation that was ignored


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


class _BrokenPolicyError(Exception):
    """An operator's GPUPolicy that does not parse and has no built-in to stand in."""

    def __init__(self, warning: str) -> None:
        super().__init__(warning)
        self.warning = warning


def invalid_warning(name: str, instead: str, why: str) -> str:
    """The warning for a pod whose policy is an invalid GPUPolicy object; the reason comes
    last, so what applies survives the API server's truncation of long warnings."""
    return f"GPUPolicy {name} is invalid, {instead}: {why}"


def _lookup(name: str, policies: PolicySet, where: str) -> tuple[Policy, tuple[str, ...]]:
    """The policy of that name, with the warning when its object is invalid (the built-in
    applies). Raises _BrokenPolicyError for an invalid object that is not a built-in,
    UnknownPolicyError for a name nobody defined."""
    policy = policies.policies.get(name)
    why = policies.invalid.get(name)
    if policy is None:
        if why is not None:
            instead = f"the auto-detected policy applies instead of the {where}'s"
            raise _BrokenPolicyError(invalid_warning(name, instead, why))
        known = ", ".join(sorted(policies.policies))
        raise UnknownPolicyError(f"{where} {keys.POLICY}: unknown policy {name!r}; known: {known}")
    if why is None:
        return policy, ()
    return policy, (invalid_warning(name, f"the built-in {name} applies", why),)


def _choice(
    policy: Policy, source: str, policies: PolicySet, warnings: tuple[str, ...]
) -> PolicyChoice:
    return PolicyChoice(policy, source, policies.source(policy.name), warnings)


def resolve_policy(
    pod: Pod, owner_kind: str, namespace: JSON | None, policies: PolicySet
) -> PolicyChoice:
    """The policy for a pod. Raises ContractError or UnknownPolicyError for a bad pod
    annotation (the caller denies the pod); a bad namespace annotation is ignored with a
    warning. A GPUPolicy object that does not parse never denies a pod: the built-in of its
    name applies, or, for an operator's own policy, the auto-detected one, with a warning."""
    warnings: tuple[str, ...] = ()
    name = read_policy(annotations_of(pod))
    if name is not None:
        try:
            policy, found = _lookup(name, policies, "pod annotation")
            return _choice(policy, "pod-annotation", policies, found)
        except _BrokenPolicyError as exc:
            warnings += (exc.warning,)
    elif namespace is not None:
        try:
            ns_name = read_policy(annotations_of(namespace))
            if ns_name is not None:
                policy, found = _lookup(ns_name, policies, "namespace annotation")
                return _choice(policy, "namespace-annotation", policies, found)
        except _BrokenPolicyError as exc:
            warnings += (exc.warning,)
        except (ContractError, UnknownPolicyError) as exc:
            warnings += (f"ignored the namespace's policy: {exc}",)
    detected, why = detect(pod, owner_kind)
    if detected not in policies.policies:  # only if a future built-in list loses one
        detected = DEFAULT_POLICY
    policy, found = _lookup(detected, policies, "auto-detected")
    return _choice(policy, f"auto: {why}", policies, warnings + found)
