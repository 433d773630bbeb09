"""`gpupack-certs`: the webhook's serving certificate, its Secrets, and the caBundle.

Idempotent: a run keeps certificates that are valid for the wanted names outside the
renewal window, and issues new ones otherwise. Writes the CA Secret, then the serving
Secret (optimistic concurrency on both), then the caBundle of every entry of the
MutatingWebhookConfiguration, when that exists (at pre-install it does not yet: the
chart runs this again after install). Exit 0 when done, 1 when the API server is
unreachable or refuses, 2 for input it must not touch (a Secret of another type) or no
usable cluster configuration (`gpupack.runtime.config`'s order).
"""

import argparse
import base64
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from certs.pem import KeyAlgorithm
from certs.plan import (
    CertsError,
    Wanted,
    issue_pairs,
    review,
    secret_manifests,
    service_dns_names,
    trust_bundle,
)
from gpupack.runtime import config
from gpupack.runtime.api import ApiError, retry
from gpupack.runtime.args import conventions
from gpupack.runtime.transport import JSON_PATCH, STRATEGIC_PATCH, Body, connect

JSON = dict[str, Any]
WEBHOOK_CONFIGS: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


class ApiCallError(Exception):
    """The API server could not be reached or refused; the message says which call."""


class Client(Protocol):
    """The verbs this tool uses (its hook Job's RBAC: Secrets in its namespace, the
    webhook Deployment, the MutatingWebhookConfiguration)."""

    def get(self, path: str) -> JSON: ...

    def create(self, path: str, body: JSON) -> JSON: ...

    def update(self, path: str, body: JSON) -> JSON: ...

    def patch(self, path: str, body: Body, content_type: str = ...) -> JSON: ...


