"""What README.md and docs/ name in code spans exists: a path in the repository, a module
or one of its names, a command-line flag, a metric, a chart value. A rename that forgets
the docs fails here, naming the page, the line and the stale name."""

import ast
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
PACKAGES = frozenset(p.parent.name for p in ROOT.glob("*/__init__.py"))
FOLDERS = PACKAGES | {"charts", "cuda-shim", "docs", "examples", ".ci"}
# Flags of other programs that the docs tell users about, by the program that has them.
OTHER_PROGRAMS_FLAGS = {
    "--from": "kubectl create job",
    "--server-side": "kubectl apply",
    "--help": "every command (argparse)",
    "--enable-certificate-owner-ref": "cert-manager",
    "--expendable-pods-priority-cutoff": "cluster-autoscaler",
    "--scale-down-unneeded-time": "cluster-autoscaler",
    "--gpu-memory-utilization": "vLLM",
    "--cuda-memory-fraction": "text-generation-inference",
}
# The chart's values.yaml sections that are not also a package's name.
CHART_SECTIONS = frozenset({"mps", "memoryEnforcement", "image"})
METRIC_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def spans(page: Path) -> Iterator[tuple[int, str]]:
    """(line, word) for each word of each inline code span outside fenced blocks."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m[0].count("\n"), page.read_text(), flags=re.S)
    for match in re.finditer(r"`([^`\n]+)`", text):
        line = text.count("\n", 0, match.start()) + 1
        for word in re.split(r"[\s,()\[\]{}'\"]+", match[1]):
            if word := word.strip(".:;"):
                yield line, word


@functools.cache
def sources() -> str:
    """Every file that can define a flag or a metric: code, scripts, chart templates."""
    found = [
        *(p for p in ROOT.rglob("*.py") if not {".venv", ".cache"} & set(p.parts)),
        *(p for p in (ROOT / "hack").rglob("*") if p.is_file() and p.suffix in {"", ".sh"}),
        *(ROOT / "charts").rglob("*.yaml"),
        *(ROOT / "charts").rglob("*.tpl"),
        ROOT / "Dockerfile",
    ]
    return "\n".join(p.read_text(errors="replace") for p in found if "tests" not in p.parts)


@functools.cache
def chart_values() -> frozenset[str]:
    """Dotted chart values, objects included (`scheduler.kubeScheduler`), and template names."""
    schema = json.loads((ROOT / "charts" / "gpupack" / "values.schema.json").read_text())
    found: set[str] = set()

    def walk(node: dict[str, object], prefix: str) -> None:
        for name, sub in (node.get("properties") or {}).items():  # type: ignore[attr-defined]
            found.add(prefix + name)
            if isinstance(sub, dict):
                walk(sub, f"{prefix}{name}.")

    walk(schema, "")
    templates = (ROOT / "charts" / "gpupack" / "templates").rglob("*")
    for template in templates:
        found.update(re.findall(r'define "([\w.-]+)"', template.read_text()))
    return frozenset(found)


@functools.cache
def module_names(source: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def python_name_exists(dotted: str) -> bool:
    """`package.module`, `package.module.Name` or `package.module.Name.attribute` (the
    class's own names are not checked: the module must define `Name`)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        source = (
            base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        )
        if source.is_file():
            return end == len(parts) or parts[end] in module_names(source)
    return False


def metric_exists(name: str) -> bool:
    # Components build names as PREFIX + "suffix" (gpupack_ + the rest).
    for candidate in {name, *(name.removesuffix(s) for s in METRIC_SUFFIXES)}:
        short = candidate.removeprefix("gpupack_")
        if candidate in sources() or f'"{short}"' in sources() or f'"{short}_' in sources():
            return True
    return False


def problem(word: str) -> str | None:
    """Why `word` names nothing that exists, or None (also for words that name nothing
    this test can check: prose, values, other programs' names)."""
    folder, package = word.split("/", maxsplit=1)[0], word.split(".", maxsplit=1)[0]
    flag = re.fullmatch(r"(--[a-z][\w-]*)(=.*)?", word)
    if word.endswith(".io") or "<" in word:  # an API group, a driver's name; a placeholder
        return None
    if "/" in word and folder in FOLDERS | {"hack", "tests", "benchmarks"}:
        return None if any(ROOT.glob(word.rstrip("/"))) else "no such file or folder"
    if re.fullmatch(r"[a-z][\w-]*(\.\w+)+", word) and package in PACKAGES:
        found = word in chart_values() or python_name_exists(word)
        return None if found else "no such module, name or chart value"
    if re.fullmatch(r"[a-z]\w*(\.\w+)+", word) and package in CHART_SECTIONS:
        return None if word in chart_values() else "no such chart value"
    if flag and flag[1] not in OTHER_PROGRAMS_FLAGS:
        found = re.search(rf"{flag[1]}\b", sources()) is not None
        return None if found else "no program of gpupack takes this flag"
    if re.fullmatch(r"gpupack_[a-z0-9_]+", word):
        return None if metric_exists(word) else "no component exports this metric"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_a_page_gives_in_code_exists(page: Path) -> None:
    stale = [
        f"{page.name}:{line}: `{word}`: {why}"
        for line, word in spans(page)
        if (why := problem(word)) is not None
    ]
    assert stale == []


