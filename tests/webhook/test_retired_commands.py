"""`gpupack-webhook explain` and `decisions`, retired: each runs its `kubectl gpupack`
counterpart with a deprecation note, so scripts written against them keep working."""

import re
import subprocess
import sys
from pathlib import Path

from tests.ops.test_offline import EXAMPLE, audit_log

BIN = Path(sys.executable).parent


def run(program: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / program), *args], input=stdin, capture_output=True, text=True, check=False
    )


def unsealed(text: str) -> str:
    return re.sub(r'"gpupack.io/seal": "[^"]*"', "SEAL", text)


def test_the_webhooks_explain_prints_what_kubectl_gpupack_explain_prints() -> None:
    ours = run("gpupack-webhook", "explain", "-f", str(EXAMPLE), "-o", "json")
    theirs = run("kubectl-gpupack", "explain", "-f", str(EXAMPLE), "-o", "json")

    assert (ours.returncode, theirs.returncode) == (0, 0)
    assert unsealed(ours.stdout) == unsealed(theirs.stdout)  # a seal is per process and second
    assert '"outcome": "mutated"' in ours.stdout
    assert "deprecated" in ours.stderr
    assert "kubectl gpupack explain" in ours.stderr


def test_the_webhooks_decisions_still_reads_stdin_without_a_file(tmp_path: Path) -> None:
    path = audit_log(tmp_path)
    ours = run(
        "gpupack-webhook", "decisions", "--namespace", "ml", "-o", "json", stdin=path.read_text()
    )
    theirs = run("kubectl-gpupack", "decisions", str(path), "-n", "ml", "-o", "json")

    assert (ours.returncode, theirs.returncode) == (0, 0)
    assert ours.stdout == theirs.stdout
    assert ours.stdout.strip()
    assert "kubectl gpupack decisions" in ours.stderr


def test_a_bad_argument_is_named_by_the_command_that_reads_it() -> None:
    ours = run("gpupack-webhook", "decisions", "-", "--since", "yesterday")

    assert ours.returncode == 2
    assert "expected a duration" in ours.stderr
