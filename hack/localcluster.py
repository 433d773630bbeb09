"""A real Kubernetes control plane as local processes, with kwok's simulated GPU nodes.

etcd, kube-apiserver (MutatingAdmissionWebhook on, certificates from `certs/`),
kube-controller-manager, kube-scheduler and kwok run on loopback ports chosen at run time,
from the binaries `hack/lib/binaries.sh` builds. kwok plays the kubelets of a set of GPU
nodes (allocatable `nvidia.com/gpu`, GPU Feature Discovery labels, realistic CPU and
memory). The gpupack webhook runs as a local process registered the way the chart
registers it. Everything is stopped, and every port released, by `stop()`: on normal
exit, on a failing test, and (for attached clusters) when the parent process dies.

Used by the integration tests (tests/integration/conftest.py) and the demo (hack/demo).
Any cluster with a kubeconfig can stand in for this one: see `Kube.from_kubeconfig`.
"""

import argparse
import base64
import contextlib
import ctypes
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import yaml

from certs import pem

JSON = dict[str, Any]
SYSTEM_NAMESPACE: Final = "gpupack-system"
WEBHOOK_NAME: Final = "gpupack-webhook"
SCHEDULER_NAME: Final = "gpupack-scheduler"
EXPORTER_NAME: Final = "gpupack-exporter"
RECOMMENDER_NAME: Final = "gpupack-recommender"
CHART_DIR: Final = Path(__file__).resolve().parents[1] / "charts" / "gpupack"
SERVICE_CIDR: Final = "10.96.0.0/16"
READY_TIMEOUT: Final = 120.0
KWOK_ANNOTATION: Final = "kwok.x-k8s.io/node"


class ClusterError(RuntimeError):
    """The local cluster could not start; the message says which component and where its
    log is."""


# -- the API client ------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


@dataclass
class Kube:
    """A small JSON client for the Kubernetes API (HTTPS with a client certificate or a
    bearer token). Enough for tests and the demo; the product's components have their own
    `kube` transports."""

    server: str
    context: ssl.SSLContext
    token: str | None = None
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def _connection(
        self, url: urllib.parse.SplitResult, timeout: float
    ) -> http.client.HTTPSConnection:
        """One keep-alive connection per thread."""
        connection: http.client.HTTPSConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPSConnection(
                url.hostname or "127.0.0.1", url.port or 443, context=self.context, timeout=timeout
            )
            self._local.connection = connection
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
        if "certificate-authority-data" in cluster:
            context.load_verify_locations(
                cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
            )
        elif "certificate-authority" in cluster:
            context.load_verify_locations(cafile=cluster["certificate-authority"])
        token = user.get("token")
        if "client-certificate-data" in user:
            with tempfile.TemporaryDirectory() as tmp:
                cert, key = Path(tmp, "c.crt"), Path(tmp, "c.key")
                cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
                key.write_bytes(base64.b64decode(user["client-key-data"]))
                context.load_cert_chain(cert, key)
        elif "client-certificate" in user:
            context.load_cert_chain(user["client-certificate"], user["client-key"])
        return cls(cluster["server"], context, token)

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
        headers = {"Accept": "application/json", "Content-Type": content_type}
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
                stale = isinstance(
                    exc, http.client.RemoteDisconnected | BrokenPipeError | ConnectionResetError
                )
                if attempt == 2 or not stale:
                    raise
        if response.status >= 300:
            raise ApiError(response.status, text)
        return text

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Any:
        """The decoded JSON answer; ApiError for a status of 300 or more."""
        text = self.text(
            method, path, body, params=params, content_type=content_type, timeout=timeout
        )
        return json.loads(text) if text else None

    def close(self) -> None:
        """Close the calling thread's kept-alive connection."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def get(self, path: str, **params: str) -> Any:
        return self.request("GET", path, params=params or None)

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
        """Poll `check` until it returns something truthy; ClusterError naming `what` after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except ApiError as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(interval)
        raise ClusterError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


_PLURALS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
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
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
    "GPUPolicy": ("/apis/gpupack.io/v1alpha1", "gpupolicies", True),
    "GPURecommendation": ("/apis/gpupack.io/v1alpha1", "gpurecommendations", True),
}


