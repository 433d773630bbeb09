"""The harness's own small client for the Kubernetes API (HTTPS with a client
certificate or a bearer token, keep-alive per thread, JSON in and out).

Independent of the product's runtime (`gpupack.runtime`) on purpose: the integration
tests check gpupack's components against a real API server, and if the harness reached
that server through the same transport, a bug in the transport could hide in both the
component and the check. This client is built on the standard library alone (`http.client`
and `ssl`), reads kubeconfigs itself, and has its own error type.
"""

import base64
import contextlib
import http.client
import json
import ssl
import tempfile
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hack.polling import eventually

JSON = dict[str, Any]


class ClusterError(RuntimeError):
    """The local cluster could not start; the message says which component and where its
    log is."""


# -- the API client ------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class _Kept:
    """One thread's kept-alive connection, closed when the thread ends or the client goes:
    a thread of the harness (a test's writer, a watcher) that never calls `close` leaves
    no socket behind to be found unclosed later, in whichever test collects it."""

    __slots__ = ("connection",)

    def __init__(self, connection: http.client.HTTPSConnection) -> None:
        self.connection = connection

    def __del__(self) -> None:
        self.connection.close()


@dataclass
class Kube:
    """A small JSON client for the Kubernetes API. Enough for tests and the demo; the
    product's components use `gpupack.runtime.transport` (see the module docstring)."""

    server: str
    context: ssl.SSLContext
    token: str | None = None
    _local: threading.local = field(default_factory=threading.local, repr=False)
    ca: str = field(default="", repr=False)  # the cluster's CA (PEM): for `with_token`
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request

    def _connection(
        self, url: urllib.parse.SplitResult, timeout: float
    ) -> http.client.HTTPSConnection:
        """One keep-alive connection per thread."""
        kept: _Kept | None = getattr(self._local, "connection", None)
        if kept is None:
            connection = http.client.HTTPSConnection(
                url.hostname or "127.0.0.1", url.port or 443, context=self.context, timeout=timeout
            )
            kept = self._local.connection = _Kept(connection)
        connection = kept.connection
        connection.timeout = timeout
        return connection

    @classmethod
    def from_kubeconfig(cls, path: Path) -> "Kube":
        """The current context of a kubeconfig: client certificate or token, CA data or file."""
        config = yaml.safe_load(path.read_text())
        current = config.get("current-context")
        ctx = next(c["context"] for c in config["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
        context = ssl.create_default_context()
        ca = ""
        if "certificate-authority-data" in cluster:
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        elif "certificate-authority" in cluster:
            ca = Path(cluster["certificate-authority"]).read_text()
        if ca:
            context.load_verify_locations(cadata=ca)
        token = user.get("token")
        if "client-certificate-data" in user:
            with tempfile.TemporaryDirectory() as tmp:
                cert, key = Path(tmp, "c.crt"), Path(tmp, "c.key")
                cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
                key.write_bytes(base64.b64decode(user["client-key-data"]))
                context.load_cert_chain(cert, key)
        elif "client-certificate" in user:
            context.load_cert_chain(user["client-certificate"], user["client-key"])
        return cls(cluster["server"], context, token, ca=ca)

    def with_token(self, token: str) -> "Kube":
        """A client of the same API server that authenticates with `token` alone (no
        client certificate, which the API server would prefer)."""
        context = ssl.create_default_context()
        if self.ca:
            context.load_verify_locations(cadata=self.ca)
        return Kube(self.server, context, token, ca=self.ca)

    def impersonating(self, user: str, extra: dict[str, str] | None = None) -> "Kube":
        """This client acting as `user` (with one value per `extra` key), as `kubectl
        --as` does: what the API server, RBAC and admission decide for that user."""
        headers = {"Impersonate-User": user}
        for key, value in (extra or {}).items():
            headers[f"Impersonate-Extra-{urllib.parse.quote(key, safe='')}"] = value
        return Kube(self.server, self.context, self.token, ca=self.ca, headers=headers)

    def node_bound_token(self, namespace: str, account: str, node: str) -> str:
        """A token of ServiceAccount `namespace/account` bound to Node `node`, as a
        kubelet gets one for a DaemonSet pod there: the API server gives its requests the
        node claim `authentication.kubernetes.io/node-name`. Made with this client's
        rights (TokenRequest); the ServiceAccount is created if missing."""
        self.create_once({"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": account, "namespace": namespace}})  # fmt: skip
        uid = self.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
        bound = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
        answer = self.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 86400, "boundObjectRef": bound},
            },
        )
        token: str = answer["status"]["token"]
        return token

    def text(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> str:
        """The answer's body as text; ApiError for a status of 300 or more."""
        url = urllib.parse.urlsplit(self.server)
        if params:
            path = f"{path}?{urllib.parse.urlencode(params)}"
        headers = {"Accept": "application/json", "Content-Type": content_type, **self.headers}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):  # a kept-alive connection the server closed: reconnect once
            connection = self._connection(url, timeout)
            try:
                connection.request(method, path, body=payload, headers=headers)
                response = connection.getresponse()
                text = response.read().decode()
                break
            except (OSError, http.client.HTTPException) as exc:
                # Never reuse a connection a request failed on: http.client would refuse it.
                connection.close()
                self._local.connection = None
                # An idle connection the API server closed shows as one of these; over TLS,
                # as an EOF while the request is sent (seen after a minute's idle in CI).
                stale = isinstance(
                    exc,
                    http.client.RemoteDisconnected
                    | BrokenPipeError
                    | ConnectionResetError
                    | ssl.SSLEOFError,
                )
                if attempt == 2 or not stale:
                    raise
        if response.status >= 300:
            raise ApiError(response.status, text)
        return text

    def request(self, method: str, path: str, body: Any = None, **options: Any) -> Any:
        """The decoded JSON answer (`text`'s options); ApiError for a status of 300 or more."""
        text = self.text(method, path, body, **options)
        return json.loads(text) if text else None

    def close(self) -> None:
        """Close the calling thread's kept-alive connection."""
        kept: _Kept | None = getattr(self._local, "connection", None)
        if kept is not None:
            kept.connection.close()
            self._local.connection = None

    def get(self, path: str, **params: str) -> Any:
        return self.request("GET", path, params=params or None)

    def watch(
        self, path: str, resource_version: str, *, timeout: float = 3600.0, **params: str
    ) -> Iterator[tuple[str, JSON]]:
        """The events of a watch on the collection `path` from `resource_version`, as
        (type, object), on a connection of its own, until the server ends it (after
        `timeout` seconds at most) or the caller stops iterating."""
        url = urllib.parse.urlsplit(self.server)
        query = {
            **params,
            "watch": "1",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(int(timeout)),
        }
        headers = {"Accept": "application/json", **self.headers}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        connection = http.client.HTTPSConnection(
            url.hostname or "127.0.0.1", url.port or 443, context=self.context, timeout=timeout
        )
        try:
            connection.request("GET", f"{path}?{urllib.parse.urlencode(query)}", headers=headers)
            response = connection.getresponse()
            if response.status >= 300:
                raise ApiError(response.status, response.read().decode())
            for line in response:
                event = json.loads(line)
                yield event["type"], event["object"]
        finally:
            connection.close()

    def create(self, path: str, body: JSON, *, dry_run: bool = False) -> Any:
        return self.request("POST", path, body, params={"dryRun": "All"} if dry_run else None)

    def delete(self, path: str) -> Any:
        with contextlib.suppress(ApiError):
            return self.request("DELETE", path, params={"gracePeriodSeconds": "0"})
        return None

    def merge_patch(self, path: str, body: JSON) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def apply(self, obj: JSON) -> Any:
        """Create the object, or replace it when it exists (idempotent setup)."""
        path = resource_path(obj)
        try:
            return self.create(path, obj)
        except ApiError as exc:
            if exc.status != 409:
                raise
        name = obj["metadata"]["name"]
        current = self.get(f"{path}/{name}")
        obj = {
            **obj,
            "metadata": {
                **obj["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        return self.request("PUT", f"{path}/{name}", obj)

    def create_once(self, obj: JSON) -> None:
        """Create the object unless it exists (then it is left as it is)."""
        try:
            self.create(resource_path(obj), obj)
        except ApiError as exc:
            if exc.status != 409:
                raise

    def create_namespace(self, prefix: str, labels: dict[str, str] | None = None) -> str:
        """A new namespace `<prefix>-<random>`, once its default ServiceAccount exists
        (pods created before it are refused)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        metadata = {"name": name, "labels": labels or {}}
        self.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
        )
        self.wait_for(
            f"the default ServiceAccount of {name}",
            lambda: self.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        )
        return name

    def wait_for(
        self, what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2
    ) -> Any:
        """Poll `check` until it returns something truthy (`hack.polling.eventually`; an
        ApiError is "not yet"); ClusterError naming `what` after `timeout` seconds."""
        return eventually(
            what, check, timeout, interval=interval, tolerate=(ApiError,), error=ClusterError
        )


_PLURALS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Service": ("/api/v1", "services", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
    "MutatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingadmissionpolicies",
        False,
    ),
    "MutatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingadmissionpolicybindings",
        False,
    ),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
    "GPUPolicy": ("/apis/gpupack.io/v1alpha1", "gpupolicies", True),
    "GPURecommendation": ("/apis/gpupack.io/v1alpha1", "gpurecommendations", True),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "NodePool": ("/apis/karpenter.sh/v1", "nodepools", False),
    "KWOKNodeClass": ("/apis/karpenter.kwok.sh/v1alpha1", "kwoknodeclasses", False),
}


def resource_path(obj: JSON) -> str:
    """The collection path of an object of the kinds this harness creates (in the API
    version the object names, where it names one)."""
    base, plural, namespaced = _PLURALS[obj["kind"]]
    version = obj.get("apiVersion")
    if isinstance(version, str) and version:
        base = "/api/v1" if version == "v1" else f"/apis/{version}"
    if namespaced:
        return f"{base}/namespaces/{obj['metadata'].get('namespace', 'default')}/{plural}"
    return f"{base}/{plural}"
