"""TEST INFRASTRUCTURE: another team's mutating webhook, registered after gpupack's.

A sidecar injector or a policy engine annotates pods after gpupack's webhook has
rewritten them; because the pod changed, the API server calls gpupack's webhook again
(its `reinvocationPolicy: IfNeeded`), and that call may reach another replica than the
first. `Neighbour` is such a webhook: it adds the annotation `TOUCHED` to every pod
created in one namespace, over TLS with a CA of its own, as a local server the API
server calls by URL. Its configuration's name sorts after gpupack's, which is the order
the API server calls them in. `between` runs inside each call, between gpupack's first
call and its second: a test ends the API server's connections to gpupack's replicas there,
so the second call may go to either replica.
"""

import base64
import json
import ssl
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from certs import pem
from hack.localcluster import Kube
from webhook.patch import pointer

TOUCHED = "neighbour.example/touched"
CONFIGURATION = "zz-neighbour"  # after gpupack's: mutating webhooks are called by name
PATH = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIGURATION}"


def _handler(between: Callable[[], None] | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if between is not None:
                between()
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length))["request"]
            annotations = (request["object"].get("metadata") or {}).get("annotations")
            patch: list[dict[str, Any]] = (
                [{"op": "add", "path": "/metadata/annotations", "value": {TOUCHED: "true"}}]
                if annotations is None
                else [
                    {
                        "op": "add",
                        "path": pointer("metadata", "annotations", TOUCHED),
                        "value": "true",
                    }
                ]
            )
            body = json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {
                        "uid": request["uid"],
                        "allowed": True,
                        "patchType": "JSONPatch",
                        "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                    },
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class Neighbour:
    """`with Neighbour(kube, namespace, folder):` registered and serving; removed after."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        folder: Path,
        between: Callable[[], None] | None = None,
    ) -> None:
        now = datetime.now(UTC)
        ca = pem.new_ca("neighbour-ca", now=now, algorithm=pem.KeyAlgorithm.ECDSA_P256)
        serving = pem.issue(
            ca, "neighbour", now=now, names=["127.0.0.1"], algorithm=pem.KeyAlgorithm.ECDSA_P256
        )
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tls.crt").write_bytes(serving.cert_pem)
        (folder / "tls.key").write_bytes(serving.key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(between))
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._kube = kube
        self._configuration = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION},
            "webhooks": [
                {
                    "name": "touch.neighbour.example",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self._server.server_address[1]}/",
                        "caBundle": base64.b64encode(ca.cert_pem).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "Never",
                    "timeoutSeconds": 5,
                }
            ],
        }

    def __enter__(self) -> Self:
        threading.Thread(target=self._server.serve_forever, name="neighbour", daemon=True).start()
        self._kube.apply(self._configuration)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._kube.delete(PATH)
        self._server.shutdown()
        self._server.server_close()