class Api:
    """The few calls this tool makes, each named in its errors."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def _call(self, what: str, call: Callable[[], JSON]) -> JSON | None:
        """The JSON answer; None for 404; ApiCallError for anything else."""
        try:
            return retry(call)
        except ApiError as exc:
            if exc.status == 404:
                return None
            if exc.status == 0:
                raise ApiCallError(f"{what}: cannot reach the API server: {exc.message}") from None
            raise ApiCallError(f"{what}: HTTP {exc.status}: {exc.message}") from None

    def read_secret(self, namespace: str, name: str) -> JSON | None:
        path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        return self._call(f"reading Secret {namespace}/{name}", lambda: self._client.get(path))

    def write_secret(self, existing: JSON | None, body: JSON) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        collection = f"/api/v1/namespaces/{namespace}/secrets"
        if existing is None:
            what = f"creating Secret {namespace}/{name}"
            self._call(what, lambda: self._client.create(collection, body))
            return
        meta = existing["metadata"]
        kept = {k: meta[k] for k in ("resourceVersion", "ownerReferences") if k in meta}
        body = {**body, "metadata": {**body["metadata"], **kept}}
        what = f"replacing Secret {namespace}/{name}"
        self._call(what, lambda: self._client.update(f"{collection}/{name}", body))

    def read_deployment(self, namespace: str, name: str) -> JSON | None:
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
        return self._call(f"reading Deployment {namespace}/{name}", lambda: self._client.get(path))

    def own_secret(self, namespace: str, name: str, owner: JSON) -> None:
        path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        body = {"metadata": {"ownerReferences": [owner]}}
        self._call(
            f"setting the owner of Secret {namespace}/{name}",
            lambda: self._client.patch(path, body, STRATEGIC_PATCH),
        )

    def read_webhook_config(self, name: str) -> JSON | None:
        path = f"{WEBHOOK_CONFIGS}/{name}"
        return self._call(
            f"reading MutatingWebhookConfiguration {name}", lambda: self._client.get(path)
        )

    def patch_webhook_config(self, name: str, patch: list[JSON]) -> None:
        path = f"{WEBHOOK_CONFIGS}/{name}"
        self._call(
            f"patching MutatingWebhookConfiguration {name}",
            lambda: self._client.patch(path, patch, JSON_PATCH),
        )


def ca_bundle_patch(config: JSON, ca_pem: bytes) -> list[JSON]:
    """JSONPatch setting every entry's caBundle, guarded by the entries' names (a `test`
    op each) so a configuration changed meanwhile fails instead of being mispatched."""
    bundle = base64.b64encode(ca_pem).decode()
    ops: list[JSON] = []
    for index, webhook in enumerate(config.get("webhooks") or []):
        if (webhook.get("clientConfig") or {}).get("caBundle") == bundle:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]})
        ops.append(
            {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle}
        )
    return ops


def run_once(args: argparse.Namespace, api: Api, now: datetime) -> list[str]:
    """Do the work; return the lines to print. Raises CertsError or ApiCallError."""
    wanted = Wanted(
        dns_names=service_dns_names(args.service_name, args.namespace, tuple(args.dns_name)),
        ca_validity=timedelta(days=args.ca_validity_days),
        cert_validity=timedelta(days=args.cert_validity_days),
        renew_before=timedelta(days=args.renew_before_days),
        algorithm=KeyAlgorithm(args.key_algorithm),
    )
    where = f"Secret {args.namespace}/{args.secret_name}"
    serving = api.read_secret(args.namespace, args.secret_name)
    ca_secret = api.read_secret(args.namespace, f"{args.secret_name}-ca")
    verdict = review(serving, ca_secret, wanted, now, where)
    lines = []
    if verdict.keep:
        ca_pem = base64.b64decode((serving or {})["data"]["ca.crt"])
        lines.append(f"{where}: kept: {verdict.reason}")
    else:
        ca, leaf = issue_pairs(ca_secret, wanted, now, where)
        ca_pem = trust_bundle(ca, ca_secret, now, where)
        ca_body, serving_body = secret_manifests(args.secret_name, args.namespace, ca, leaf, ca_pem)
        api.write_secret(ca_secret, ca_body)  # the CA first: a failure in between leaves a
        api.write_secret(serving, serving_body)  # leaf the next run sees is not signed by it
        lines.append(
            f"{where}: issued, because {verdict.reason}; names: {', '.join(wanted.dns_names)}"
        )
    if args.owner_deployment:
        lines.append(set_owner(args, api))
    if args.webhook_config:
        config = api.read_webhook_config(args.webhook_config)
        what = f"MutatingWebhookConfiguration {args.webhook_config}"
        if config is None:
            lines.append(f"{what}: not found, caBundle not set (run again once it is installed)")
        else:
            patch = ca_bundle_patch(config, ca_pem)
            if patch:
                api.patch_webhook_config(args.webhook_config, patch)
                lines.append(f"{what}: caBundle set on {len(patch) // 2} webhook(s)")
            else:
                lines.append(f"{what}: caBundle already current")
    return lines


def set_owner(args: argparse.Namespace, api: Api) -> str:
    """Make the Secrets dependents of the webhook Deployment, so that uninstalling it lets
    the garbage collector remove them too (they are written by a hook, not by Helm)."""
    what = f"Deployment {args.namespace}/{args.owner_deployment}"
    deployment = api.read_deployment(args.namespace, args.owner_deployment)
    if deployment is None:
        return f"{what}: not found, the Secrets get their owner on the next run"
    owner = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": args.owner_deployment,
        "uid": deployment["metadata"]["uid"],
    }
    for name in (args.secret_name, f"{args.secret_name}-ca"):
        api.own_secret(args.namespace, name, owner)
    return f"{what}: owns the Secrets (they go when it goes)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-certs",
        description="Issue or renew the gpupack webhook's serving certificate, store it in "
        "Secrets, and put its CA into the MutatingWebhookConfiguration's caBundle. Safe to "
        "run repeatedly: valid certificates are kept.",
    )
    parser.add_argument(
        "--namespace",
        default="gpupack-system",
        help="namespace of the Secrets and the Service (default: %(default)s)",
    )
    parser.add_argument(
        "--secret-name",
        default="gpupack-webhook-tls",
        help="serving Secret; the CA goes to NAME-ca (default: %(default)s)",
    )
    parser.add_argument(
        "--service-name",
        default="gpupack-webhook",
        help="the webhook's Service: its DNS names become the certificate's (default: %(default)s)",
    )
    parser.add_argument(
        "--dns-name",
        action="append",
        default=[],
        metavar="NAME",
        help="an extra DNS name or IP address (repeatable)",
    )
    parser.add_argument(
        "--webhook-config",
        default="gpupack-webhook",
        metavar="NAME",
        help="MutatingWebhookConfiguration whose caBundle to set; '' skips it "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--ca-validity-days", type=_days, default=3650, help="CA lifetime (default: %(default)s)"
    )
    parser.add_argument(
        "--cert-validity-days",
        type=_days,
        default=365,
        help="serving certificate lifetime (default: %(default)s)",
    )
    parser.add_argument(
        "--renew-before-days",
        type=_days,
        default=30,
        help="renew when it expires within this many days (default: %(default)s)",
    )
    parser.add_argument(
        "--key-algorithm",
        choices=[a.value for a in KeyAlgorithm],
        default=KeyAlgorithm.ECDSA_P256.value,
        help="(default: %(default)s)",
    )
    parser.add_argument(
        "--owner-deployment",
        metavar="NAME",
        default="",
        help="make the Secrets dependents of this Deployment in --namespace, so they are "
        "deleted with it (the chart passes the webhook's); skipped while it does not exist",
    )
    parser.add_argument("--kubeconfig", metavar="PATH", help=f"order: {config.ORDER}")
    return conventions(parser)


def _days(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} days: must be at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.renew_before_days >= args.cert_validity_days:
        print(
            "gpupack-certs: --renew-before-days must be less than --cert-validity-days "
            "(it would renew on every run)",
            file=sys.stderr,
        )
        return 2
    try:
        client = connect(args.kubeconfig, user_agent="gpupack-certs", request_timeout=15)
    except config.ConfigError as exc:
        print(f"gpupack-certs: error: {exc}", file=sys.stderr)
        return 2
    try:
        for line in run_once(args, Api(client), datetime.now(UTC)):
            print(line)
    except CertsError as exc:
        print(f"gpupack-certs: {exc}", file=sys.stderr)
        return 2
    except ApiCallError as exc:
        print(f"gpupack-certs: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
