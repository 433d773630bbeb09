"""The plan cache: a memoized plan gives every admission exactly the decision an
unmemoized one would, whatever came before it; and pods of one template share a plan."""

import copy
import json
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doubles.pods import (
    as_the_api_server_sends_it,
    deployment_pod,
    namespace,
    request,
    review,
)
from gpupack import keys, seal
from gpupack.policy import PolicySet
from gpupack.recommendation import Recommendation
from tests.webhook.test_fuzz import pods
from tests.webhook.test_rightsizing import gpupolicy, lookup, policies, rec
from webhook.decision import Decision, Outcome, Reason
from webhook.mutate import MutationContext, decide
from webhook.plans import PlanCache
from webhook.policies import BUILTIN_POLICIES
from webhook.review import parse_review

KEY = b"k" * 32
NOW = 1_790_000_000
OPTED_IN = namespace({keys.OPTIMIZE: "enabled"})
NAMESPACES = [
    None,
    OPTED_IN,
    namespace(),
    namespace({keys.OPTIMIZE: "enabled"}, {keys.POLICY: "batch"}),
]
POLICY_SETS = [BUILTIN_POLICIES, policies(gpupolicy("batch", initialCompute="700m"))]
RECOMMENDATIONS: list[Recommendation | None] = [
    None,
    rec(),
    rec(compute=450),
    rec(policy="batch", compute=250),
]


def context(ns: Any, policy_set: PolicySet, recommendation: Any, mps: bool) -> MutationContext:
    return MutationContext(
        ns, policy_set, lookup(*([recommendation] if recommendation else [])), KEY, NOW, mps
    )


contexts = st.builds(
    context,
    st.sampled_from(NAMESPACES),
    st.sampled_from(POLICY_SETS),
    st.sampled_from(RECOMMENDATIONS),
    st.booleans(),
)
labelled = st.sampled_from([None, "enabled"])


def opted(pod: dict[str, Any], label: str | None) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    if label is not None:
        pod.setdefault("metadata", {}).setdefault("labels", {})[keys.OPTIMIZE] = label
    return pod


templates = st.one_of(
    st.builds(opted, st.just(deployment_pod()), labelled),
    st.builds(
        opted, st.just(deployment_pod(nodeSelector={keys.GFD_MEMORY_MIB: "24576"})), labelled
    ),
    st.builds(opted, st.just(deployment_pod()), st.just("enabled")).map(
        lambda p: {
            **p,
            "metadata": {**p["metadata"], "annotations": {keys.POLICY: "real-time-mps"}},
        }
    ),
    st.builds(opted, st.just(deployment_pod()), st.just("enabled")).map(
        lambda p: {
            **p,
            "metadata": {**p["metadata"], "annotations": {keys.POLICY: "real-time-mps"}},
            "spec": {
                **p["spec"],
                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
                "containers": [
                    {**c, "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
                    for c in p["spec"]["containers"]
                ],
            },
        }
    ),
    st.builds(opted, pods, labelled),
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(templates, contexts), min_size=1, max_size=12), st.randoms())
def test_a_memoized_plan_gives_every_admission_the_decision_an_unmemoized_one_would(
    admissions: list[tuple[dict[str, Any], MutationContext]], rnd: Any
) -> None:
    plans = PlanCache(size=4)  # small: evictions happen too
    sequence = admissions * 2  # each template comes again, under the same context
    rnd.shuffle(sequence)
    for index, (pod, ctx) in enumerate(sequence):
        sent = as_the_api_server_sends_it(pod, f"{rnd.randrange(10**5):05d}")
        req = parse_review(json.dumps(review(sent, uid=f"uid-{index}")).encode())
        assert decide(req, ctx, plan=plans) == decide(req, ctx)


def admit(pod: dict[str, Any], uid: str, plans: PlanCache, ctx: MutationContext) -> Decision:
    return decide(request(pod, uid=uid), ctx, plan=plans)


def test_pods_of_one_template_share_a_plan_and_differ_only_in_their_identity() -> None:
    counted: list[bool] = []
    plans = PlanCache(counted=counted.append)
    ctx = context(OPTED_IN, BUILTIN_POLICIES, None, True)
    first = admit(as_the_api_server_sends_it(deployment_pod(), "x1"), "uid-1", plans, ctx)
    second = admit(as_the_api_server_sends_it(deployment_pod(), "y2"), "uid-2", plans, ctx)

    assert counted == [False, True]
    assert (first.outcome, second.outcome) == (Outcome.MUTATED, Outcome.MUTATED)
    assert first.demand is not None
    assert second.demand is not None
    assert (first.demand.decision_id, second.demand.decision_id) == ("uid-1", "uid-2")
    assert second.annotations[keys.DECISION] == "uid-2"
    # Each carries a seal over its own decision id, which the scheduler verifies.
    assert seal.verify(KEY, "ml", second.annotations) == NOW
    assert first.annotations[keys.SEAL] != second.annotations[keys.SEAL]
    # The first decision was not changed by stamping the second from the same plan.
    assert first == admit(
        as_the_api_server_sends_it(deployment_pod(), "x1"), "uid-1", PlanCache(), ctx
    )


def test_what_the_plan_reads_is_what_it_is_keyed_on() -> None:
    counted: list[bool] = []
    plans = PlanCache(counted=counted.append)
    base = context(OPTED_IN, BUILTIN_POLICIES, None, True)
    before = admit(deployment_pod(), "u", plans, base)
    not_opted = context(namespace(), BUILTIN_POLICIES, None, True)
    recommended = context(OPTED_IN, BUILTIN_POLICIES, rec(), True)

    assert admit(deployment_pod(), "u", plans, not_opted).reason is Reason.NOT_OPTED_IN
    assert admit(deployment_pod(), "u", plans, recommended).recommendation == rec()
    assert admit(opted(deployment_pod(), "enabled"), "u", plans, base).outcome is Outcome.MUTATED
    assert admit(deployment_pod(), "u", plans, base) == before
    assert counted == [False, False, False, False, True]

    admit(deployment_pod(), "u", plans, context(OPTED_IN, POLICY_SETS[1], None, True))
    assert len(plans) == 1  # a new policy set: the old plans are gone


def test_the_least_recently_used_plans_go_first() -> None:
    ctx = context(OPTED_IN, BUILTIN_POLICIES, None, True)
    one, two, three = (deployment_pod(priority=p) for p in (1, 2, 3))  # three templates
    counted: list[bool] = []
    plans = PlanCache(size=2, counted=counted.append)
    for pod in (one, two, one, three, one, two):
        admit(pod, "u", plans, ctx)

    assert counted == [False, False, True, False, True, False]
    assert len(plans) == 2


def test_a_pod_this_admission_already_sealed_is_left_alone_whatever_is_cached() -> None:
    plans = PlanCache()
    ctx = context(OPTED_IN, BUILTIN_POLICIES, None, True)
    first = admit(deployment_pod(), "uid-1", plans, ctx)
    rewritten = jsonpatch.apply_patch(request(deployment_pod()).pod, list(first.patch))
    again = decide(request(rewritten, uid="uid-1"), ctx, plan=plans)

    assert (again.reason, again.patch) == (Reason.ALREADY_MUTATED, ())
