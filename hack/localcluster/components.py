"""gpupack on the local control plane: the CRDs, and each component as a local process
(`python -m <component>.cli`) authenticating as the component's ServiceAccount, with
the RBAC the chart renders for it; the chart's admission policies. The webhook is
registered with the MutatingWebhookConfiguration the chart renders, pointed at the local
process."""

import base64
import contextlib
import http.client
import json
import secrets
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from certs import pem
from hack.localcluster import chart, containers
from hack.localcluster.chart import SYSTEM_NAMESPACE, WEBHOOK_NAME
from hack.localcluster.client import JSON, ApiError, Kube
from hack.localcluster.controlplane import READY_TIMEOUT, ControlPlane
from hack.localcluster.processes import Process, free_port, host_environment, local_executables
from hack.localcluster.prometheus import (
    Prometheus,
    Target,
    scrape_configs,
    service_monitor_endpoint,
)


@dataclass
class LocalCluster(ControlPlane):
    """The control plane, kwok's GPU nodes, and gpupack's components as local processes."""

    # The release namespace: gpupack's objects, its ServiceAccounts, the chart's rendering.
    namespace: str = SYSTEM_NAMESPACE
    _webhook_configuration: JSON | None = field(default=None, repr=False)
    _webhook_tls: tuple[Path, Path] = field(default=(Path(), Path()), repr=False)
    # Each running component's metrics port, by process name: what Prometheus scrapes.
    metrics_targets: dict[str, Target] = field(default_factory=dict)

    def _write_secret(self, name: str, pair: pem.KeyPair) -> tuple[Path, Path]:
        """A TLS Secret's files as a pod sees them mounted: `tls.crt` and `tls.key` in a
        folder of their own."""
        folder = self.workdir / name
        folder.mkdir(mode=0o700, exist_ok=True)
        cert, key = folder / "tls.crt", folder / "tls.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        key.chmod(0o600)
        return cert, key

    def chart_command(
        self,
        template: str,
        container: str,
        *,
        sets: Sequence[str] = (),
        mounts: Mapping[str, Path] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> tuple[list[str], dict[str, str]]:
        """The command line and environment of the chart's `container` of `template`
        (rendered with `sets`) as a local process runs it (`containers.Container.argv`:
        `mounts` for its volumeMounts, `env` for its downward-API values)."""
        rendered = containers.chart_container(
            Path(self.binary("helm")), template, container, namespace=self.namespace, sets=sets
        )
        executables = {**local_executables(), "kube-scheduler": self.binary("kube-scheduler")}
        argv = rendered.argv(mounts=mounts or {}, env=env or {}, executables=executables)
        return argv, {**host_environment(), **rendered.env, **(env or {})}

    def service_account_kubeconfig(self, name: str) -> Path:
        """A kubeconfig authenticating as gpupack's ServiceAccount `name` would."""
        user, groups = chart.service_account_user(name, self.namespace)
        return self.user_kubeconfig(user, groups)

    @property
    def decision_key_file(self) -> Path:
        """The decision key the webhook seals with and the scheduler verifies (the chart's
        Secret, mounted as a folder with the file `key`), made once per cluster."""
        path = self.workdir / "decision" / "key"
        if not path.exists():
            path.parent.mkdir(mode=0o700, exist_ok=True)
            path.write_text(secrets.token_urlsafe(48))
            path.chmod(0o600)
        return path

    def install_crds(self) -> None:
        """The chart's CustomResourceDefinitions (`charts/gpupack/crds`), once established,
        so the components' watches of GPUPolicy and GPURecommendation objects succeed."""
        admin = self.kube()
        crds = sorted((chart.CHART_DIR / "crds").glob("*.yaml"))
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
        kubeconfig = self.component_kubeconfig(WEBHOOK_NAME, "templates/webhook.yaml")
        serving = pem.issue(
            self._ca,
            f"{WEBHOOK_NAME}.{self.namespace}.svc",
            now=datetime.now(UTC),
            names=["127.0.0.1", f"{WEBHOOK_NAME}.{self.namespace}.svc"],
            algorithm=pem.KeyAlgorithm.ECDSA_P256,
        )
        self._webhook_tls = self._write_secret("webhook-tls", serving)
        self.webhook_port, self.webhook_metrics_port = free_port(), free_port()
        self.audit_log = self.workdir / "logs" / "audit.log"
        process = self.launch(
            WEBHOOK_NAME,
            *self._webhook_command(
                kubeconfig, self.webhook_port, self.webhook_metrics_port, self.audit_log, extra_args
            ),
        )
        self._wait_webhook_ready(process, "127.0.0.1", self.webhook_port)
        self.metrics_targets[WEBHOOK_NAME] = Target(
            self.metrics_service("templates/webhook.yaml"), WEBHOOK_NAME, self.webhook_metrics_port
        )
        base = f"https://127.0.0.1:{self.webhook_port}"
        ca_bundle = (self.pki / "ca.crt").read_bytes()
        if configuration is None:
            configuration = chart.chart_webhook_configuration(
                Path(self.binary("helm")), self.namespace
            )
        configuration = json.loads(json.dumps(configuration))
        for entry in configuration["webhooks"]:
            entry["clientConfig"] = {
                "url": base + chart.webhook_path(entry),
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
        admin.apply(configuration)
        self._webhook_configuration = configuration
        self.install_admission_policies()
        self.write_state()
        return process

    def _webhook_command(
        self,
        kubeconfig: Path,
        port: int,
        metrics_port: int,
        audit: Path,
        extra_args: Sequence[str] = (),
    ) -> tuple[list[str], dict[str, str]]:
        """`gpupack-webhook serve` with the arguments the chart's Deployment renders (ports
        as chart values), its Secret's files where the pod mounts them, plus the two
        things a pod gets another way: the API server (its ServiceAccount token; here a
        kubeconfig) and the audit lines (its stdout; here also a file the tests read).
        Returns the command line and its environment."""
        argv, env = self.chart_command(
            "templates/webhook.yaml",
            "webhook",
            sets=(
                f"webhook.port={port}",
                f"webhook.metricsPort={metrics_port}",
                # Tests stop and restart the webhook; a user's value is 10 s per stop.
                "webhook.shutdownDelaySeconds=0",
            ),
            mounts={
                "/etc/gpupack/tls": self._webhook_tls[0].parent,
                "/etc/gpupack/decision": self.decision_key_file.parent,
            },
        )
        return [*argv, f"--kubeconfig={kubeconfig}", f"--audit-file={audit}", *extra_args], env

    def start_webhook_replica(
        self,
        name: str,
        host: str,
        extra_args: Sequence[str] = (),
        *,
        kubeconfig: Path | None = None,
        node_env: Mapping[str, str] | None = None,
    ) -> tuple[Process, int]:
        """Another `gpupack-webhook serve` (after `install_webhook`), as a second pod of
        the Deployment: the same certificate, key and identity, a port of its own (it
        listens on every address, as in a pod; readiness is checked on `host`), auditing
        to `logs/<name>.audit.log`. Returns it and its port; `route_webhook` puts it
        behind the webhook's Service. `kubeconfig`: its way to the API server, by default
        the ServiceAccount's (a test routes it through a partition). `node_env`: what
        the node it runs on adds to its environment (`clock.skewed`: a node's clock)."""
        kubeconfig = kubeconfig or self.service_account_kubeconfig(WEBHOOK_NAME)
        port = free_port()
        audit = self.workdir / "logs" / f"{name}.audit.log"
        argv, env = self._webhook_command(kubeconfig, port, free_port(), audit, extra_args)
        process = self.launch(name, argv, {**env, **(node_env or {})})
        self._wait_webhook_ready(process, host, port)
        self.write_state()
        return process, port

    def route_webhook(self, endpoints: Sequence[tuple[str, int]]) -> None:
        """Register the webhook by its Service, as the chart does, and make the Service's
        ready endpoints exactly `endpoints` (address, port), as the EndpointSlice
        controller does when pods become ready or start terminating. The API server calls one of
        them per request."""
        admin = self.kube()
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": WEBHOOK_NAME, "namespace": self.namespace},
            "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP"}]},
        }
        admin.apply(service)
        # One EndpointSlice per endpoint (each has a port of its own), as a controller
        # other than kube-controller-manager publishes them; the API server resolves the
        # Service through its slices.
        slices = f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"
        wanted = {f"{WEBHOOK_NAME}-{port}": (address, port) for address, port in endpoints}
        for name, (address, port) in wanted.items():
            admin.apply(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": name,
                        "namespace": self.namespace,
                        "labels": {
                            "kubernetes.io/service-name": WEBHOOK_NAME,
                            "endpointslice.kubernetes.io/managed-by": "localcluster",
                        },
                    },
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
                    "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                }
            )
        selector = f"kubernetes.io/service-name={WEBHOOK_NAME}"
        for item in admin.get(slices, labelSelector=selector)["items"]:
            if item["metadata"]["name"] not in wanted:
                admin.request("DELETE", f"{slices}/{item['metadata']['name']}")
        configuration = json.loads(json.dumps(self._webhook_configuration))
        for entry in configuration["webhooks"]:
            reference = {"namespace": self.namespace, "name": WEBHOOK_NAME, "port": 443}
            entry["clientConfig"] = {
                "service": {**reference, "path": chart.webhook_path(entry)},
                "caBundle": entry["clientConfig"]["caBundle"],
            }
        if configuration != self._webhook_configuration:
            admin.apply(configuration)
            self._webhook_configuration = configuration

    def install_admission_policies(self) -> None:
        """The chart's ValidatingAdmissionPolicies, their bindings and the capacity pods'
        PodDisruptionBudget, exactly as rendered: the API server enforces gpupack's trust
        boundary here as in a cluster."""
        admin = self.kube()
        rendered = chart.render_chart(
            Path(self.binary("helm")), chart.ADMISSION_POLICIES, self.namespace
        )
        for doc in yaml.safe_load_all(rendered):
            if doc:
                admin.apply(doc)

    def exporter_kubeconfig(self) -> Path:
        """A kubeconfig of the exporter's ServiceAccount, with the chart's RBAC for it: who
        writes GPU UUIDs on capacity pods where no real exporter runs."""
        return self.component_kubeconfig(chart.EXPORTER_NAME, "templates/exporter.yaml")

    def node_agent(self, node: str) -> Kube:
        """The exporter's ServiceAccount as `node`'s agent holds it (`node_bound_kube`):
        `SimulatedGpuAssigner`'s `agent`. Its RBAC: `exporter_kubeconfig`, or helm's."""
        return self.node_bound_kube(self.namespace, chart.EXPORTER_NAME, node)

    def component_kubeconfig(self, name: str, template: str, sets: Sequence[str] = ()) -> Path:
        """A kubeconfig of gpupack's ServiceAccount `name`, with the RBAC the chart's
        `template` renders for it (with `sets`) applied."""
        admin = self.kube()
        admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        for obj in chart.chart_rbac(Path(self.binary("helm")), template, self.namespace, sets):
            admin.apply(obj)
        return self.service_account_kubeconfig(name)

    def _wait_webhook_ready(self, process: Process, host: str, port: int) -> None:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        # The certificate names the Service and loopback, not every address a replica may
        # listen on; the API server checks the name, this only waits for readiness.
        context.check_hostname = False
        self._wait_ready(
            process, lambda: http.client.HTTPSConnection(host, port, context=context, timeout=2)
        )

    def _wait_ready(
        self, process: Process, connect: Callable[[], http.client.HTTPConnection]
    ) -> None:
        """Until `GET /readyz` on what `connect` opens answers 200."""
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if not process.alive():
                raise self._failed(process, "exited during startup")
            connection = connect()
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
        container: str,
        *,
        sets: Sequence[str] = (),
        mounts: Mapping[str, Path] | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        node_env: Mapping[str, str] | None = None,
        on_node: str | None = None,
    ) -> Process:
        """Run the chart's `container` of `template` (rendered with `sets`) as a local
        process, with its rendered command line (`containers.Container.argv`), as
        gpupack's ServiceAccount `user` with the RBAC the chart renders for it
        (`component_kubeconfig`; in a pod, the ServiceAccount token), then `extra_args`.
        `node_env`: what the node adds to its environment (`clock.skewed`). `on_node`: a
        node agent's, with a token bound to that Node, as its DaemonSet pod's would be."""
        kubeconfig = self.component_kubeconfig(user, template, sets=sets)
        if on_node is not None:
            try:
                kubeconfig = self.node_bound_kubeconfig(self.namespace, user, on_node)
            except ApiError as error:  # no such Node: its client certificate (writes nothing)
                if error.status != 404:
                    raise
        argv, environment = self.chart_command(
            template, container, sets=sets, mounts=mounts, env=env
        )
        process = self.launch(
            process_name,
            [*argv, f"--kubeconfig={kubeconfig}", *extra_args],
            {**environment, **(node_env or {})},
        )
        self.write_state()
        return process

    def _stop(self, process_name: str) -> None:
        self.metrics_targets.pop(process_name, None)
        process = self.processes.pop(process_name, None)
        if process is not None:
            process.stop()
        self.write_state()

    def metrics_service(self, template: str) -> str:
        """The name of the Service with a `metrics` port that `template` renders: the job
        prometheus-operator gives the component's series."""
        rendered = chart.render_chart(Path(self.binary("helm")), template, self.namespace)
        for doc in yaml.safe_load_all(rendered):
            if doc and doc.get("kind") == "Service":
                ports = doc["spec"].get("ports") or []
                if any(port.get("name") == "metrics" for port in ports):
                    return str(doc["metadata"]["name"])
        raise LookupError(f"{template} renders no Service with a metrics port")

    def start_prometheus(self, *, extra: Sequence[Target] = (), interval: str = "1s") -> Prometheus:
        """A Prometheus scraping every running component (and `extra` targets, such as an
        exporter run in-process) the way the chart's ServiceMonitor says. Stop it."""
        endpoint = service_monitor_endpoint(Path(self.binary("helm")), self.namespace)
        targets = [*self.metrics_targets.values(), *extra]
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": scrape_configs(endpoint, self.namespace, targets, interval),
        }
        prometheus = Prometheus(self.binary("prometheus"), self.workdir / "prometheus")
        return prometheus.start(config)

    def install_scheduler(
        self,
        *,
        name: str = chart.SCHEDULER_NAME,
        extra_args: Sequence[str] = (),
        sets: Sequence[str] = (),
        node_env: Mapping[str, str] | None = None,
    ) -> Process:
        """Run the gpupack scheduler as the chart does (`name` tells replicas apart): the
        extender (`python -m scheduler.cli`, with `extra_args` and the node's `node_env`,
        e.g. `clock.skewed`) and the pinned kube-scheduler twice, with exactly the two
        KubeSchedulerConfigurations the chart renders (with `sets`), the first pointed at
        this extender's port, plus a local kubeconfig. All run as the local user
        `gpupack-scheduler` with the RBAC the chart renders. Returns
        the extender; the kube-schedulers are the processes `<name>-kube-scheduler`
        (fractional pods) and `<name>-capacity-scheduler` (capacity pods).

        The extender follows the Lease of the kube-scheduler beside it by hostname, as
        in a pod; here every replica shares this machine's hostname, so each replica's
        extender believes it leads (harmless with one replica; with two, both keep
        house)."""
        port, metrics_port = free_port(), free_port()
        sets = (*sets, f"scheduler.extenderPort={port}", f"scheduler.metricsPort={metrics_port}")
        for state in chart.chart_state_configmaps(Path(self.binary("helm")), self.namespace, sets):
            self.kube().create_once(state)  # the budgets' ConfigMap; another replica's kept
        extender = self._run_component(
            name,
            chart.SCHEDULER_NAME,
            "templates/scheduler.yaml",
            "extender",
            sets=sets,
            mounts={"/etc/gpupack/decision": self.decision_key_file.parent},
            # In a pod, POD_NAME is the pod's hostname, which kube-scheduler's Lease
            # identity starts with; the extender follows that Lease by it.
            env={"POD_NAME": socket.gethostname()},
            extra_args=extra_args,
            node_env=node_env,
        )
        service = self.metrics_service("templates/scheduler.yaml")
        self.metrics_targets[name] = Target(service, name, metrics_port)
        folder = self.workdir / f"{name}-kube-scheduler"
        folder.mkdir(exist_ok=True)
        kubeconfig = str(self.service_account_kubeconfig(chart.SCHEDULER_NAME))
        for key in ("config.yaml", "capacity.yaml"):
            config = chart.chart_scheduler_config(
                Path(self.binary("helm")), self.namespace, sets, key
            )
            config.setdefault("clientConnection", {})["kubeconfig"] = kubeconfig
            (folder / key).write_text(yaml.safe_dump(config))
        self._wait_extender_ready(extender, port)
        for container, process in self._kube_schedulers(name):
            argv, _ = self.chart_command(
                "templates/scheduler.yaml",
                container,
                sets=sets,
                mounts={"/etc/gpupack-scheduler": folder},
            )
            # A pod's ports are its own; on this host every kube-scheduler shares one
            # network, so the probe port is off (the pod's probes are tested on the real
            # node).
            self.launch(process, [*argv, "--secure-port=0"])
        self.write_state()
        return extender

    @staticmethod
    def _kube_schedulers(name: str) -> list[tuple[str, str]]:
        """The chart's kube-scheduler containers of scheduler replica `name`, and the local
        processes that run them: fractional pods', and capacity pods'."""
        return [
            ("kube-scheduler", f"{name}-kube-scheduler"),
            ("capacity-scheduler", f"{name}-capacity-scheduler"),
        ]

    def _wait_extender_ready(self, process: Process, port: int) -> None:
        """Until the extender's caches have synced (its /readyz), so the first pods a test
        creates meet a ready extender (in a pod, a pod tried earlier fails once with a
        SchedulerError and kube-scheduler retries it)."""
        self._wait_ready(process, lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=2))

    def scheduler_processes(self, name: str = chart.SCHEDULER_NAME) -> list[str]:
        """The local processes of scheduler replica `name`: its extender, then the
        kube-schedulers beside it (the pod's containers)."""
        return [name, *(process for _, process in self._kube_schedulers(name))]

    def stop_scheduler(
        self, name: str = chart.SCHEDULER_NAME, *, kill: bool = False, extender_only: bool = False
    ) -> None:
        """Stop a scheduler replica, its kube-schedulers and extender: SIGTERM (each
        kube-scheduler releases its Lease), or SIGKILL. `extender_only`: stop the
        extender alone, as when its container crashes (`processes[name].start()` brings
        it back)."""
        names = [name] if extender_only else self.scheduler_processes(name)
        for process_name in names:
            process = self.processes.get(process_name)
            if kill and process is not None:
                process.kill()
            if extender_only and process is not None:
                process.stop()
            else:
                self._stop(process_name)
        self.write_state()

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
        here: the exporter reports `gpupack_exporter_nvml_up 0` and works on. The folder
        the chart shares with the `cuda-csi` container (its shim roster) is an empty one
        beside the socket: no roster answers there, so processes' shim reads `unknown`."""
        if pod_resources_socket.name != "kubelet.sock":
            raise ValueError("the chart's exporter reads <pod-resources folder>/kubelet.sock")
        agent = pod_resources_socket.parent / "agent-sockets"
        agent.mkdir(exist_ok=True)
        port = free_port()
        process = self._run_component(
            f"{chart.EXPORTER_NAME}-{node}",
            chart.EXPORTER_NAME,
            "templates/exporter.yaml",
            "exporter",
            sets=(f"exporter.port={port}",),
            mounts={
                "/var/lib/kubelet/pod-resources": pod_resources_socket.parent,
                "/run/gpupack/agent": agent,
            },
            env={"NODE_NAME": node},
            extra_args=[*([f"--proc={proc}"] if proc else []), *extra_args],
            on_node=node,
        )
        return process, port

    def install_mps_csi(self, node: str, folder: Path) -> tuple[Process, int]:
        """Run the CSI DaemonSet's `mps-csi` container (the CSI driver
        mps.gpupack.io) for `node` as a local process, with the chart's command line and
        RBAC; its mounts (sockets, the kubelet's pods, the MPS root) are folders under
        `folder`. Returns the process and its metrics port."""
        port = free_port()
        mounts = {
            path: folder / path.strip("/").replace("/", "-")
            for path in ("/csi", "/registration", "/var/lib/kubelet/pods", "/run/gpupack/mps")
        }
        for local in mounts.values():
            local.mkdir(parents=True, exist_ok=True)
        process = self._run_component(
            f"mps-csi-{node}",
            chart.CSI_NAME,
            "templates/csi.yaml",
            "mps-csi",
            sets=(f"mps.metricsPort={port}",),
            mounts=mounts,
            env={"NODE_NAME": node},
        )
        return process, port

    def stop_mps_csi(self, node: str) -> None:
        self._stop(f"mps-csi-{node}")

    def stop_exporter(self, node: str) -> None:
        self._stop(f"{chart.EXPORTER_NAME}-{node}")

    def install_recommender(
        self,
        *,
        name: str = chart.RECOMMENDER_NAME,
        extra_args: Sequence[str] = (),
        node_env: Mapping[str, str] | None = None,
    ) -> Process:
        """Run `gpupack-recommender` as a local process with the RBAC the chart renders
        (rollouts granted), bound to the local user `gpupack-recommender`; `name` is its
        pod's name (its Lease identity), `node_env` what its node adds (`clock.skewed`)."""
        self.install_crds()
        metrics_port = free_port()
        process = self._run_component(
            name,
            chart.RECOMMENDER_NAME,
            "templates/recommender.yaml",
            "recommender",
            sets=("recommender.rollouts=true", f"recommender.metricsPort={metrics_port}"),
            env={"POD_NAME": name},
            extra_args=extra_args,
            node_env=node_env,
        )
        service = self.metrics_service("templates/recommender.yaml")
        self.metrics_targets[name] = Target(service, name, metrics_port)
        return process

    def stop_recommender(self, name: str = chart.RECOMMENDER_NAME) -> None:
        """SIGTERM: the recommender checkpoints every history and releases its Lease."""
        self._stop(name)
