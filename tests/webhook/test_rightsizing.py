"""Policies from GPUPolicy objects and allocations from GPURecommendations, as a table.

Each row is a pod, the policies in force and the recommendations that exist; the decision
must pick the allocation (pinned, recommended or initial, per dimension), say where it
came from, and warn where an operator's object is broken, never deny because of one.
"""

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import pytest

from doubles.pods import TestPod, deployment_pod, namespace, request
from gpupack import keys
from gpupack.objects import JSON
from gpupack.policy import (
    API_VERSION,
    BUILTIN,
    KIND,
    PolicySet,
    effective_policies,
    policy_spec,
)
from gpupack.recommendation import Recommendation
from gpupack.recommendation import recommendation_object as gpupack_recommendation_object
from webhook.audit import audit_line
from webhook.decision import Decision, Outcome, Reason
from webhook.mutate import MutationContext, decide
from webhook.policies import BUILTIN_POLICIES
from webhook.rightsizing import PolicyCache, RecommendationCache

GiB = 2**30
DESCRIBED = "GPURecommendation ml/deployment-llm (confidence 0.83)"


def gpupolicy(name: str, base: str | None = None, **spec: Any) -> JSON:
    """A GPUPolicy object as the chart installs it: the spec of built-in `base` (or of
    `name`), with `spec` overriding fields (None removes one)."""
    fields = policy_spec(BUILTIN[base or name])
    for key, value in spec.items():
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = value
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": keys.SYSTEM_NAMESPACE, "resourceVersion": "1"},
        "spec": fields,
    }


def policies(*objects: JSON) -> PolicySet:
    return effective_policies(objects)


def rec(
    policy: str = "near-real-time",
    compute: int = 300,
    memory: int = 6 * GiB,
    *,
    kind: str = "Deployment",
    workload: str = "llm",
) -> Recommendation:
    return Recommendation(
        namespace="ml",
        kind=kind,
        workload=workload,
        policy=policy,
        compute=compute,
        memory=memory,
        confidence=0.83,
        last_change="2026-11-20T08:00:00Z",
        reason="p95 over 7d plus 15 % headroom",
    )


def lookup(*recs: Recommendation) -> Callable[[str, str, str], Recommendation | None]:
    by_workload = {(r.namespace, r.kind, r.workload): r for r in recs}

    def find(namespace: str, kind: str, name: str) -> Recommendation | None:
        return by_workload.get((namespace, kind, name))

    return find


def annotated(annotations: Mapping[str, str], **spec: Any) -> TestPod:
    pod = deployment_pod(**spec)
    pod["metadata"]["annotations"] = dict(annotations)
    return pod


Check = Callable[[TestPod, Decision], object]


def allocation(compute: str, memory: str) -> Check:
    def check(pod: TestPod, decision: Decision) -> None:
        got = pod["metadata"]["annotations"]
        assert (got[keys.GPU_COMPUTE], got[keys.GPU_MEMORY]) == (compute, memory)

    return check


def source(expected: str) -> Check:
    def check(pod: TestPod, decision: Decision) -> None:
        assert decision.allocation_source == expected

    return check


def source_has(text: str) -> Check:
    def check(pod: TestPod, decision: Decision) -> None:
        assert text in (decision.allocation_source or ""), decision.allocation_source

    return check


def used(expected: Recommendation | None) -> Check:
    def check(pod: TestPod, decision: Decision) -> None:
        assert decision.recommendation == expected

    return check


def policy(name: str, origin: str) -> Check:
    def check(pod: TestPod, decision: Decision) -> None:
        assert decision.policy == name
        assert pod["metadata"]["annotations"][keys.POLICY] == name
        assert (decision.policy_origin or "").startswith(origin), decision.policy_origin

    return check


def warned(*texts: str) -> Check:
    def check(pod: TestPod, decision: Decision) -> None:
        joined = " | ".join(decision.warnings)
        assert all(text in joined for text in texts), decision.warnings

    return check


def no_warnings(pod: TestPod, decision: Decision) -> None:
    assert decision.warnings == ()


@dataclass
class Case:
    pod: TestPod
    checks: list[Check]
    policy_set: PolicySet = BUILTIN_POLICIES
    recommendations: tuple[Recommendation, ...] = ()
    ns: JSON | None = None
    outcome: Outcome = Outcome.MUTATED
    extra: dict[str, Any] = field(default_factory=dict)


