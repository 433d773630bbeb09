"""Every capacity pod the creator can build is one Karpenter acts on: nothing gpupack adds
to a workload's scheduling metadata is a requirement Karpenter's provisioner refuses
(`karpenter_rules`, from the pinned release's source)."""

import string
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupack import keys
from scheduler.exclusion import node_label_value
from scheduler.manifest import Where, capacity_pod
from tests.gpupack.karpenter_rules import refusals

JSON = dict[str, Any]

_label = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=12)
node_names = st.builds(
    lambda parts, long: ".".join(parts) + ("-" + "x" * 70 if long else ""),
    st.lists(_label, min_size=1, max_size=4),
    st.booleans(),
).filter(lambda n: len(n) <= 253)

# Scheduling metadata a workload may carry that Karpenter itself accepts.
products = st.sampled_from(["NVIDIA-L4", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"])
expressions = st.one_of(
    st.builds(
        lambda p: {"key": keys.GFD_PRODUCT, "operator": "In", "values": [p]},
        products,
    ),
    st.builds(
        lambda z: {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": [z]},
        _label,
    ),
    st.just({"key": "team.example.com/gpu", "operator": "Exists"}),
)
inherited = st.fixed_dictionaries(
    {},
    optional={
        "nodeSelector": st.builds(lambda p: {keys.GFD_PRODUCT: p}, products),
        "affinity": st.builds(
            lambda terms: {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
                    }
                }
            },
            st.lists(st.lists(expressions, min_size=1, max_size=3), min_size=1, max_size=3),
        ),
        "tolerations": st.just([{"key": keys.NVIDIA_GPU, "operator": "Exists"}]),
        "priorityClassName": st.just("inference"),
    },
)
near_terms = st.lists(
    st.builds(
        lambda app: {
            "labelSelector": {"matchLabels": {"app": app}},
            "topologyKey": "kubernetes.io/hostname",
        },
        _label,
    ),
    max_size=2,
)


@settings(max_examples=300, deadline=None)
@given(
    scheduling=inherited,
    avoid=st.lists(node_names, max_size=12, unique=True),
    steer=st.lists(node_names, max_size=5, unique=True),
    near=near_terms,
    karpenter_labelled=st.dictionaries(node_names, st.integers(0, 2**63).map(str), max_size=3),
)
def test_every_capacity_pod_named_by_gpupacks_node_label_is_one_karpenter_takes(
    scheduling: JSON,
    avoid: list[str],
    steer: list[str],
    near: list[JSON],
    karpenter_labelled: dict[str, str],
) -> None:
    assert refusals({"spec": scheduling}) == []  # the workload's own metadata passes
    labels = {name: node_label_value(name) for name in avoid} | {
        n: v for n, v in karpenter_labelled.items() if n in avoid
    }
    where = Where(steer=tuple(steer), packed=tuple(steer), avoid=tuple(avoid), near=tuple(near))

    pod = capacity_pod(
        "p1", scheduling, index=0, created_for="ml/Deployment/x", where=where, node_labels=labels
    )

    assert refusals(pod) == []
    terms = (
        pod["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    for term in terms if avoid else ():  # each ORed term keeps every avoided node out
        [exclusion] = [e for e in term["matchExpressions"] if e["key"] == keys.NODE]
        assert set(exclusion["values"]) == {labels[n] for n in avoid}


def test_the_hostname_form_is_what_karpenter_refuses() -> None:
    """The rules can fail: the form capacity pods had before is dropped by Karpenter."""
    pod = capacity_pod(
        "p1", {}, index=0, created_for="ml/Deployment/x", where=Where(avoid=("gpu-a100-0",))
    )

    assert refusals(pod) == [
        "using label kubernetes.io/hostname is not allowed as it might interfere with the "
        "internal provisioning logic"
    ]
