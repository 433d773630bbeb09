"""`gpupack-exporter`'s command line: help, and clear errors with exit code 2."""

from pathlib import Path

import pytest

from exporter.cli import build_parser, main
from gpupack.runtime.shell import EXIT_USAGE

pytestmark = pytest.mark.usefixtures("restore_logging")


def test_help_names_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in ("--node-name", "--port", "--interval", "--pod-resources-socket", "--proc"):
        assert option in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param([], "no node name", id="no-node"),
        pytest.param(["--node-name=n", "--interval=0"], "--interval", id="zero-interval"),
        pytest.param(
            ["--node-name=n", "--min-window=90"], "--min-window must not exceed", id="windows"
        ),
    ],
)
def test_bad_arguments_exit_2_naming_what_was_wrong(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own checks exit; ours return the code
        code = int(exit_.code or 0)
    assert code == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_an_unreadable_kubeconfig_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    assert main(["--node-name=n", f"--kubeconfig={missing}"]) == EXIT_USAGE
    assert f"kubeconfig {missing}" in capsys.readouterr().err


def test_the_node_name_defaults_to_the_downward_api_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    assert build_parser().parse_args([]).node_name == "gpu-7"
