"""Where a gpupack binary finds its cluster: one order, the same for every binary.

1. `--kubeconfig PATH` when given;
2. `$KUBECONFIG` when set (a list of files, as kubectl reads it);
3. the in-cluster service account when `KUBERNETES_SERVICE_HOST` is set (in a pod);
4. `~/.kube/config` when it exists (a developer's machine).

A file that was named (by the flag or by `$KUBECONFIG`) and does not load is a usage
error naming it, never a silent fall-through to another cluster: a typo must not point a
scheduler at the wrong cluster. The in-cluster account comes before `~/.kube/config` so
that a stray file baked into an image cannot redirect a pod. Before this module each
binary had its own order (the webhook preferred `~/.kube/config` and skipped a missing
`$KUBECONFIG`; gpupack-certs tried in-cluster first), and the copies had drifted.

The `kubernetes` package fills a `Configuration` (host, CA, client certificate, proxy,
and a bearer token that is re-read as it rotates); `gpupack.runtime.transport` sends
requests over it. The generated API classes are never used, and the package is
imported only when a configuration is loaded (it is slow to import, and `gpupack-webhook
explain` never needs it).
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
KEPT_CONNECTIONS: Final = 32  # connections to the API server kept alive, at least
ORDER: Final = (
    "--kubeconfig, then $KUBECONFIG, then the in-cluster service account, then ~/.kube/config"
)


class ConfigError(ValueError):
    """No usable cluster configuration; the message names the file or what is missing."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """A loaded configuration and, for logs, where it came from."""

    configuration: Any  # kubernetes.client.Configuration
    source: str  # "kubeconfig /path" or "in-cluster service account"


def _load_file(path: str, configuration: Any) -> None:
    from kubernetes import config as k8s_config  # noqa: PLC0415 (slow; see above)
    from kubernetes.config.config_exception import ConfigException  # noqa: PLC0415

    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration, persist_config=False
        )
    except (ConfigException, OSError, ValueError, TypeError) as error:
        raise ConfigError(f"kubeconfig {path}: {error}") from None


def load(
    kubeconfig: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
    service_account: Path = SERVICE_ACCOUNT,
) -> Loaded | None:
    """The configuration in the documented order, or None when nothing names a cluster.
    Raises ConfigError when the source that applies cannot be loaded."""
    from kubernetes import client as k8s_client  # noqa: PLC0415 (slow; see above)
    from kubernetes.config.config_exception import ConfigException  # noqa: PLC0415
    from kubernetes.config.incluster_config import InClusterConfigLoader  # noqa: PLC0415

    env = os.environ if environ is None else environ
    configuration = k8s_client.Configuration()
    # Kept-alive connections to the API server: the package's default is five per CPU
    # of the host, ten on a two-core node, fewer than a burst's concurrent writes; each
    # one over that was a new TLS handshake ("Connection pool is full, discarding").
    configuration.connection_pool_maxsize = max(
        configuration.connection_pool_maxsize, KEPT_CONNECTIONS
    )
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    named = kubeconfig or (os.pathsep.join(listed) if listed else None)
    if named:
        if not any(Path(p).is_file() for p in named.split(os.pathsep)):
            where = "--kubeconfig" if kubeconfig else "$KUBECONFIG"
            raise ConfigError(f"kubeconfig {named} (from {where}): no such file")
        _load_file(named, configuration)
        return Loaded(configuration, f"kubeconfig {named}")
    if env.get("KUBERNETES_SERVICE_HOST"):
        try:
            InClusterConfigLoader(  # type: ignore[no-untyped-call]
                token_filename=str(service_account / "token"),
                cert_filename=str(service_account / "ca.crt"),
                environ=env,
            ).load_and_set(configuration)
        except ConfigException as error:
            raise ConfigError(f"in-cluster service account ({service_account}): {error}") from None
        return Loaded(configuration, "in-cluster service account")
    default = (home or Path.home()) / ".kube" / "config"
    if default.is_file():
        _load_file(str(default), configuration)
        return Loaded(configuration, f"kubeconfig {default}")
    return None


def require(loaded: Loaded | None) -> Loaded:
    """`loaded`, or a ConfigError saying how to name a cluster."""
    if loaded is None:
        raise ConfigError(
            "no cluster to talk to: pass --kubeconfig, set KUBECONFIG, run in a pod "
            "(KUBERNETES_SERVICE_HOST), or create ~/.kube/config"
        )
    return loaded
