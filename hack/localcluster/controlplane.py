"""A real Kubernetes control plane as local processes: etcd, kube-apiserver (certificates
from `certs/`), kube-controller-manager, kube-scheduler and kwok, on loopback ports
chosen at run time, from the binaries `hack/lib/binaries.sh` builds. `stop()` stops
everything and releases every port: on normal exit, on a failing test, and (for attached
clusters) when the parent process dies. gpupack's components are installed on top by
`hack.localcluster.components`."""

import contextlib
import http.client
import json
import os
import subprocess
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Self

import yaml

from certs import pem
from hack.localcluster import realnode
from hack.localcluster.client import ApiError, ClusterError, Kube
from hack.localcluster.nodes import (
    DEFAULT_NODE_POOLS,
    KWOK_ANNOTATION,
    NVIDIA_DEVICE_CLASS,
    NodePool,
    node_manifest,
    resource_slice,
    schedulable,
)
from hack.localcluster.processes import Process, Restarter, free_port, log, stop_pid
from hack.localcluster.realnode import RealNode

SERVICE_CIDR: Final = "10.96.0.0/16"
READY_TIMEOUT: Final = 120.0
# ... and per kwok node: the node-lifecycle controller lifts their not-ready taints at the
# pace of its client (`_controller_qps`).
NODE_READY_SECONDS: Final = 0.15


