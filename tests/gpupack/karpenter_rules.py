"""What Karpenter refuses in a pending pod before it simulates anything, as the pinned
release says it (sigs.k8s.io/karpenter v1.14.1, hack/versions.env).

A pod that fails these is dropped by the provisioner (`GetPendingPods` -> `Validate`,
pkg/controllers/provisioning/provisioner.go) with the Event `FailedScheduling` and is
never given a node. The lists are copied from the module's source, and
`tests/integration/test_karpenter_rules_source.py` checks them against the source the
test run built Karpenter from, so a Karpenter upgrade that changes them fails there:

- pkg/apis/v1/labels.go: `RestrictedLabelDomains`, `WellKnownLabels`,
  `RestrictedLabels`, `NormalizedLabels`, `IsRestrictedLabel`;
- pkg/apis/v1/nodeclaim_validation.go: `SupportedNodeSelectorOps`, `ValidateRequirement`;
- pkg/controllers/provisioning/provisioner.go: `validateKarpenterManagedLabelCanExist`,
  `validateNodeSelector`, `validateAffinity`, `validateNodeSelectorTerm`.
"""

import re
from typing import Any, Final

JSON = dict[str, Any]

RESTRICTED_LABEL_DOMAINS: Final = frozenset({"karpenter.sh"})
WELL_KNOWN_LABELS: Final = frozenset(
    {
        "karpenter.sh/nodepool",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "karpenter.sh/capacity-type",
        "node.kubernetes.io/windows-build",
    }
)
RESTRICTED_LABELS: Final = frozenset({"kubernetes.io/hostname"})
NORMALIZED_LABELS: Final = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "beta.kubernetes.io/arch": "kubernetes.io/arch",
    "beta.kubernetes.io/os": "kubernetes.io/os",
    "beta.kubernetes.io/instance-type": "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
}
SUPPORTED_OPERATORS: Final = frozenset(
    {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"}
)
CAPACITY_TYPES: Final = frozenset({"on-demand", "spot", "reserved"})

_QUALIFIED_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


def _restricted(key: str) -> str | None:
    if key in WELL_KNOWN_LABELS:
        return None
    domain = key.split("/", 1)[0] if "/" in key else ""
    for restricted in RESTRICTED_LABEL_DOMAINS:
        if domain == restricted or domain.endswith("." + restricted):
            return f"using label {key} is not allowed (restricted domain)"
    if key in RESTRICTED_LABELS:
        return f"using label {key} is not allowed as it might interfere with the internal provisioning logic"
    return None


def _qualified(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if key.count("/") > 1 or not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        return False
    return not prefix or (len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(prefix)))


def _label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and bool(_QUALIFIED_NAME.fullmatch(value)))


def requirement_errors(requirement: JSON) -> list[str]:
    """`ValidateRequirement` of one node selector requirement."""
    key = str(requirement.get("key", ""))
    key = NORMALIZED_LABELS.get(key, key)
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or ()]
    errors = []
    if operator not in SUPPORTED_OPERATORS:
        errors.append(f"key {key} has an unsupported operator {operator}")
    if (why := _restricted(key)) is not None:
        errors.append(why)
    if (
        key == "karpenter.sh/capacity-type"
        and operator == "In"
        and not CAPACITY_TYPES & set(values)
    ):
        errors.append(f"no valid values found in {values} for {key}")
    if not _qualified(key):
        errors.append(f"key {key} is not a qualified name")
    errors += [f"invalid value {v} for key {key}" for v in values if not _label_value(v)]
    if operator == "In" and not values:
        errors.append(f"key {key} with operator In must have a value defined")
    if operator in ("Gt", "Lt", "Gte", "Lte") and (len(values) != 1 or not values[0].isdigit()):
        errors.append(
            f"key {key} with operator {operator} must have a single positive integer value"
        )
    return errors


def _term_errors(term: JSON) -> list[str]:
    errors = []
    if term.get("matchFields") is not None:
        errors.append("node selector term with matchFields is not supported")
    for requirement in term.get("matchExpressions") or ():
        errors += requirement_errors(requirement)
    return errors


def refusals(pod: JSON) -> list[str]:
    """Why Karpenter's provisioner would drop `pod` unsimulated; empty when it takes it."""
    spec = pod.get("spec") or {}
    errors = []
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    first = (terms[0].get("matchExpressions") or []) if terms else []
    selector = spec.get("nodeSelector") or {}
    if any(
        e.get("key") == "karpenter.sh/nodepool" and e.get("operator") == "DoesNotExist"
        for e in first
    ):
        errors.append("configured to not run on a Karpenter provisioned node")
    for key, value in selector.items():
        errors += _term_errors(
            {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
        )
    for term in terms:
        errors += _term_errors(term)
    return errors
