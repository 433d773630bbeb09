"""The Karpenter rules the capacity-pod unit tests hold gpupack to
(`tests/gpupack/karpenter_rules.py`) are the pinned release's: read from the source of
the module hack/lib/binaries.sh builds Karpenter from (`go mod download`, the module
cache the build filled). A Karpenter upgrade that restricts another label, domain or
operator fails here, before a capacity pod meets it in a cluster."""

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Final

import pytest

from tests.gpupack import karpenter_rules

pytestmark = pytest.mark.integration
REPO: Final = Path(__file__).resolve().parents[2]
# The Go identifiers those lists are written with, and the strings they stand for
# (k8s.io/api/core/v1 well_known_labels.go; karpenter's pkg/apis).
IDENTIFIERS: Final = {
    "apis.Group": "karpenter.sh",
    "NodePoolLabelKey": "karpenter.sh/nodepool",
    "CapacityTypeLabelKey": "karpenter.sh/capacity-type",
    "v1.LabelHostname": "kubernetes.io/hostname",
    "v1.LabelTopologyZone": "topology.kubernetes.io/zone",
    "v1.LabelTopologyRegion": "topology.kubernetes.io/region",
    "v1.LabelInstanceTypeStable": "node.kubernetes.io/instance-type",
    "v1.LabelArchStable": "kubernetes.io/arch",
    "v1.LabelOSStable": "kubernetes.io/os",
    "v1.LabelWindowsBuild": "node.kubernetes.io/windows-build",
    "string(v1.NodeSelectorOpIn)": "In",
    "string(v1.NodeSelectorOpNotIn)": "NotIn",
    "string(v1.NodeSelectorOpExists)": "Exists",
    "string(v1.NodeSelectorOpDoesNotExist)": "DoesNotExist",
    "string(v1.NodeSelectorOpGt)": "Gt",
    "string(v1.NodeSelectorOpLt)": "Lt",
    "string(NodeSelectorOpGte)": "Gte",
    "string(NodeSelectorOpLte)": "Lte",
}


def pinned_version() -> str:
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        if line.startswith("KARPENTER_VERSION="):
            return line.split("=", 1)[1].split("#", 1)[0].strip()
    raise AssertionError("hack/versions.env pins no KARPENTER_VERSION")


@pytest.fixture(scope="module")
def source() -> Path:
    found = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/karpenter@{pinned_version()}"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env={**os.environ, "GOFLAGS": "-mod=mod"},
        timeout=300,
    )
    return Path(json.loads(found.stdout)["Dir"])


def go_set(text: str, name: str) -> set[str]:
    """The members of `name = sets.New(...)` (or sets.NewString) in Go source."""
    match = re.search(rf"\b{name}\s*=\s*sets\.New\w*(?:\[[^\]]*\])?\((.*?)\n\s*\)", text, re.S)
    assert match is not None, f"{name} is no longer a set literal"
    members = [m.strip() for m in match[1].split(",") if m.strip()]
    unknown = [m for m in members if m not in IDENTIFIERS]
    assert not unknown, f"{name} has members this test does not know: {unknown}"
    return {IDENTIFIERS[m] for m in members}


def test_the_restricted_labels_domains_and_operators_are_the_pinned_karpenters(
    source: Path,
) -> None:
    labels = (source / "pkg/apis/v1/labels.go").read_text()
    validation = (source / "pkg/apis/v1/nodeclaim_validation.go").read_text()

    assert go_set(labels, "RestrictedLabelDomains") == karpenter_rules.RESTRICTED_LABEL_DOMAINS
    assert go_set(labels, "RestrictedLabels") == karpenter_rules.RESTRICTED_LABELS
    assert go_set(labels, "WellKnownLabels") == karpenter_rules.WELL_KNOWN_LABELS
    assert go_set(validation, "SupportedNodeSelectorOps") == karpenter_rules.SUPPORTED_OPERATORS


def test_the_provisioner_still_validates_pending_pods_the_way_the_rules_copy(
    source: Path,
) -> None:
    provisioner = (source / "pkg/controllers/provisioning/provisioner.go").read_text()
    validate = re.search(r"func \(p \*Provisioner\) Validate\(.*?\n}\n", provisioner, re.S)
    assert validate is not None
    for check in (
        "validateKarpenterManagedLabelCanExist",
        "validateNodeSelector",
        "validateAffinity",
    ):
        assert check in validate[0]
    assert "node selector term with matchFields is not supported" in provisioner
    assert "v1.ValidateRequirement" in provisioner
