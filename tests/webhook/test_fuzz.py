"""Hypothesis fuzzing of the review parser and the mutation: no input crashes them, and
every mutation applies cleanly and is idempotent."""

import copy
import json
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doubles.pods import deployment_pod, review
from gpupack import keys
from webhook.decision import Outcome, Reason
from webhook.mutate import MutationContext, decide
from webhook.review import ReviewError, parse_review

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
names = st.text(alphabet="abcz~/.-_", min_size=1, max_size=12)
quantities = st.sampled_from(["0", "1", "2", "1.5", "500m", "x", 1, 2, 0]) | st.text(max_size=5)
resources = st.dictionaries(
    st.sampled_from([keys.NVIDIA_GPU, "cpu", "memory", "nvidia.com/mig-1g.5gb", "example.com/x"]),
    quantities,
    max_size=3,
)
env_var = st.fixed_dictionaries(
    {"name": st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "A", "B"])},
    optional={"value": st.text(max_size=5)},
)
container = st.fixed_dictionaries(
    {"name": names, "image": st.just("img")},
    optional={
        "resources": st.fixed_dictionaries(
            {}, optional={"limits": resources, "requests": resources}
        ),
        "env": st.lists(env_var, max_size=4),
        "restartPolicy": st.just("Always"),
    },
)
annotation_map = st.dictionaries(
    st.sampled_from([keys.POLICY, keys.GPU_COMPUTE, keys.GPU_MEMORY, keys.GPU_UUID, keys.DECISION])
    | names,
    st.sampled_from(["batch", "300m", "12Gi", "real-time-mps", "x", "0.5", "2"])
    | st.text(max_size=6),
    max_size=4,
)
pods = st.builds(
    lambda containers, init, annotations, labels, extra: {
        "metadata": {
            "namespace": "ml",
            "generateName": "p-",
            **({"annotations": annotations} if annotations is not None else {}),
            "labels": labels,
        },
        "spec": {"containers": containers, **({"initContainers": init} if init else {}), **extra},
    },
    st.lists(container, min_size=1, max_size=3),
    st.lists(container, max_size=2),
    st.none() | annotation_map,
    st.dictionaries(
        st.sampled_from([keys.OPTIMIZE, "app"]),
        st.sampled_from(["enabled", "disabled", "x"]),
        max_size=2,
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "schedulerName": st.sampled_from(["default-scheduler", "gpupack-scheduler", "other"]),
            "nodeName": st.just("n1"),
        },
    ),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_parser_never_crashes_on_arbitrary_json(doc: Any) -> None:
    try:
        parse_review(json.dumps(doc).encode())
    except ReviewError as exc:
        assert exc.status in (400, 413)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["uid", "kind", "operation", "object", "namespace", "dryRun", "userInfo"]),
        json_values,
    )
)
def test_parser_never_crashes_on_mangled_requests(request_fields: dict[str, Any]) -> None:
    doc = review(deployment_pod())
    doc["request"].update(request_fields)
    try:
        parse_review(json.dumps(doc).encode())
    except ReviewError as exc:
        assert exc.status == 400


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(pods)
def test_any_pod_gets_a_decision_whose_patch_applies_and_is_idempotent(pod: Any) -> None:
    parsed = parse_review(json.dumps(review(pod, uid="u1")).encode())
    original = copy.deepcopy(parsed.pod)
    decision = decide(parsed, MutationContext())
    assert parsed.pod == original
    result = jsonpatch.apply_patch(parsed.pod, list(decision.patch))
    annotations = (result.get("metadata") or {}).get("annotations") or {}
    assert keys.GPU_UUID not in annotations
    if decision.outcome is Outcome.MUTATED:
        again = decide(
            parse_review(json.dumps(review(result, uid="u2")).encode()), MutationContext()
        )
        assert (again.reason, again.patch) == (Reason.ALREADY_MUTATED, ())