@dataclass
class ControlPlane:
    """The control plane and kwok nodes under `workdir` (certificates, data, logs)."""

    workdir: Path
    bin_dir: Path = field(default_factory=lambda: Path(os.environ.get("GPUPACK_BIN_DIR", "")))
    node_pools: Sequence[NodePool] = DEFAULT_NODE_POOLS
    gpu_taint: bool = False
    detach: bool = False  # the demo leaves the cluster running after it exits
    # One real kubelet node beside kwok's (hack/localcluster/realnode.py), running the
    # OCI archives `node_images` (the pause image first). The API server then serves on
    # the pod bridge's host address, where pods reach it, instead of loopback.
    real_node: bool = False
    node_images: Sequence[Path] = ()
    processes: dict[str, Process] = field(default_factory=dict)
    api_port: int = 0
    node: RealNode | None = field(default=None, repr=False)
    _admin: Kube | None = field(default=None, repr=False)
    _kubelet: Restarter | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """Where the API server listens: loopback, or the pod bridge's host address."""
        return realnode.GATEWAY if self.real_node else "127.0.0.1"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.api_port}"

    def binary(self, name: str) -> str:
        path = self.bin_dir / name
        if not path.is_file():
            raise ClusterError(
                f"{path} is missing: run hack/test or hack/demo (they build the Kubernetes "
                "binaries), or set GPUPACK_BIN_DIR"
            )
        return str(path)

    # lifecycle

    def start(self) -> Self:
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            if self.real_node:
                # One real node per machine: its bridge and iptables are the machine's.
                self.node = RealNode(self)
                self.node.claim_host()
                realnode.prepare_network(SERVICE_CIDR)
            self._write_pki()
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
            self._supervise()
            self._create_nodes()
            if self.node is not None:
                self.node.start(self.node_images)
        except BaseException:
            self.stop()
            raise
        self.write_state()
        log(f"local cluster ready in {time.monotonic() - started:.1f} s: {self.server}")
        return self

    def stop(self) -> None:
        if self._kubelet is not None:
            self._kubelet.__exit__(None, None, None)
            self._kubelet = None
        if self.node is not None:
            self.node.stop()
            self.node = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        for process in reversed(list(self.processes.values())):
            process.stop()
        self.processes.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / "state.json").unlink()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_state(self) -> None:
        """Where a later `hack/demo stop` finds the processes to stop."""
        state = {name: p.pid for name, p in list(self.processes.items())}
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
        for host_state in workdir.glob(f"*/{realnode.HOST_STATE}"):
            realnode.clean_host(host_state.parent)  # a real node's changes to the host
        state_file.unlink()
        return list(state)

    def _supervise(self) -> None:
        """Start again the components that exit on their own, as the kubelet restarts
        their static pods: kube-scheduler exits when it finds its cache corrupted (an
        event missed while the API server restarted), kube-controller-manager when it
        cannot sync, kwok on a fatal watch error. A test that stops one on purpose
        (`Process.stop`) keeps it stopped. Not for a detached cluster (the demo's), which
        outlives this process."""
        if self.detach:
            return
        names = ["kube-controller-manager", "kube-scheduler", "kwok"]
        self._kubelet = Restarter(self.processes, names, restarted=self.write_state)
        self._kubelet.__enter__()

    def launch(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
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
                *([self.address] if self.real_node else []),
            ],
        )
        self._write_pair("apiserver", serving)
        # The API server's client certificate towards kubelets (logs, exec, port-forward).
        kubelet_client = pem.issue(
            ca,
            "kube-apiserver-kubelet-client",
            now=now,
            usage=pem.Usage.CLIENT,
            organization="system:masters",
            algorithm=algo,
        )
        self._write_pair("apiserver-kubelet-client", kubelet_client)
        private, public = pem.new_key_pair(pem.KeyAlgorithm.RSA2048)
        (self.pki / "sa.key").write_bytes(private)
        (self.pki / "sa.pub").write_bytes(public)

    def _write_pair(self, name: str, pair: pem.KeyPair) -> tuple[Path, Path]:
        cert, key = self.pki / f"{name}.crt", self.pki / f"{name}.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        key.chmod(0o600)
        return cert, key

    def serving_pair(self, common_name: str, names: Sequence[str]) -> pem.KeyPair:
        """A serving certificate for `names`, issued by the cluster's CA (`Host`)."""
        return pem.issue(
            self._ca,
            common_name,
            now=datetime.now(UTC),
            names=list(names),
            algorithm=pem.KeyAlgorithm.ECDSA_P256,
        )

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
        return self._write_kubeconfig(
            path, name, {"client-certificate": str(cert), "client-key": str(key)}
        )

    def _write_kubeconfig(self, path: Path, name: str, user: dict[str, str]) -> Path:
        """A kubeconfig at `path` for this API server (its CA) as `user`, owner-only."""
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
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": "gpupack-local", "user": name}}],
            "current-context": name,
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def node_bound_kube(self, namespace: str, account: str, node: str) -> Kube:
        """ServiceAccount `namespace/account` as its pod on `node` holds it: a client with
        a fresh token (`Kube.node_bound_token`; a token dies with its ServiceAccount, as
        when a release is uninstalled and installed again)."""
        admin = self.kube()
        try:
            return admin.with_token(admin.node_bound_token(namespace, account, node))
        finally:
            admin.close()  # this thread's connection: a node agent's writer thread's own

    def node_bound_kubeconfig(self, namespace: str, account: str, node: str) -> Path:
        """A kubeconfig of `node_bound_kube`'s token, for a process of the harness."""
        token = self.node_bound_kube(namespace, account, node).token or ""
        name = f"{account}-on-{node}"
        return self._write_kubeconfig(self.workdir / f"kubeconfig-{name}", name, {"token": token})

    def tool(self, name: str, *args: str, check: bool = True, timeout: float = 600) -> str:
        """Run a pinned command-line tool (`kubectl`, `helm`) as the cluster's admin, as a
        user would; its output (stdout, then stderr). ClusterError with that output if it
        fails and `check`."""
        result = subprocess.run(  # noqa: S603 (our pinned binaries)
            [self.binary(name), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(f"{name} {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result.stdout + result.stderr

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
        process = self.launch(
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
        process = self.launch(
            "kube-apiserver",
            [
                self.binary("kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
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
                # DefaultTolerationSeconds, ResourceQuota, PodSecurity, ...) plus what
                # managed clusters (GKE, ...) run too: ExtendedResourceToleration gives a
                # pod asking nvidia.com/gpu the GPU taint's toleration, before any webhook
                # sees it, and public charts (vLLM, Triton, TGI) carry none of their own.
                "--enable-admission-plugins=NodeRestriction,ExtendedResourceToleration",
                "--allow-privileged=true",
                # On loopback the API server cannot be the `kubernetes` Service's endpoint;
                # on the pod bridge it is, and pods reach it through that Service.
                f"--endpoint-reconciler-type={'lease' if self.real_node else 'none'}",
                f"--kubelet-client-certificate={self.pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={self.pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={self.pki / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
                # Webhooks registered by Service are called at an endpoint's address (no
                # kube-proxy here to route a ClusterIP): as behind a Service in a cluster.
                "--enable-aggregator-routing=true",
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
        self.launch(
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
                # Its client's default 20 requests a second lifts the not-ready taint of
                # about five new nodes a second: 2,000 kwok nodes took over seven minutes.
                # Large clusters raise it the same way.
                f"--kube-api-qps={self._controller_qps()}",
                f"--kube-api-burst={2 * self._controller_qps()}",
                "--v=1",
            ],
        )
        scheduler = self.user_kubeconfig("system:kube-scheduler")
        self.launch(
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
        self.launch(
            "kwok",
            [
                self.binary("kwok"),
                f"--kubeconfig={kwok}",
                f"--config={Path(__file__).parents[1] / 'kwok-stages.yaml'}",
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

    def _controller_qps(self) -> int:
        """kube-controller-manager's requests a second: its default 20, and one more for
        every ten kwok nodes past 200."""
        nodes = sum(pool.count for pool in self.node_pools)
        return max(20, nodes // 10)

    def _create_nodes(self) -> None:
        admin = self.kube()
        names = []
        for pool in self.node_pools:
            for index in range(pool.count):
                node = admin.apply(node_manifest(pool, index, taint=self.gpu_taint))
                names.append(node["metadata"]["name"])
        if any(pool.dra for pool in self.node_pools):  # NVIDIA's DRA driver, standing in
            admin.apply(NVIDIA_DEVICE_CLASS)
            for pool in (p for p in self.node_pools if p.dra):
                for index in range(pool.count):
                    admin.apply(resource_slice(pool, index))

        def all_ready() -> bool:
            nodes = admin.get("/api/v1/nodes", labelSelector="type=kwok")["items"]
            ready = {n["metadata"]["name"] for n in nodes if schedulable(n)}
            return set(names) <= ready

        admin.wait_for(
            f"{len(names)} kwok nodes to be Ready and schedulable",
            all_ready,
            timeout=READY_TIMEOUT + len(names) * NODE_READY_SECONDS,
        )