@pytest.mark.parametrize(
    "word",
    [
        "webhook/no_such_module.py",
        "webhook.no_such_module",
        "webhook.mutate.no_such_function",
        "scheduler.kubeScheduler.noSuchValue",
        "mps.noSuchValue",
        "--no-such-flag",
        "gpupack_no_such_metric_total",
    ],
)
def test_the_check_finds_a_stale_name(word: str) -> None:
    assert problem(word) is not None


@pytest.mark.parametrize(
    "word",
    [
        "webhook/mutate.py",
        "webhook.mutate.decide",
        "scheduler.kubeScheduler.image.tag",
        "mps.kubeletDir",
        "--memory-enforcement",
        "gpupack_pod_gpu_processes",
        "hack/demo",
    ],
)
def test_the_check_accepts_what_exists(word: str) -> None:
    assert problem(word) is None


# -- module docstrings -----------------------------------------------------------------

PRODUCT = sorted(
    p
    for package in PACKAGES - {"tests", "benchmarks", "hack"}
    for p in (ROOT / package).rglob("*.py")
    if not {".venv", ".cache"} & set(p.parts)
)


@functools.cache
def classes() -> dict[str, frozenset[str]]:
    """Every class of the product's code by name, with the names its body defines (those
    of classes of the same name merged)."""
    found: dict[str, set[str]] = {}
    for source in PRODUCT:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ClassDef):
                names = found.setdefault(node.name, set())
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        names.add(item.name)
                        names.update(_set_on_self(item))
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return {name: frozenset(members) for name, members in found.items()}


def _set_on_self(method: ast.AST) -> Iterator[str]:
    """The attributes a method sets on `self` (`self.x = ...`, `self.x: T = ...`)."""
    for node in ast.walk(method):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for one in target.elts if isinstance(target, ast.Tuple) else [target]:
                if not isinstance(one, ast.Attribute):
                    continue
                if isinstance(one.value, ast.Name) and one.value.id == "self":
                    yield one.attr


def docstring_problem(word: str) -> str | None:
    """`problem`, and for `Class.member` of a class of the product's code: the member
    must be the class's (a method, a field, a class attribute, an attribute a method
    sets on `self`)."""
    why = problem(word)
    if why is not None:
        return why
    match = re.fullmatch(r"([A-Z]\w*)\.([a-z_]\w*)", word)
    if match and match[1] in classes():
        members = classes()[match[1]]
        if match[2] not in members:
            return f"{match[1]} has no {match[2]}"
    return None


def module_docstring_spans(source: Path) -> Iterator[tuple[int, str]]:
    docstring = ast.get_docstring(ast.parse(source.read_text()), clean=False) or ""
    for match in re.finditer(r"`([^`\n]+)`", docstring):
        line = docstring.count("\n", 0, match.start()) + 2
        for word in re.split(r"[\s,()\[\]{}'\"]+", match[1]):
            if word := word.strip(".:;"):
                yield line, word


@pytest.mark.parametrize("source", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_a_module_docstring_gives_in_code_exists(source: Path) -> None:
    """A module's docstring says what it owns and what it works with; a name it gives
    that no longer exists is a statement the code no longer backs."""
    stale = [
        f"{source.relative_to(ROOT)}:{line}: `{word}`: {why}"
        for line, word in module_docstring_spans(source)
        if (why := docstring_problem(word)) is not None
    ]
    assert stale == []


@pytest.mark.parametrize("word", ["Ledger.no_such_method", "scheduler.no_such_module"])
def test_the_docstring_check_finds_a_stale_name(word: str) -> None:
    assert docstring_problem(word) is not None


@pytest.mark.parametrize("word", ["Ledger.assume", "Lifecycle.requirements", "Gpu.over"])
def test_the_docstring_check_accepts_what_exists(word: str) -> None:
    assert docstring_problem(word) is None
