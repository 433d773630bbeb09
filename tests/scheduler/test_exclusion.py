"""Which nodes a capacity pod's inherited constraints already keep it off (so they need
no naming), and how NodeLabels labels GPU nodes: once, never changing a value."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupack import keys
from gpupack.runtime.api import ApiError
from scheduler.exclusion import (
    KARPENTER_API,
    Autoscaler,
    NodeLabels,
    already_excluded,
    node_label_value,
)
from tests.gpupack.karpenter_rules import requirement_errors
from tests.scheduler.test_manifest import node_names

JSON = dict[str, Any]
L4 = {keys.GFD_PRODUCT: "NVIDIA-L4", "zone": "a", "gpus": "2"}


def node(labels: dict[str, str] | None = None, taints: list[JSON] | None = None) -> JSON:
    return {
        "metadata": {"name": "gpu-l4-0", "labels": dict(labels or L4), "resourceVersion": "7"},
        "spec": {"taints": taints or []},
    }


def required(*terms: list[JSON]) -> JSON:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]
                }
            }
        }
    }


def expr(key: str, operator: str, *values: str) -> JSON:
    return {"key": key, "operator": operator, "values": list(values)}


GPU_TAINT = {"key": keys.NVIDIA_GPU, "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("scheduling", "target", "excluded"),
    [
        pytest.param({}, node(), False, id="nothing-inherited"),
        pytest.param(
            {"nodeSelector": {keys.GFD_PRODUCT: "NVIDIA-A100"}},
            node(),
            True,
            id="selector-other-model",
        ),
        pytest.param(
            {"nodeSelector": {keys.GFD_PRODUCT: "NVIDIA-L4"}},
            node(),
            False,
            id="selector-same-model",
        ),
        pytest.param(required([expr("zone", "In", "b")]), node(), True, id="affinity-in-misses"),
        pytest.param(
            required([expr("zone", "In", "b")], [expr("zone", "In", "a")]),
            node(),
            False,
            id="second-term-matches",
        ),
        pytest.param(required([expr("zone", "NotIn", "a")]), node(), True, id="notin-hits"),
        pytest.param(
            required([expr("rack", "NotIn", "r1")]), node(), False, id="notin-absent-label"
        ),
        pytest.param(required([expr("rack", "Exists")]), node(), True, id="exists-absent"),
        pytest.param(
            required([expr("zone", "DoesNotExist")]), node(), True, id="doesnotexist-present"
        ),
        pytest.param(required([expr("gpus", "Gt", "4")]), node(), True, id="gt-fails"),
        pytest.param(required([expr("gpus", "Lt", "4")]), node(), False, id="lt-holds"),
        pytest.param(
            required([expr("zone", "Gt", "4")]), node(), False, id="gt-unparsable-unjudged"
        ),
        pytest.param(
            required([expr("zone", "Sometimes", "a")]), node(), False, id="unknown-operator"
        ),
        pytest.param(required([]), node(), False, id="empty-term-unjudged"),
        pytest.param(
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchFields": [expr("metadata.name", "NotIn", "gpu-l4-0")]}
                            ]
                        }
                    }
                }
            },
            node(),
            True,
            id="match-fields-name",
        ),
        pytest.param({}, node(taints=[GPU_TAINT]), True, id="untolerated-taint"),
        pytest.param(
            {"tolerations": [{"key": keys.NVIDIA_GPU, "operator": "Exists"}]},
            node(taints=[GPU_TAINT]),
            False,
            id="tolerated-taint",
        ),
        pytest.param(
            {"tolerations": [{"key": keys.NVIDIA_GPU, "value": "other", "effect": "NoSchedule"}]},
            node(taints=[GPU_TAINT]),
            True,
            id="toleration-other-value",
        ),
        pytest.param(
            {"tolerations": [{"operator": "Exists"}]},
            node(taints=[GPU_TAINT]),
            False,
            id="tolerate-all",
        ),
        pytest.param(
            {},
            node(taints=[{"key": "team", "effect": "PreferNoSchedule"}]),
            False,
            id="prefer-no-schedule",
        ),
        pytest.param(
            {},
            node(taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
            False,
            id="transient-taint",
        ),
    ],
)
def test_a_node_is_already_excluded_only_where_the_inherited_constraints_say_so_for_sure(
    scheduling: JSON, target: JSON, excluded: bool
) -> None:
    assert already_excluded(scheduling, target) is excluded


def test_a_node_the_informer_no_longer_has_is_not_judged() -> None:
    assert already_excluded({"nodeSelector": {"a": "b"}}, None) is False


class Nodes:
    """GET and merge PATCH of Node objects, and discovery of Karpenter's API."""

    def __init__(self, *, karpenter: bool = True, conflicts: int = 0) -> None:
        self.nodes = {"gpu-l4-0": node()}
        self.karpenter = karpenter
        self.conflicts = conflicts
        self.gets: list[str] = []
        self.patches: list[JSON] = []

    def get(self, path: str) -> JSON:
        self.gets.append(path)
        if path == KARPENTER_API:
            if self.karpenter:
                return {}
            raise ApiError(404, "NotFound", "not found")
        found = self.nodes.get(path.rsplit("/", 1)[1])
        if found is None:
            raise ApiError(404, "NotFound", "not found")
        return found

    def patch(self, path: str, body: JSON, content_type: str = "") -> JSON:
        self.patches.append(body)
        meta = self.get(path)["metadata"]
        if self.conflicts:
            self.conflicts -= 1
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if body["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        meta["labels"].update(body["metadata"]["labels"])
        return self.nodes[path.rsplit("/", 1)[1]]


def labels(api: Nodes, autoscaler: Autoscaler = Autoscaler.AUTO, **kw: Any) -> NodeLabels:
    return NodeLabels(api, autoscaler, **kw)  # type: ignore[arg-type]


def test_a_node_without_the_label_gets_its_name_with_its_resource_version_as_precondition() -> None:
    api = Nodes()
    written: list[str] = []

    assert labels(api, written=written.append).ensure(["gpu-l4-0"], {}) == {"gpu-l4-0": "gpu-l4-0"}
    assert api.patches == [
        {"metadata": {"resourceVersion": "7", "labels": {keys.NODE: "gpu-l4-0"}}}
    ]
    assert written == ["labelled"]


def test_a_node_that_changed_meanwhile_is_read_again_and_a_label_found_then_is_kept() -> None:
    api = Nodes(conflicts=1)
    api.nodes["gpu-l4-0"]["metadata"]["labels"][keys.NODE] = "7731"  # Karpenter's, say
    assert labels(api).ensure(["gpu-l4-0"], {}) == {"gpu-l4-0": "7731"}
    assert api.patches == []

    api.nodes["gpu-l4-0"]["metadata"]["labels"].pop(keys.NODE)
    assert labels(api).ensure(["gpu-l4-0"], {}) == {"gpu-l4-0": "gpu-l4-0"}
    assert len(api.patches) == 2  # the first one met the conflict


def test_a_label_the_informer_shows_is_used_without_a_call_and_a_gone_node_is_left_out() -> None:
    api = Nodes()
    found = labels(api).ensure(["gpu-l4-0", "gone"], {"gpu-l4-0": "n0"})
    assert found == {"gpu-l4-0": "n0"}
    assert api.patches == []


def test_a_refused_label_raises_so_that_no_capacity_pod_names_too_few_nodes() -> None:
    class Refusing(Nodes):
        def patch(self, path: str, body: JSON, content_type: str = "") -> JSON:
            raise ApiError(403, "Forbidden", "no")

    written: list[str] = []
    with pytest.raises(ApiError):
        labels(Refusing(), written=written.append).ensure(["gpu-l4-0"], {})
    assert written == ["failed"]


@pytest.mark.parametrize(
    ("autoscaler", "served", "by_label"),
    [
        pytest.param(Autoscaler.AUTO, True, True, id="auto-served"),
        pytest.param(Autoscaler.AUTO, False, False, id="auto-not-served"),
        pytest.param(Autoscaler.KARPENTER, False, True, id="karpenter"),
        pytest.param(Autoscaler.CLUSTER_AUTOSCALER, True, False, id="cluster-autoscaler"),
        pytest.param(Autoscaler.NONE, True, False, id="none"),
    ],
)
def test_the_nodes_are_named_by_label_only_where_karpenter_runs(
    autoscaler: Autoscaler, served: bool, by_label: bool
) -> None:
    assert labels(Nodes(karpenter=served), autoscaler).by_label() is by_label


def test_auto_asks_the_api_server_every_10_s_and_keeps_its_answer_when_it_cannot_say() -> None:
    now = [0.0]
    api = Nodes(karpenter=False)
    naming = labels(api, clock=lambda: now[0])
    assert naming.by_label() is False
    now[0] = 5.0
    api.karpenter = True
    assert naming.by_label() is False  # not asked again yet
    now[0] = 11.0
    assert naming.by_label() is True  # Karpenter installed since

    class Down(Nodes):
        def get(self, path: str) -> JSON:
            raise ApiError(503, "ServiceUnavailable", "etcd")

    assert labels(Down()).by_label() is True  # no answer yet: the form both autoscalers read
    assert api.gets.count(KARPENTER_API) == 2


def test_label_missing_claims_each_node_once_until_written() -> None:
    naming = labels(Nodes())
    assert naming.label_missing(["b", "a"], limit=1) == ["a"]
    assert naming.label_missing(["b", "a"]) == ["b"]
    naming.write(["a", "b"])  # both gone: nothing written, claims released
    assert naming.label_missing(["a"]) == ["a"]


@settings(max_examples=500, deadline=None)
@given(names=st.lists(node_names, min_size=2, max_size=6, unique=True))
def test_node_label_values_are_valid_and_tell_nodes_apart(names: list[str]) -> None:
    values = [node_label_value(n) for n in names]
    for value in values:
        assert requirement_errors({"key": keys.NODE, "operator": "NotIn", "values": [value]}) == []
    assert len(set(values)) == len(values)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param("gpu-a100-0", "gpu-a100-0", id="short-name-is-itself"),
        pytest.param("ip-10-0-1-17.ec2.internal", "ip-10-0-1-17.ec2.internal", id="dotted"),
        pytest.param("n" * 63, "n" * 63, id="63-characters"),
    ],
)
def test_a_node_name_that_is_a_label_value_is_its_own_label(name: str, value: str) -> None:
    assert node_label_value(name) == value


def test_a_long_node_name_is_shortened_with_a_digest_no_node_name_can_equal() -> None:
    name = "gke-very-long-cluster-name-gpu-pool-l4-ab12cd34-" + "x" * 30
    value = node_label_value(name)

    assert len(value) <= 63
    assert value.startswith(name[:40])
    assert "_" in value  # in no node name


def test_housekeeping_is_asked_to_label_only_where_labels_may_be_needed() -> None:
    """`may_label` never blocks: with `auto`, yes until the API server has answered, no
    after it said Karpenter is not there, until that answer is due again."""
    now = [0.0]
    naming = labels(Nodes(karpenter=False), clock=lambda: now[0])
    assert naming.may_label() is True  # not asked yet
    naming.by_label()
    assert naming.may_label() is False
    now[0] = 10.0
    assert naming.may_label() is True  # due to ask again
    assert labels(Nodes(), Autoscaler.KARPENTER).may_label() is True
    assert labels(Nodes(), Autoscaler.CLUSTER_AUTOSCALER).may_label() is False
    assert labels(Nodes(), Autoscaler.NONE).may_label() is False
