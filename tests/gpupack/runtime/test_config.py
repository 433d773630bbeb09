"""Where every binary finds its cluster: --kubeconfig, $KUBECONFIG, in-cluster,
~/.kube/config, in that order; a named file that does not load is an error naming it."""

from pathlib import Path

import pytest

from gpupack.runtime import config
from tests.apistub import TOKEN, write_kubeconfig

IN_CLUSTER = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@pytest.fixture
def account(tmp_path: Path) -> Path:
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text(TOKEN)
    (directory / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return directory


@pytest.fixture
def home(tmp_path: Path) -> Path:
    directory = tmp_path / "home"
    (directory / ".kube").mkdir(parents=True)
    write_kubeconfig(directory / ".kube" / "config", "http://home.invalid:1")
    return directory


def host_of(loaded: config.Loaded | None) -> str:
    assert loaded is not None
    return str(loaded.configuration.host)


def test_an_explicit_kubeconfig_wins_over_everything(
    tmp_path: Path, account: Path, home: Path
) -> None:
    path = write_kubeconfig(tmp_path / "explicit", "http://explicit.invalid:1")
    environ = {
        **IN_CLUSTER,
        "KUBECONFIG": str(write_kubeconfig(tmp_path / "env", "http://env.invalid:1")),
    }

    loaded = config.load(str(path), environ=environ, home=home, service_account=account)

    assert host_of(loaded) == "http://explicit.invalid:1"
    assert loaded is not None
    assert loaded.source == f"kubeconfig {path}"


def test_kubeconfig_from_the_environment_comes_before_in_cluster_and_home(
    tmp_path: Path, account: Path, home: Path
) -> None:
    environ = {
        **IN_CLUSTER,
        "KUBECONFIG": str(write_kubeconfig(tmp_path / "env", "http://env.invalid:1")),
    }

    loaded = config.load(None, environ=environ, home=home, service_account=account)

    assert host_of(loaded) == "http://env.invalid:1"


def test_in_cluster_comes_before_the_home_kubeconfig(account: Path, home: Path) -> None:
    loaded = config.load(None, environ=IN_CLUSTER, home=home, service_account=account)

    assert host_of(loaded) == "https://10.0.0.1:443"
    assert loaded is not None
    assert loaded.source == "in-cluster service account"


def test_the_home_kubeconfig_is_the_last_resort(home: Path) -> None:
    assert host_of(config.load(None, environ={}, home=home)) == "http://home.invalid:1"


def test_nothing_named_means_no_cluster(tmp_path: Path) -> None:
    assert config.load(None, environ={}, home=tmp_path) is None
    with pytest.raises(config.ConfigError, match="no cluster to talk to: pass --kubeconfig"):
        config.require(None)


@pytest.mark.parametrize(
    ("explicit", "environ_name"),
    [
        pytest.param(True, "", id="explicit-flag"),
        pytest.param(False, "KUBECONFIG", id="environment"),
    ],
)
def test_a_named_kubeconfig_that_is_missing_is_an_error_naming_it(
    tmp_path: Path, home: Path, explicit: bool, environ_name: str
) -> None:
    missing = str(tmp_path / "missing")
    environ = {environ_name: missing} if environ_name else {}

    with pytest.raises(config.ConfigError, match=f"kubeconfig {missing} .*no such file"):
        config.load(missing if explicit else None, environ=environ, home=home)


def test_a_named_kubeconfig_that_does_not_parse_is_an_error_naming_it(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n")

    with pytest.raises(config.ConfigError, match=f"kubeconfig {broken}: "):
        config.load(str(broken), environ={}, home=tmp_path)


def test_in_cluster_without_a_token_is_an_error_naming_the_account(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="in-cluster service account"):
        config.load(None, environ=IN_CLUSTER, home=tmp_path, service_account=tmp_path / "none")


def test_a_kubeconfig_list_loads_when_one_of_its_files_exists(tmp_path: Path) -> None:
    present = write_kubeconfig(tmp_path / "present", "http://present.invalid:1")
    environ = {"KUBECONFIG": f"{tmp_path / 'absent'}:{present}"}

    assert host_of(config.load(None, environ=environ, home=tmp_path)) == "http://present.invalid:1"
