"""What a piece of the local cluster that runs beside the control plane needs of it: the
real kubelet node (`realnode`) and Karpenter (`karpenter`) start processes under its
supervision, read its binaries and work directory, and are given credentials by it.

A small interface, so those pieces depend on it and not on `ControlPlane` itself (which
starts them: the dependency ran both ways).
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from certs import pem
from hack.localcluster.client import Kube
from hack.localcluster.processes import Process


class Host(Protocol):
    @property
    def workdir(self) -> Path:
        """Where each piece keeps its files, in a folder of its own."""
        ...

    @property
    def pki(self) -> Path:
        """The cluster's certificates: its CA's is `pki / "ca.crt"`."""
        ...

    @property
    def bin_dir(self) -> Path:
        """The pinned binaries."""
        ...

    @property
    def processes(self) -> dict[str, Process]:
        """Every process it supervises, by name."""
        ...

    def launch(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        """Start `args` as process `name`, logged and stopped with the cluster."""
        ...

    def binary(self, name: str) -> str:
        """The path of the pinned binary `name`."""
        ...

    def kube(self, kubeconfig: Path | None = None) -> Kube:
        """The admin client, or a client for `kubeconfig`."""
        ...

    def user_kubeconfig(
        self, user: str, groups: Sequence[str] = (), name: str | None = None
    ) -> Path:
        """A kubeconfig authenticating as `user` (a client certificate) in `groups`."""
        ...

    def serving_pair(self, common_name: str, names: Sequence[str]) -> pem.KeyPair:
        """A serving certificate for `names`, issued by the cluster's CA."""
        ...

    def write_state(self) -> None:
        """Record the processes running now, for `hack/cluster stop`."""
        ...
