import base64
import json

import pytest

from doubles.pods import deployment_pod, review
from webhook.review import MAX_BODY_BYTES, ReviewError, allow, deny, parse_review


def body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def test_a_realistic_review_parses() -> None:
    parsed = parse_review(body(review(deployment_pod(), uid="abc", dry_run=True)))
    assert (parsed.uid, parsed.operation, parsed.namespace, parsed.dry_run) == (
        "abc",
        "CREATE",
        "ml",
        True,
    )
    assert parsed.username.endswith("replicaset-controller")


def _without_request_field(field: str) -> bytes:
    doc = review(deployment_pod())
    del doc["request"][field]
    return body(doc)


def _with(path: tuple[str, ...], value: object) -> bytes:
    doc = review(deployment_pod())
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body(doc)


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        pytest.param(b"{not json", 400, "not valid JSON", id="malformed-json"),
        pytest.param(b"\xff\xfe", 400, "not valid JSON", id="binary"),
        pytest.param(b"[]", 400, "JSON object", id="array"),
        pytest.param(
            body({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            400,
            "request is missing",
            id="missing-request",
        ),
        pytest.param(
            _without_request_field("uid"), 400, "request.uid is missing", id="missing-uid"
        ),
        pytest.param(_with(("request", "uid"), ""), 400, "request.uid", id="empty-uid"),
        pytest.param(
            _with(("apiVersion",), "admission.k8s.io/v1beta1"),
            400,
            "admission.k8s.io/v1",
            id="v1beta1",
        ),
        pytest.param(_with(("kind",), "Pod"), 400, "AdmissionReview", id="wrong-kind"),
        pytest.param(
            _with(("request", "kind", "kind"), "Deployment"),
            400,
            "only core/v1 Pods",
            id="not-a-pod",
        ),
        pytest.param(_with(("request", "object"), None), 400, "request.object", id="no-object"),
        pytest.param(
            _with(("request", "object", "spec"), []),
            400,
            "spec must be an object",
            id="spec-not-object",
        ),
        pytest.param(
            _with(("request", "object", "spec", "containers"), {}),
            400,
            "containers must be a list",
            id="containers-not-list",
        ),
        pytest.param(
            _with(("request", "object", "spec", "containers"), ["x"]),
            400,
            "containers[0]",
            id="container-not-object",
        ),
        pytest.param(
            _with(("request", "operation"), 3), 400, "operation", id="operation-not-string"
        ),
        pytest.param(b" " * (MAX_BODY_BYTES + 1), 413, "limit", id="too-large"),
    ],
)
def test_bad_reviews_get_a_clear_client_error(raw: bytes, status: int, fragment: str) -> None:
    with pytest.raises(ReviewError) as info:
        parse_review(raw)
    assert info.value.status == status
    assert fragment in info.value.message


def test_allow_encodes_the_patch_as_base64_json() -> None:
    response = allow("u", [{"op": "add", "path": "/a", "value": 1}])["response"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/a", "value": 1}
    ]
    assert "patch" not in allow("u", [])["response"]


def test_deny_carries_the_message_for_kubectl() -> None:
    response = deny("u", "gpupack.io/gpu-compute: invalid")["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == "gpupack.io/gpu-compute: invalid"


@pytest.mark.parametrize("where", ["apiVersion", "kind", "request.kind", "request.object.kind"])
def test_a_deeply_nested_value_is_a_client_error_with_a_bounded_message(where: str) -> None:
    deep = "DEEP"
    doc: dict[str, object] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": {}},
    }
    target: dict[str, object] = doc
    *path, last = where.split(".")
    for part in path:
        target = target[part]  # type: ignore[assignment]
    target[last] = deep
    body = json.dumps(doc).replace('"DEEP"', "[" * 1000 + "]" * 1000).encode()

    with pytest.raises(ReviewError) as error:
        parse_review(body)
    assert error.value.status == 400
    assert len(error.value.message) < 300
