"""One real node beside kwok's simulated ones: a kubelet built from the pinned Kubernetes
module, containerd and runc from Debian, the CNI bridge and host-local plugins, and
kube-proxy, so the chart's pods run as containers: the image, hook Jobs, probes,
ServiceAccount tokens, Services and ClusterIPs, as users get them.

Its network stays inside this machine. The pods live on the bridge `gpupack0`
(10.88.0.0/16, apart from kwok's fake 10.244.0.0/16) whose host address, 10.88.0.1, is
where the API server serves for such a cluster (`ControlPlane.address`) and what the
`kubernetes` Service's endpoint is; kube-proxy turns ClusterIPs into those addresses. No
masquerade, an empty resolv.conf (there is no cluster DNS), and a firewall rule drops
anything a pod sends that would leave through another interface.

The kubelet changes the host as it starts (sysctls, iptables chains, cgroups, mounts,
/var/lib/kubelet/device-plugins, /var/log/containers), and its root folder is under
/var/lib/gpupack-node: `stop()` undoes what it knows,
so a second run, and the rest of the suite, start clean.
"""

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import yaml

from hack.localcluster.client import ApiError
from hack.localcluster.host import Host
from hack.localcluster.processes import Process, free_port, log

BRIDGE: Final = "gpupack0"
GATEWAY: Final = "10.88.0.1"
POD_CIDR: Final = "10.88.0.0/16"
CNI_BIN: Final = "/usr/lib/cni"  # Debian's containernetworking-plugins
SANDBOX_IMAGE: Final = "registry.k8s.io/pause:3.10"
FIREWALL_CHAIN: Final = "GPUPACK-NODE"
# What the kubelet sets at every start; restored at stop (panic_on_oops=1 on a shared
# machine turns any kernel oops into a reboot).
KUBELET_SYSCTLS: Final = ("kernel.panic_on_oops", "kernel.panic", "vm.overcommit_memory")
VAR_LIB_KUBELET: Final = Path("/var/lib/kubelet")
CONTAINER_LOG_LINKS: Final = Path("/var/log/containers")  # the kubelet's, whatever its config
HOST_STATE: Final = "host-state.json"
# Kubelet root folders live here, not under the node's folder: the kubelet dials plugins'
# Unix sockets under its root, and a socket path has at most 107 bytes (a pytest folder
# such as /tmp/pytest-of-root/pytest-108/realnode0/gpupack-node/kubelet/root/
# plugins_registry/cuda.gpupack.io-reg.sock has 108, and the kubelet's dial fails).
KUBELET_ROOTS: Final = Path("/var/lib/gpupack-node")
OWNER: Final = Path("/run/gpupack-real-node")  # the folder of the machine's real node
RESTORED_SYSCTLS: Final = (
    *KUBELET_SYSCTLS,
    "net.ipv4.ip_forward",  # prepare_network's, for the bridge
    "net.bridge.bridge-nf-call-iptables",
)
NODE_READY_TIMEOUT: Final = 120.0


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=120)  # noqa: S603