def resource_path(obj: JSON) -> str:
    """The collection path of an object of the kinds this harness creates."""
    base, plural, namespaced = _PLURALS[obj["kind"]]
    if namespaced:
        return f"{base}/namespaces/{obj['metadata'].get('namespace', 'default')}/{plural}"
    return f"{base}/{plural}"


# -- processes ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Process:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None, *, detach: bool = False) -> None:
        with open(self.log, "ab") as log:
            self.popen = subprocess.Popen(  # noqa: S603 (our own binaries, fixed arguments)
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=None if detach else _die_with_parent,  # noqa: PLW1509
            )

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else 0

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is None:
            return
        stop_pid(self.popen.pid, grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=1)
        self.popen = None


def stop_pid(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it is still there after `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)


# -- the nodes ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePool:
    """`count` simulated GPU nodes named `<prefix>-<i>`."""

    prefix: str
    count: int
    gpus: int
    product: str
    gpu_memory_mib: int
    cpu: str
    memory: str
    pods: int = 110


DEFAULT_NODE_POOLS: Final = (
    NodePool("gpu-a100", 4, 8, "NVIDIA-A100-SXM4-80GB", 81920, "96", "1024Gi"),
    NodePool("gpu-l4", 4, 2, "NVIDIA-L4", 23034, "16", "64Gi"),
)
GPU_TAINT: Final = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NOT_READY_TAINTS: Final = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def schedulable(node: JSON) -> bool:
    """Ready, and the node-lifecycle controller has lifted the taints new nodes start with."""
    conditions = node.get("status", {}).get("conditions", [])
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    taints = {t["key"] for t in node.get("spec", {}).get("taints", [])}
    return ready and not taints.intersection(NOT_READY_TAINTS)


def node_manifest(pool: NodePool, index: int, *, taint: bool) -> JSON:
    name = f"{pool.prefix}-{index}"
    resources = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": str(pool.pods),
        "nvidia.com/gpu": str(pool.gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": pool.product,
                "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
                "nvidia.com/gpu.count": str(pool.gpus),
            },
        },
        "spec": {"taints": [GPU_TAINT]} if taint else {},
        "status": {"capacity": resources, "allocatable": resources},
    }


# -- the cluster ----------------------------------------------------------------------


@dataclass
class LocalCluster:
    """The control plane and kwok nodes under `workdir` (certificates, data, logs)."""

    workdir: Path
    bin_dir: Path = field(default_factory=lambda: Path(os.environ.get("GPUPACK_BIN_DIR", "")))
    node_pools: Sequence[NodePool] = DEFAULT_NODE_POOLS
    gpu_taint: bool = False
    detach: bool = False  # the demo leaves the cluster running after it exits
    processes: dict[str, Process] = field(default_factory=dict)
    api_port: int = 0
    _admin: Kube | None = field(default=None, repr=False)
    _webhook_configuration: JSON | None = field(default=None, repr=False)

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def binary(self, name: str) -> str:
        path = self.bin_dir / name
        if not path.is_file():
            raise ClusterError(
                f"{path} is missing: run hack/test or hack/demo (they build the Kubernetes "
                "binaries), or set GPUPACK_BIN_DIR"
            )
        return str(path)

    # lifecycle

    def start(self) -> "LocalCluster":
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            self._write_pki()
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
            self._create_nodes()
        except BaseException:
            self.stop()
            raise
        self.write_state()
        log(f"local cluster ready in {time.monotonic() - started:.1f} s: {self.server}")
        return self

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        for process in reversed(list(self.processes.values())):
            process.stop()
        self.processes.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / "state.json").unlink()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_state(self) -> None:
        """Where a later `hack/demo stop` finds the processes to stop."""
        state = {name: p.pid for name, p in self.processes.items()}
        (self.workdir / "state.json").write_text(json.dumps(state))

    @staticmethod
    def stop_from_state(workdir: Path) -> list[str]:
        """Stop the processes a detached cluster in `workdir` left running."""
        state_file = workdir / "state.json"
        if not state_file.exists():
            return []
        state = json.loads(state_file.read_text())
        for pid in reversed(list(state.values())):
            stop_pid(int(pid))
        state_file.unlink()
        return list(state)

    def _launch(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        process = Process(name, args, self.workdir / "logs" / f"{name}.log")
        process.start(env, detach=self.detach)
        self.processes[name] = process
        return process

    def _failed(self, process: Process, what: str) -> ClusterError:
        return ClusterError(f"{process.name} {what}; its log is {process.log}:\n{process.tail()}")

    # certificates and kubeconfigs

    def _write_pki(self) -> None:
        self.pki.mkdir(exist_ok=True)
        now = datetime.now(UTC)
        algo = pem.KeyAlgorithm.ECDSA_P256
        ca = pem.new_ca("gpupack-local-ca", now=now, algorithm=algo)
        self._ca = ca
        (self.pki / "ca.crt").write_bytes(ca.cert_pem)
        serving = pem.issue(
            ca,
            "kube-apiserver",
            now=now,
            algorithm=algo,
            names=[
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "10.96.0.1",
            ],
        )
        self._write_pair("apiserver", serving)
        private, public = pem.new_key_pair(pem.KeyAlgorithm.RSA2048)
        (self.pki / "sa.key").write_bytes(private)
        (self.pki / "sa.pub").write_bytes(public)

    def _write_pair(self, name: str, pair: pem.KeyPair) -> tuple[Path, Path]:
        cert, key = self.pki / f"{name}.crt", self.pki / f"{name}.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        key.chmod(0o600)
        return cert, key

    def user_kubeconfig(
        self, user: str, groups: Sequence[str] = (), name: str | None = None
    ) -> Path:
        """A kubeconfig authenticating as `user` (a client certificate) in `groups`."""
        name = name or user.replace(":", "-")
        pair = pem.issue(
            self._ca,
            user,
            now=datetime.now(UTC),
            usage=pem.Usage.CLIENT,
            organization=",".join(groups) or None,
            algorithm=pem.KeyAlgorithm.ECDSA_P256,
        )
        cert, key = self._write_pair(f"user-{name}", pair)
        path = self.workdir / f"kubeconfig-{name}" if name != "admin" else self.kubeconfig
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpupack-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [
                {"name": name, "user": {"client-certificate": str(cert), "client-key": str(key)}}
            ],
            "contexts": [{"name": name, "context": {"cluster": "gpupack-local", "user": name}}],
            "current-context": name,
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def kube(self, kubeconfig: Path | None = None) -> Kube:
        """A client for `kubeconfig`; the admin client is shared and closed by `stop()`."""
        if kubeconfig is not None:
            return Kube.from_kubeconfig(kubeconfig)
        if self._admin is None:
            self._admin = Kube.from_kubeconfig(self.kubeconfig)
        return self._admin

    # the control plane

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        process = self._launch(
            "etcd",
            [
                self.binary("etcd"),
                "--name=gpupack-local",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=gpupack-local=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",  # test data: speed over durability
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ],
        )
        self._wait_http(process, f"{self.etcd_url}/health", '"health":"true"')

    def _wait_http(self, process: Process, url: str, expect: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if not process.alive():
                raise self._failed(process, "exited during startup")
            parts = urllib.parse.urlsplit(url)
            connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=2)
            with (
                contextlib.suppress(OSError, http.client.HTTPException),
                contextlib.closing(connection),
            ):
                connection.request("GET", parts.path)
                if expect in connection.getresponse().read().decode():
                    return
            time.sleep(0.1)
        raise self._failed(process, f"did not answer {url} within {READY_TIMEOUT:g} s")

    def _start_apiserver(self) -> None:
        self.api_port = free_port()
        process = self._launch(
            "kube-apiserver",
            [
                self.binary("kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={self.pki / 'apiserver.crt'}",
                f"--tls-private-key-file={self.pki / 'apiserver.key'}",
                f"--client-ca-file={self.pki / 'ca.crt'}",
                f"--service-account-key-file={self.pki / 'sa.pub'}",
                f"--service-account-signing-key-file={self.pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                # The default plugins (MutatingAdmissionWebhook, ServiceAccount, Priority,
                # DefaultTolerationSeconds, ResourceQuota, PodSecurity, ...) plus:
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",  # one API server on loopback: no endpoints
                "--profiling=false",
                "--v=1",
            ],
        )
        self.user_kubeconfig("kubernetes-admin", ["system:masters"], name="admin")
        admin = self.kube()

        def ready() -> bool:
            if not process.alive():
                raise self._failed(process, "exited during startup")
            try:
                return admin.text("GET", "/readyz", content_type="text/plain").strip() == "ok"
            except (OSError, ApiError, http.client.HTTPException):
                return False

        try:
            admin.wait_for("kube-apiserver /readyz", ready, timeout=READY_TIMEOUT)
        except ClusterError:
            raise self._failed(process, "did not become ready") from None

    def _start_controllers(self) -> None:
        kcm = self.user_kubeconfig("system:kube-controller-manager")
        self._launch(
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}",
                f"--authorization-kubeconfig={kcm}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                "--secure-port=0",
                "--controllers=*,-nodeipam,-persistentvolume-binder,-attachdetach,-ttl",
                "--v=1",
            ],
        )
        scheduler = self.user_kubeconfig("system:kube-scheduler")
        self._launch(
            "kube-scheduler",
            [
                self.binary("kube-scheduler"),
                f"--kubeconfig={scheduler}",
                f"--authentication-kubeconfig={scheduler}",
                f"--authorization-kubeconfig={scheduler}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )
        kwok = self.user_kubeconfig("kwok", ["system:masters"])
        self._launch(
            "kwok",
            [
                self.binary("kwok"),
                f"--kubeconfig={kwok}",
                f"--config={Path(__file__).with_name('kwok-stages.yaml')}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                "--manage-nodes-with-label-selector=",
                "--manage-single-node=",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.0.0.1",
                "--node-lease-duration-seconds=40",
                "--server-address=",
            ],
        )
        admin = self.kube()
        admin.wait_for(
            "the default ServiceAccount (kube-controller-manager is working)",
            lambda: admin.get("/api/v1/namespaces/default/serviceaccounts/default"),
            timeout=READY_TIMEOUT,
        )
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            if not self.processes[name].alive():
                raise self._failed(self.processes[name], "exited during startup")

    def _create_nodes(self) -> None:
        admin = self.kube()
        names = []
        for pool in self.node_pools:
            for index in range(pool.count):
                node = admin.apply(node_manifest(pool, index, taint=self.gpu_taint))
                names.append(node["metadata"]["name"])

        def all_ready() -> bool:
            nodes = admin.get("/api/v1/nodes", labelSelector="type=kwok")["items"]
            ready = {n["metadata"]["name"] for n in nodes if schedulable(n)}
            return set(names) <= ready

        admin.wait_for(
            f"{len(names)} kwok nodes to be Ready and schedulable", all_ready, timeout=READY_TIMEOUT
        )

    # gpupack

    def install_crds(self) -> None:
        """The chart's CustomResourceDefinitions (`charts/gpupack/crds`), once established,
        so the components' watches of GPUPolicy and GPURecommendation objects succeed."""
        admin = self.kube()
        crds = sorted((CHART_DIR / "crds").glob("*.yaml"))
        names = []
        for path in crds:
            crd = yaml.safe_load(path.read_text())
            admin.apply(crd)
            names.append(crd["metadata"]["name"])

        def established() -> bool:
            for name in names:
                crd = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conditions = (crd.get("status") or {}).get("conditions") or []
                if not any(
                    c.get("type") == "Established" and c.get("status") == "True" for c in conditions
                ):
                    return False
            return True

        admin.wait_for("the gpupack CRDs to be established", established, timeout=READY_TIMEOUT)

    def install_webhook(
        self,
        *,
        extra_args: Sequence[str] = (),
        configuration: JSON | None = None,
    ) -> Process:
        """Run `gpupack-webhook serve` as a local process with least-privilege RBAC, and
        register it with `configuration`, by default the MutatingWebhookConfiguration the
        chart renders, pointed at the local process."""
        admin = self.kube()
        self.install_crds()
        for obj in webhook_rbac():
            admin.apply(obj)
        admin.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}}
        )
        serving = pem.issue(
            self._ca,
            f"{WEBHOOK_NAME}.{SYSTEM_NAMESPACE}.svc",
            now=datetime.now(UTC),
            names=["127.0.0.1", f"{WEBHOOK_NAME}.{SYSTEM_NAMESPACE}.svc"],
            algorithm=pem.KeyAlgorithm.ECDSA_P256,
        )
        cert, key = self._write_pair("webhook", serving)
        self.webhook_port, self.webhook_metrics_port = free_port(), free_port()
        self.audit_log = self.workdir / "logs" / "audit.log"
        kubeconfig = self.user_kubeconfig(WEBHOOK_NAME)
        process = self._launch(
            WEBHOOK_NAME,
            [
                sys.executable,
                "-m",
                "webhook.cli",
                "serve",
                "--host=127.0.0.1",
                f"--port={self.webhook_port}",
                f"--metrics-port={self.webhook_metrics_port}",
                f"--tls-cert-file={cert}",
                f"--tls-private-key-file={key}",
                f"--kubeconfig={kubeconfig}",
                f"--audit-file={self.audit_log}",
                *extra_args,
            ],
            env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        )
        self._wait_webhook_ready(process)
        url = f"https://127.0.0.1:{self.webhook_port}/mutate"
        ca_bundle = (self.pki / "ca.crt").read_bytes()
        if configuration is None:
            configuration = chart_webhook_configuration(Path(self.binary("helm")))
        configuration = json.loads(json.dumps(configuration))
        for entry in configuration["webhooks"]:
            entry["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()}
        admin.apply(configuration)
        self._webhook_configuration = configuration
        self.write_state()
        return process

    def _wait_webhook_ready(self, process: Process) -> None:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if not process.alive():
                raise self._failed(process, "exited during startup")
            connection = http.client.HTTPSConnection(
                "127.0.0.1", self.webhook_port, context=context, timeout=2
            )
            with (
                contextlib.suppress(OSError, http.client.HTTPException),
                contextlib.closing(connection),
            ):
                connection.request("GET", "/readyz")
                if connection.getresponse().status == 200:
                    return
            time.sleep(0.1)
        raise self._failed(process, "did not become ready")

    def reinstall_webhook(self) -> Process:
        """Start the webhook again with the configuration it was registered with."""
        return self.install_webhook(configuration=self._webhook_configuration)

    def stop_webhook(self) -> None:
        self._stop(WEBHOOK_NAME)

    def _run_component(
        self,
        process_name: str,
        user: str,
        template: str,
        module: str,
        args: Sequence[str],
        *,
        sets: Sequence[str] = (),
    ) -> Process:
        """Run `python -m module` as the local user `user`, with the RBAC the chart's
        `template` renders (and `sets`) bound to that user, and a kubeconfig for it."""
        admin = self.kube()
        admin.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}}
        )
        for obj in chart_rbac(Path(self.binary("helm")), template, user, sets=sets):
            admin.apply(obj)
        process = self._launch(
            process_name,
            [sys.executable, "-m", module, f"--kubeconfig={self.user_kubeconfig(user)}", *args],
            env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        )
        self.write_state()
        return process

    def _stop(self, process_name: str) -> None:
        process = self.processes.pop(process_name, None)
        if process is not None:
            process.stop()
        self.write_state()

    def install_scheduler(
        self, *, name: str = SCHEDULER_NAME, extra_args: Sequence[str] = ()
    ) -> Process:
        """Run `gpupack-scheduler` as a local process (`name` tells replicas apart) with
        the RBAC the chart renders, bound to the local user `gpupack-scheduler`."""
        return self._run_component(
            name,
            SCHEDULER_NAME,
            "templates/scheduler.yaml",
            "scheduler.cli",
            [
                f"--namespace={SYSTEM_NAMESPACE}",
                f"--identity={name}",
                f"--metrics-port={free_port()}",
                "--metrics-address=127.0.0.1",
                *extra_args,
            ],
        )

    def stop_scheduler(self, name: str = SCHEDULER_NAME, *, kill: bool = False) -> None:
        """Stop a scheduler replica: SIGTERM (it releases its Lease), or SIGKILL."""
        process = self.processes.get(name)
        if kill and process is not None and process.popen is not None:
            os.killpg(process.popen.pid, signal.SIGKILL)
            process.popen.wait(timeout=10)
            process.popen = None
        self._stop(name)

    def install_exporter(
        self,
        node: str,
        *,
        pod_resources_socket: Path,
        proc: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> tuple[Process, int]:
        """Run `gpupack-exporter` for `node` as a local process with the RBAC the chart
        renders (bound to the local user `gpupack-exporter`), talking to the kubelet
        pod-resources socket the caller serves. Returns the process and its port. No NVML
        here: the exporter reports `gpupack_exporter_nvml_up 0` and works on."""
        port = free_port()
        process = self._run_component(
            f"{EXPORTER_NAME}-{node}",
            EXPORTER_NAME,
            "templates/exporter.yaml",
            "exporter.cli",
            [
                f"--node-name={node}",
                f"--namespace={SYSTEM_NAMESPACE}",
                f"--pod-resources-socket={pod_resources_socket}",
                f"--port={port}",
                "--address=127.0.0.1",
                *([f"--proc={proc}"] if proc else []),
                *extra_args,
            ],
        )
        return process, port

    def stop_exporter(self, node: str) -> None:
        self._stop(f"{EXPORTER_NAME}-{node}")

    def install_recommender(
        self, *, name: str = RECOMMENDER_NAME, extra_args: Sequence[str] = ()
    ) -> Process:
        """Run `gpupack-recommender` as a local process with the RBAC the chart renders
        (rollouts granted), bound to the local user `gpupack-recommender`."""
        self.install_crds()
        return self._run_component(
            name,
            RECOMMENDER_NAME,
            "templates/recommender.yaml",
            "recommender.cli",
            [
                f"--namespace={SYSTEM_NAMESPACE}",
                f"--identity={name}",
                f"--metrics-port={free_port()}",
                "--metrics-address=127.0.0.1",
                *extra_args,
            ],
            sets=("recommender.rollouts=true",),
        )

    def stop_recommender(self, name: str = RECOMMENDER_NAME) -> None:
        """SIGTERM: the recommender checkpoints every history and releases its Lease."""
        self._stop(name)


# -- what the chart will install, as the harness installs it --------------------------


def webhook_rbac() -> list[JSON]:
    """Least privilege for the webhook, as the chart grants it: read namespaces, pods and
    GPURecommendations cluster-wide; create capacity pods and read GPUPolicy objects in the
    system namespace."""
    rbac = "rbac.authorization.k8s.io/v1"
    subject = [{"kind": "User", "name": WEBHOOK_NAME, "apiGroup": "rbac.authorization.k8s.io"}]
    return [
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": WEBHOOK_NAME},
            "rules": [
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
                {
                    "apiGroups": ["gpupack.io"],
                    "resources": ["gpurecommendations"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": WEBHOOK_NAME},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": WEBHOOK_NAME,
            },
            "subjects": subject,
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}},
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": {"name": WEBHOOK_NAME, "namespace": SYSTEM_NAMESPACE},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
                {
                    "apiGroups": ["gpupack.io"],
                    "resources": ["gpupolicies"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": WEBHOOK_NAME, "namespace": SYSTEM_NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": WEBHOOK_NAME,
            },
            "subjects": subject,
        },
    ]


def render_chart(
    helm: Path, template: str, namespace: str = SYSTEM_NAMESPACE, sets: Sequence[str] = ()
) -> str:
    """What `helm template` renders of one of the chart's templates (charts/gpupack)."""
    return subprocess.run(  # noqa: S603 (our helm, fixed arguments)
        [
            str(helm),
            "template",
            "gpupack",
            str(CHART_DIR),
            f"--namespace={namespace}",
            "--kube-version=1.35.0",
            f"--show-only={template}",
            *(f"--set={value}" for value in sets),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def chart_webhook_configuration(helm: Path, namespace: str = SYSTEM_NAMESPACE) -> JSON:
    """The MutatingWebhookConfiguration the chart renders, so the local cluster registers
    the webhook with the chart's selectors and settings."""
    template = "templates/mutatingwebhookconfiguration.yaml"
    config: JSON = yaml.safe_load(render_chart(helm, template, namespace))
    return config


def chart_rbac(
    helm: Path,
    template: str,
    user: str,
    namespace: str = SYSTEM_NAMESPACE,
    sets: Sequence[str] = (),
) -> list[JSON]:
    """The ClusterRoles and Roles a chart template renders, bound to the local `user`
    instead of the ServiceAccount: the local processes run with the chart's permissions."""
    rendered = render_chart(helm, template, namespace, sets)
    out: list[JSON] = []
    subject = [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]
    for doc in yaml.safe_load_all(rendered):
        if doc and doc["kind"] in ("ClusterRole", "Role"):
            out.append(doc)
        elif doc and doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            out.append({**doc, "subjects": subject})
    return out


# -- test infrastructure: the node agent's stand-in -----------------------------------


class SimulatedGpuAssigner:
    """TEST INFRASTRUCTURE, not product code. On a real node the exporter asks the kubelet
    (pod-resources API) which GPU it gave each capacity pod and writes `gpupack.io/gpu-uuid`
    on it. kwok nodes have no kubelet and no GPUs, so this thread plays that part: every
    Running capacity pod gets a fake but stable GPU UUID of a free device on its node, and
    the node's GPU memory."""

    def __init__(self, kube: Kube, interval: float = 0.3) -> None:
        self._kube = kube
        self._interval = interval
        self.skip_nodes: set[str] = set()  # nodes whose real exporter a test runs
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="simulated-gpu-assigner", daemon=True
        )

    def __enter__(self) -> "SimulatedGpuAssigner":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._thread.join(timeout=5)

    def stop(self) -> None:
        self._stop.set()

    def stopped(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for `stop()`; True once it was called."""
        return self._stop.wait(timeout)

    @staticmethod
    def fake_uuid(node: str, index: int) -> str:
        return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.gpupack.test"))

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval):
                with contextlib.suppress(ApiError, OSError):
                    self.assign_once()
        finally:
            self._kube.close()

    def assign_once(self) -> int:
        pods = self._kube.get(
            f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods", labelSelector="gpupack.io/role=capacity"
        )["items"]
        used: dict[str, set[str]] = {}
        for pod in pods:
            uuid_ = (pod["metadata"].get("annotations") or {}).get("gpupack.io/gpu-uuid")
            if uuid_ and pod["spec"].get("nodeName"):
                used.setdefault(pod["spec"]["nodeName"], set()).add(uuid_)
        count = 0
        for pod in pods:
            node = pod["spec"].get("nodeName")
            annotations = pod["metadata"].get("annotations") or {}
            if (
                not node
                or node in self.skip_nodes
                or pod.get("status", {}).get("phase") != "Running"
                or "gpupack.io/gpu-uuid" in annotations
            ):
                continue
            labels = self._kube.get(f"/api/v1/nodes/{node}")["metadata"]["labels"]
            gpus = int(labels.get("nvidia.com/gpu.count", "1"))
            free = [i for i in range(gpus) if self.fake_uuid(node, i) not in used.get(node, set())]
            if not free:
                continue
            chosen = self.fake_uuid(node, free[0])
            used.setdefault(node, set()).add(chosen)
            patch = {"gpupack.io/gpu-uuid": chosen}
            if "nvidia.com/gpu.memory" in labels:
                patch["gpupack.io/gpu-memory"] = f"{labels['nvidia.com/gpu.memory']}Mi"
            self._kube.merge_patch(
                f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{pod['metadata']['name']}",
                {"metadata": {"annotations": patch}},
            )
            count += 1
        return count


def log(message: str) -> None:
    print(f"localcluster: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m hack.localcluster assign-gpus --kubeconfig K`: run the simulated node
    agent until stopped (the demo leaves it running beside its detached cluster)."""

    parser = argparse.ArgumentParser(prog="python -m hack.localcluster")
    commands = parser.add_subparsers(dest="command", required=True)
    assign = commands.add_parser("assign-gpus", help="play the node agent for kwok nodes")
    assign.add_argument("--kubeconfig", required=True, type=Path)
    args = parser.parse_args(argv)
    assigner = SimulatedGpuAssigner(Kube.from_kubeconfig(args.kubeconfig))
    signal.signal(signal.SIGTERM, lambda *_: assigner.stop())
    with assigner:
        while not assigner.stopped(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
