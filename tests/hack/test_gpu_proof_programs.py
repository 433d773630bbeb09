"""The GPU proof's programs (`hack/gpu-proof-programs/`) run only on a machine with a GPU:
here, each case names a program that is there and compiles, and each program is used."""

from hack.gpu_proof_cases import CASES, FILES, PROGRAMS


def test_every_case_is_a_program_that_compiles() -> None:
    for name, source in CASES.items():
        compile(source, f"{PROGRAMS / FILES[name]}", "exec")  # SyntaxError names the line


def test_every_program_is_a_case() -> None:
    assert {p.name for p in PROGRAMS.glob("*.py")} == set(FILES.values())