CASES = [
    # --- the recommendation ---
    pytest.param(
        Case(
            deployment_pod(),
            [allocation("300m", "6Gi"), source(f"recommendation {DESCRIBED}"), used(rec())],
            recommendations=(rec(),),
        ),
        id="recommendation-used",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            [allocation("400m", "8Gi"), source("policy-initial"), used(None)],
            recommendations=(rec(workload="other"),),
        ),
        id="another-workloads-recommendation-is-not-looked-up",
    ),
    pytest.param(
        Case(
            annotated({keys.GPU_COMPUTE: "700m"}),
            [allocation("700m", "6Gi"), source(f"pinned, recommendation {DESCRIBED}"), used(rec())],
            recommendations=(rec(),),
        ),
        id="pinned-compute-wins-memory-recommended",
    ),
    pytest.param(
        Case(
            annotated({keys.GPU_MEMORY: "10Gi"}),
            [
                allocation("300m", "10Gi"),
                source(f"pinned, recommendation {DESCRIBED}"),
                used(rec()),
            ],
            recommendations=(rec(),),
        ),
        id="pinned-memory-wins-compute-recommended",
    ),
    pytest.param(
        Case(
            annotated({keys.GPU_COMPUTE: "700m", keys.GPU_MEMORY: "10Gi"}),
            [
                allocation("700m", "10Gi"),
                source(
                    f"pinned, recommendation {DESCRIBED} not used: compute and memory are pinned"
                ),
                used(None),
            ],
            recommendations=(rec(),),
        ),
        id="both-pinned-recommendation-not-used",
    ),
    pytest.param(
        Case(
            annotated({keys.POLICY: "training"}),
            [
                allocation("1", "12Gi"),
                source(
                    "policy-initial, recommendation ignored: computed for policy batch, "
                    "pod uses training"
                ),
                used(None),
            ],
            recommendations=(rec(policy="batch"),),
        ),
        id="recommendation-for-another-policy-ignored",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            [
                allocation("400m", "8Gi"),
                source(
                    "policy-initial, recommendation ignored: policy near-real-time has "
                    "updateMode Off"
                ),
                used(None),
                policy("near-real-time", "GPUPolicy"),
            ],
            policy_set=policies(gpupolicy("near-real-time", updateMode="Off")),
            recommendations=(rec(),),
        ),
        id="update-mode-off-ignores-the-recommendation",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            [allocation("300m", "6Gi"), used(rec())],
            policy_set=policies(gpupolicy("near-real-time", updateMode="Auto")),
            recommendations=(rec(),),
        ),
        id="update-mode-auto-applies-it",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            [
                allocation("100m", "1Gi"),
                source_has(f"recommendation {DESCRIBED}"),
                source_has("recommended compute 20m clamped to 100m (policy near-real-time)"),
                source_has("recommended memory 512Mi clamped to 1Gi (policy near-real-time)"),
                used(rec(compute=20, memory=GiB // 2)),
            ],
            recommendations=(rec(compute=20, memory=GiB // 2),),
        ),
        id="recommendation-below-the-policy-minimum-clamped",
    ),
    pytest.param(
        Case(
            annotated({keys.POLICY: "build"}),
            [
                allocation("500m", "24Gi"),
                source_has("recommended compute 900m clamped to 500m (policy build)"),
                source_has("recommended memory 40Gi clamped to 24Gi (policy build)"),
            ],
            recommendations=(rec(policy="build", compute=900, memory=40 * GiB),),
        ),
        id="recommendation-above-the-policy-maximum-clamped",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            [
                allocation("300m", "6Gi"),
                source_has("recommended compute 700m clamped to 300m (policy near-real-time)"),
            ],
            policy_set=policies(
                gpupolicy("near-real-time", maxCompute="300m", initialCompute="300m")
            ),
            recommendations=(rec(compute=700),),
        ),
        id="clamped-to-the-gpupolicy-objects-bounds",
    ),
    pytest.param(
        Case(
            deployment_pod(nodeSelector={"nvidia.com/gpu.memory": "4096"}),
            [
                allocation("300m", "4Gi"),
                source(f"recommendation {DESCRIBED}, memory capped at the node selector's 4Gi"),
            ],
            recommendations=(rec(),),
        ),
        id="node-selector-memory-caps-the-recommendation",
    ),
    # --- GPUPolicy objects ---
    pytest.param(
        Case(
            deployment_pod(),
            [
                allocation("300m", "8Gi"),
                source("policy-initial"),
                policy("near-real-time", "GPUPolicy"),
                no_warnings,
            ],
            policy_set=policies(gpupolicy("near-real-time", initialCompute="300m")),
        ),
        id="gpupolicy-overrides-the-builtins-initial-allocation",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            [
                allocation("400m", "8Gi"),
                policy("near-real-time", "built-in (GPUPolicy near-real-time is invalid"),
                warned(
                    "GPUPolicy near-real-time is invalid, the built-in near-real-time applies",
                    "spec.percentile",
                ),
            ],
            policy_set=policies(gpupolicy("near-real-time", percentile="high")),
        ),
        id="invalid-gpupolicy-falls-back-to-the-builtin-with-a-warning",
    ),
    pytest.param(
        Case(
            annotated({keys.POLICY: "batch"}),
            [allocation("250m", "6Gi"), policy("batch", "built-in"), no_warnings],
            policy_set=policies(gpupolicy("near-real-time", percentile="high")),
        ),
        id="invalid-gpupolicy-warns-only-its-own-pods",
    ),
    pytest.param(
        Case(
            annotated({keys.POLICY: "gold"}),
            [allocation("600m", "16Gi"), policy("gold", "GPUPolicy"), no_warnings],
            policy_set=policies(
                gpupolicy("gold", "real-time", initialCompute="600m", initialMemory="16Gi")
            ),
        ),
        id="operator-added-policy-by-pod-annotation",
    ),
    pytest.param(
        Case(
            annotated({keys.POLICY: "gold"}),
            [
                allocation("400m", "8Gi"),
                policy("near-real-time", "built-in"),
                warned(
                    "GPUPolicy gold is invalid, the auto-detected policy applies instead of "
                    "the pod annotation's",
                    "spec.minCompute",
                ),
            ],
            policy_set=policies(gpupolicy("gold", "real-time", minCompute=None)),
        ),
        id="invalid-operator-policy-by-pod-annotation-falls-back-instead-of-denying",
    ),
    pytest.param(
        Case(
            deployment_pod(),
            [
                policy("near-real-time", "built-in"),
                warned("GPUPolicy gold is invalid", "namespace annotation's"),
            ],
            policy_set=policies(gpupolicy("gold", "real-time", minCompute=None)),
            ns=namespace({keys.OPTIMIZE: "enabled"}, {keys.POLICY: "gold"}),
        ),
        id="invalid-operator-policy-by-namespace-annotation-falls-back",
    ),
    pytest.param(
        Case(
            annotated({keys.POLICY: "silver"}),
            [lambda p, d: d.reason is Reason.UNKNOWN_POLICY or pytest.fail(str(d.reason))],
            policy_set=policies(gpupolicy("gold", "real-time", minCompute=None)),
            outcome=Outcome.DENIED,
        ),
        id="a-policy-nobody-defined-is-still-denied",
    ),
    pytest.param(
        Case(
            annotated({keys.POLICY: "gold"}),
            [allocation("250m", "2Gi"), used(rec(policy="gold", compute=250, memory=2 * GiB))],
            policy_set=policies(gpupolicy("gold", "real-time")),
            recommendations=(rec(policy="gold", compute=250, memory=2 * GiB),),
        ),
        id="recommendation-for-an-operator-policy",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_rightsizing_rules(case: Case) -> None:
    ctx = MutationContext(case.ns, case.policy_set, lookup(*case.recommendations))
    decision = decide(request(case.pod), ctx)
    assert decision.outcome is case.outcome, decision.message
    mutated = jsonpatch.apply_patch(copy.deepcopy(case.pod), list(decision.patch))
    for check in case.checks:
        check(mutated, decision)


def test_the_audit_line_shows_the_recommendation_and_the_policys_origin() -> None:
    ctx = MutationContext(
        policy_set=policies(gpupolicy("near-real-time", initialCompute="300m")),
        recommendation=lookup(rec(memory=3 * GiB)),
    )
    req = request(deployment_pod())
    decision = decide(req, ctx)
    line = audit_line(req, decision, None, 0.001, datetime(2026, 11, 21, tzinfo=UTC))
    assert (line["compute"], line["memory"]) == ("300m", "3Gi")
    assert line["allocationSource"] == f"recommendation {DESCRIBED}"
    assert line["recommendation"] == {
        "name": "deployment-llm",
        "compute": "300m",
        "memory": "3Gi",
        "confidence": 0.83,
        "lastChange": "2026-11-20T08:00:00Z",
    }
    assert line["policyOrigin"] == "GPUPolicy"


def test_the_audit_line_says_why_a_recommendation_was_ignored() -> None:
    ctx = MutationContext(recommendation=lookup(rec(policy="batch")))
    req = request(deployment_pod())
    line = audit_line(req, decide(req, ctx), None, 0.001, datetime(2026, 11, 21, tzinfo=UTC))
    assert "recommendation" not in line
    assert line["allocationSource"] == (
        "policy-initial, recommendation ignored: computed for policy batch, pod uses near-real-time"
    )
    assert line["policyOrigin"] == "built-in"


def test_the_invalid_policy_warning_is_in_the_audit_line() -> None:
    ctx = MutationContext(policy_set=policies(gpupolicy("near-real-time", percentile="high")))
    req = request(deployment_pod())
    line = audit_line(req, decide(req, ctx), None, 0.001, datetime(2026, 11, 21, tzinfo=UTC))
    (warning,) = line["warnings"]
    assert warning.startswith(
        "GPUPolicy near-real-time is invalid, the built-in near-real-time applies: "
    )


# The caches the Cluster feeds from its watches (webhook.rightsizing).


def recommendation_object(recommendation: Recommendation, version: str = "1") -> JSON:
    obj = gpupack_recommendation_object(recommendation, {"samples": 1200})
    obj["metadata"]["resourceVersion"] = version
    return obj


def test_policy_cache_starts_with_the_builtins_and_follows_the_objects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = PolicyCache()
    assert cache.current == BUILTIN_POLICIES
    assert not cache.ready

    override = gpupolicy("near-real-time", initialCompute="300m")
    cache.update([override])
    assert cache.ready
    assert cache.current.policies["near-real-time"].initial_compute == 300
    assert cache.current.from_objects == {"near-real-time"}
    assert caplog.records == []

    cache.update([])  # the object was deleted: the built-in is back
    assert cache.current.policies["near-real-time"] == BUILTIN["near-real-time"]


def test_an_invalid_gpupolicy_is_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    cache = PolicyCache()
    broken = gpupolicy("batch", percentile="high")
    gold = gpupolicy("gold", "real-time")
    cache.update([broken, gold])
    cache.update([broken, gold])  # another object changed; this one did not
    cache.update([broken])
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "invalid GPUPolicy batch (the built-in applies)" in caplog.records[0].getMessage()
    assert "spec.percentile: invalid value 'high'" in caplog.records[0].getMessage()
    assert cache.current.policies["batch"] == BUILTIN["batch"]
    assert "batch" in cache.current.invalid

    changed = copy.deepcopy(broken)
    changed["metadata"]["resourceVersion"] = "2"
    cache.update([changed])
    assert len(caplog.records) == 2  # a new version of the object: logged again


def test_recommendation_cache_parses_on_change_and_checks_the_workload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = RecommendationCache()
    assert not cache.ready
    web = rec()
    cache.reset([recommendation_object(web)])
    assert cache.ready
    assert cache.lookup("ml", "Deployment", "llm") == web
    assert cache.lookup("other", "Deployment", "llm") is None
    assert cache.lookup("ml", "StatefulSet", "llm") is None

    newer = rec(compute=450)
    cache.changed("ml/deployment-llm", recommendation_object(newer, "2"))
    assert cache.lookup("ml", "Deployment", "llm") == newer

    cache.changed("ml/deployment-llm", None)
    assert cache.lookup("ml", "Deployment", "llm") is None
    assert len(cache) == 0
    assert caplog.records == []


def test_recommendation_cache_treats_bad_or_empty_objects_as_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = RecommendationCache()
    bad = recommendation_object(rec())
    bad["status"]["compute"] = "lots"
    empty = recommendation_object(rec(workload="new"))
    del empty["status"]  # the recommender created it, no value yet
    elsewhere = recommendation_object(rec(workload="web"))
    elsewhere["metadata"]["name"] = "deployment-other"  # named for one workload, targets another
    cache.reset([bad, empty, elsewhere])
    cache.changed("ml/deployment-llm", bad)  # the same version again: not logged again

    assert cache.lookup("ml", "Deployment", "llm") is None
    assert cache.lookup("ml", "Deployment", "new") is None
    assert cache.lookup("ml", "Deployment", "other") is None
    assert cache.lookup("ml", "Deployment", "web") is None
    assert len(cache) == 3
    assert len(caplog.records) == 1
    assert "ignoring GPURecommendation ml/deployment-llm" in caplog.records[0].getMessage()
    assert "status.compute" in caplog.records[0].getMessage()