def prepare_network(service_cidr: str) -> None:
    """The bridge and its host address, before the API server binds to it: the CNI
    bridge plugin adopts an existing bridge with its gateway address. Service ClusterIPs
    are routed to the bridge, so that one kube-proxy has no rule for yet stays here
    instead of following the default route out of the machine."""
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    addresses = _run("ip", "-o", "addr", "show", "dev", BRIDGE).stdout
    if f" {GATEWAY}/" not in addresses:
        _run("ip", "addr", "add", f"{GATEWAY}/16", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    _run("ip", "route", "replace", service_cidr, "dev", BRIDGE)
    # kube-proxy's rules must see bridged traffic (pod to Service to pod on one bridge).
    if not _sysctl_path("net.bridge.bridge-nf-call-iptables").exists():
        _run("modprobe", "br_netfilter")  # not built in: needs kmod
    _write_sysctl("net.bridge.bridge-nf-call-iptables", "1")
    _write_sysctl("net.ipv4.ip_forward", "1")
    # Pod traffic stays on the bridge or goes to the host itself: nothing is forwarded
    # out through another interface.
    _run("iptables", "-N", FIREWALL_CHAIN, check=False)
    _run("iptables", "-F", FIREWALL_CHAIN)
    _run("iptables", "-A", FIREWALL_CHAIN, "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP")
    if _run("iptables", "-C", "FORWARD", "-j", FIREWALL_CHAIN, check=False).returncode != 0:
        _run("iptables", "-I", "FORWARD", "1", "-j", FIREWALL_CHAIN)


def remove_network() -> None:
    _run("iptables", "-D", "FORWARD", "-j", FIREWALL_CHAIN, check=False)
    _run("iptables", "-F", FIREWALL_CHAIN, check=False)
    _run("iptables", "-X", FIREWALL_CHAIN, check=False)
    _run("ip", "link", "delete", BRIDGE, check=False)


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def _read_sysctl(name: str) -> str:
    return _sysctl_path(name).read_text().strip()


def _write_sysctl(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        _sysctl_path(name).write_text(value)


@dataclass
class RealNode:
    """A kubelet node named `name` of `cluster`, with its own containerd, CNI and
    kube-proxy, under `cluster.workdir / name`."""

    cluster: Host
    name: str = "gpupack-node"
    labels: dict[str, str] = field(default_factory=lambda: {"gpupack.io/test-node": "real"})
    processes: list[Process] = field(default_factory=list)
    _sysctls: dict[str, str] = field(default_factory=dict)
    _made_var_lib_kubelet: bool = False

    @property
    def folder(self) -> Path:
        return self.cluster.workdir / self.name

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's --root-dir (the chart's `mps.kubeletDir` for this node): short
        and one per node folder."""
        return KUBELET_ROOTS / hashlib.sha256(str(self.folder).encode()).hexdigest()[:12]

    @property
    def containerd_socket(self) -> Path:
        return self.folder / "containerd" / "containerd.sock"

    def start(self, images: Sequence[Path]) -> None:
        """containerd (with `images` imported), the CNI configuration, the kubelet and
        kube-proxy; returns once the Node is Ready."""
        started = time.monotonic()
        for tool in ("containerd", "runc", "ctr", "iptables", "conntrack"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is missing: hack/lib/node.sh installs it")
        if not (self.folder / HOST_STATE).exists():
            self.claim_host()
        self._start_containerd()
        for image in images:
            self._import(image)
        self._write_cni()
        self._start_kubelet()
        self._start_kube_proxy()
        self._wait_ready()
        log(f"real node {self.name} Ready in {time.monotonic() - started:.1f} s")

    def claim_host(self) -> None:
        """Make this node the machine's one real node, and write down what it will
        change (before `prepare_network` does). Another live node is an error (their
        iptables chains and bridge would collide); one left by a run that died is
        cleaned up first."""
        clean_dead_node(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._sysctls = {name: _read_sysctl(name) for name in RESTORED_SYSCTLS}
        # The kubelet makes /var/lib/kubelet/device-plugins whatever --root-dir says.
        self._made_var_lib_kubelet = not VAR_LIB_KUBELET.exists()
        self._save_host_state()
        OWNER.write_text(str(self.folder))

    def launch(self, name: str, args: list[str]) -> Process:
        process = self.cluster.launch(f"{self.name}-{name}", args)
        self.processes.append(process)
        return process

    # containerd

    def _start_containerd(self) -> None:
        base = self.folder / "containerd"
        config = base / "config.toml"
        base.mkdir(exist_ok=True)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config.write_text(
            f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{base / "containerd.sock.ttrpc"}"
[{cri}]
  sandbox_image = "{SANDBOX_IMAGE}"
  # CRI asks for oom_score_adj -998 for sandboxes; without CAP_SYS_RESOURCE runc fails
  # ("can't get final child's PID from pipe") unless the score is clamped.
  restrict_oom_score_adj = true
  enable_selinux = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.folder / "cni"}"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
"""
        )
        process = self.launch("containerd", ["containerd", f"--config={config}"])
        deadline = time.monotonic() + 60
        while not self.containerd_socket.exists():
            if not process.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start:\n{process.tail()}")
            time.sleep(0.1)

    def _ctr(self, *args: str) -> str:
        return _run("ctr", f"--address={self.containerd_socket}", "-n", "k8s.io", *args).stdout

    def container_env(self, container_id: str) -> dict[str, str]:
        """The environment containerd gives container `container_id` (a pod status's
        `containerd://...` or the bare id): its OCI spec's `process.env`, which the
        runtime, and the NVIDIA container toolkit's hook, read."""
        info = json.loads(
            self._ctr("containers", "info", container_id.rsplit("://", maxsplit=1)[-1])
        )
        pairs = (entry.partition("=") for entry in info["Spec"]["process"]["env"])
        return {name: value for name, _, value in pairs}

    def _import(self, archive: Path) -> None:
        """An OCI archive made by buildah: its index names the image in full."""
        self._ctr("images", "import", str(archive))

    def _write_cni(self) -> None:
        folder = self.folder / "cni"
        folder.mkdir(exist_ok=True)
        network = {
            "cniVersion": "0.4.0",
            "name": "gpupack",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                        # Service ClusterIPs are outside the pod range: they go to the
                        # host, where kube-proxy rewrites them (the firewall drops the rest).
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.folder / "cni-ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (folder / "10-gpupack.conflist").write_text(json.dumps(network, indent=2))

    # kubelet and kube-proxy

    def _start_kubelet(self) -> None:
        cluster = self.cluster
        folder = self.folder / "kubelet"
        folder.mkdir(exist_ok=True)
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        kubeconfig = cluster.user_kubeconfig(
            f"system:node:{self.name}", ["system:nodes"], name=f"node-{self.name}"
        )
        serving = cluster.serving_pair(self.name, [self.name, GATEWAY])
        cert, key = folder / "kubelet.crt", folder / "kubelet.key"
        cert.write_bytes(serving.cert_pem)
        key.write_bytes(serving.key_pem)
        key.chmod(0o600)
        self.kubelet_port = free_port()
        resolv = folder / "resolv.conf"
        resolv.write_text("")  # no cluster DNS; pods get no name servers, so no lookups leave
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # these machines have cgroup v1 only
            "cgroupDriver": "cgroupfs",  # containerd 1.6 cannot tell the kubelet its driver
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": GATEWAY,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzPort": free_port(),
            "healthzBindAddress": "127.0.0.1",
            "tlsCertFile": str(cert),
            "tlsPrivateKeyFile": str(key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(cluster.pki / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "resolvConf": str(resolv),
            "podLogsDir": str(self.folder / "pod-logs"),
            "failSwapOn": False,
            "staticPodPath": "",
            "serializeImagePulls": False,
            # A shared development disk: never evict the tests' pods for its fill level.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "fileCheckFrequency": "2s",
            "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
            "maxPods": 60,
        }
        path = folder / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        self.launch(
            "kubelet",
            [
                cluster.binary("kubelet"),
                f"--config={path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={folder / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={GATEWAY}",
                f"--node-labels={labels}",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self) -> None:
        cluster = self.cluster
        folder = self.folder / "kube-proxy"
        folder.mkdir(exist_ok=True)
        kubeconfig = cluster.user_kubeconfig("system:kube-proxy", name=f"kube-proxy-{self.name}")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": self.name,
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "bindAddress": GATEWAY,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # Leave the host's sysctls alone.
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
            "conntrack": {"maxPerCore": 0},
        }
        path = folder / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        self.launch("kube-proxy", [cluster.binary("kube-proxy"), f"--config={path}", "--v=1"])

    def _wait_ready(self) -> None:
        admin = self.cluster.kube()

        def ready() -> bool:
            for process in self.processes:
                if not process.alive():
                    raise RuntimeError(f"{process.name} exited:\n{process.tail()}")
            try:
                node = admin.get(f"/api/v1/nodes/{self.name}")
            except ApiError:  # not registered yet
                return False
            conditions = node.get("status", {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        admin.wait_for(f"the real node {self.name} to be Ready", ready, timeout=NODE_READY_TIMEOUT)

    # teardown

    def stop(self) -> None:
        """Stop kube-proxy, the kubelet and containerd (and every container), then undo
        what they changed on the host (`clean_host`)."""
        for process in reversed(self.processes):
            process.stop(grace=20)
            self.cluster.processes.pop(process.name, None)
        self.processes.clear()
        clean_host(self.folder)

    def _save_host_state(self) -> None:
        """What `clean_host` needs, on disk: a detached cluster (the demo's) is cleaned
        up by a later process (`hack/demo stop`)."""
        state = {
            "sysctls": self._sysctls,
            "made_var_lib_kubelet": self._made_var_lib_kubelet,
            "containerd_socket": str(self.containerd_socket),
            "kubelet_root": str(self.kubelet_root),
            "kube_proxy": str(self.cluster.bin_dir / "kube-proxy"),
        }
        (self.folder / HOST_STATE).write_text(json.dumps(state))


def clean_host(folder: Path) -> None:
    """Undo what a stopped node under `folder` did to this machine: containers that
    outlive containerd, kube-proxy's and the kubelet's iptables chains, sysctls, mounts,
    cgroups, log links, its kubelet root, /var/lib/kubelet, the bridge. Nothing to do
    without its state."""
    path = folder / HOST_STATE
    if not path.exists():
        return
    state = json.loads(path.read_text())
    if Path(state["kube_proxy"]).is_file():
        _run(state["kube_proxy"], "--cleanup", check=False)
    _kill_pods()  # containers outlive containerd and their shims
    _kill_shims(state["containerd_socket"])
    for name, value in state["sysctls"].items():
        _write_sysctl(name, value)
    _remove_kube_iptables()
    _unmount_under(folder)
    kubelet_root = state.get("kubelet_root")
    if kubelet_root:
        _unmount_under(Path(kubelet_root))
        shutil.rmtree(kubelet_root, ignore_errors=True)
        with contextlib.suppress(OSError):
            KUBELET_ROOTS.rmdir()  # when no other node's is left
    for cgroup in Path("/sys/fs/cgroup").glob("*/kubepods*"):
        _remove_cgroup(cgroup)
    for link in CONTAINER_LOG_LINKS.glob("*.log"):
        if link.is_symlink() and str(folder) in os.readlink(link):
            link.unlink()
    if state["made_var_lib_kubelet"]:
        shutil.rmtree(VAR_LIB_KUBELET, ignore_errors=True)
    remove_network()
    path.unlink()
    if OWNER.exists() and OWNER.read_text().strip() == str(folder):
        OWNER.unlink()


def clean_dead_node(folder: Path | None = None) -> None:
    """Undo what the machine's last real node changed if the run that started it died
    without stopping it (its containerd gone); the node under `folder` may be running (it
    is the caller's own). Another running node is an error: there can be one at a time
    (the bridge and iptables chains are the machine's)."""
    if not OWNER.exists():
        return
    other = Path(OWNER.read_text().strip())
    if other != folder and _running(other):
        raise RuntimeError(
            f"a real node from {other} is already running on this machine, and "
            "there can be one at a time (the bridge and iptables chains are the "
            "machine's): stop it first (`hack/demo stop` for the demo's)"
        )
    clean_host(other)


def _running(folder: Path) -> bool:
    """Whether the containerd of the node under `folder` still runs."""
    config = folder / "containerd" / "config.toml"
    return _run("pgrep", "-f", "--", f"--config={config}", check=False).returncode == 0


def _kill_shims(containerd_socket: str) -> None:
    """containerd's shims outlive it (each leads a session of its own): end them."""
    shim = "containerd-shim-runc-v2"
    found = _run("pgrep", "-f", f"{shim} .*-address {containerd_socket}", check=False)
    pids = [int(pid) for pid in found.stdout.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, 9)
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
        time.sleep(0.1)


def _unmount_under(folder: Path) -> None:
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(str(folder))
    ]
    for mount in sorted(mounts, key=len, reverse=True):
        _run("umount", "-l", mount, check=False)


def _kill_pods() -> None:
    """SIGKILL every process in the kubelet's cgroups, and wait until they are gone."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        pids = {
            int(pid)
            for procs in Path("/sys/fs/cgroup").glob("*/kubepods*/**/cgroup.procs")
            for pid in procs.read_text().split()
        }
        pids = {pid for pid in pids if not _zombie(pid)}
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        time.sleep(0.2)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def _remove_cgroup(path: Path) -> None:
    """The kubelet's cgroup tree, deepest first; a folder whose processes are still
    exiting is tried again for a few seconds."""
    folders = sorted(
        (p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
    )
    for folder in [*folders, path]:
        for _ in range(50):
            try:
                folder.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def _remove_kube_iptables() -> None:
    """The chains the kubelet makes and never removes (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
    ...), with the rules that jump to them; kube-proxy's own went with `--cleanup`."""
    for table in ("filter", "nat", "mangle"):
        rules = _run("iptables", "-t", table, "-S", check=False).stdout.splitlines()
        for rule in rules:
            if rule.startswith("-A ") and " -j KUBE-" in rule:
                _run("iptables", "-t", table, "-D", *rule[3:].split(), check=False)
        for rule in rules:
            if rule.startswith("-N KUBE-"):
                _run("iptables", "-t", table, "-F", rule[3:], check=False)
                _run("iptables", "-t", table, "-X", rule[3:], check=False)
