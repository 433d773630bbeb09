"""`gpupack-crds`: apply gpupack's CustomResourceDefinitions (the chart's pre-upgrade hook).

Helm installs the CRDs in a chart's `crds/` directory on the first install and never
again: an upgrade that brings a new field (a GPUPolicy `updateMode`, a status the
recommender writes) would leave the old schema in place, and the API server would
prune the new fields silently. The chart therefore runs this before every upgrade: it
server-side applies each CRD file it is given (field manager `gpupack-crds`, taking over
fields another manager set), so the schema always matches the release. It never
deletes a CRD: removing one would delete every GPUPolicy and GPURecommendation.

Exit status: 0 applied (or unchanged); 1 the API server refused or was unreachable (the
message names the CRD); 2 bad arguments, a file that is not a CRD, or no kubeconfig.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from gpupack.runtime import config
from gpupack.runtime.api import ApiError, retry
from gpupack.runtime.args import conventions
from gpupack.runtime.transport import Transport, connect

APPLY = "application/apply-patch+yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FIELD_MANAGER = "gpupack-crds"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack-crds",
        description="Server-side apply gpupack's CustomResourceDefinitions from YAML files "
        "(the chart runs it before every upgrade: Helm itself never upgrades CRDs).",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="CRD YAML files or directories")
    parser.add_argument("--kubeconfig", metavar="PATH", help=f"order: {config.ORDER}")
    return conventions(parser)


def load(paths: Sequence[str]) -> list[dict[str, object]]:
    """Every CRD in the files (directories: their *.yaml, sorted). ValueError naming the
    file for anything that is not a CustomResourceDefinition."""
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        files += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    crds = []
    for file in files:
        for doc in yaml.safe_load_all(file.read_text()):
            if doc is None:
                continue
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                raise ValueError(f"{file}: not a CustomResourceDefinition")
            crds.append(doc)
    if not crds:
        raise ValueError(f"no CustomResourceDefinition in {', '.join(paths)}")
    return crds


def apply(kube: Transport, name: str, crd: dict[str, object]) -> None:
    """Server-side apply one CRD as gpupack-crds, retried on transient failures."""
    path = f"{CRDS}/{name}?fieldManager={FIELD_MANAGER}&force=true"
    body = json.loads(json.dumps(crd))  # JSON is YAML: the apply patch's body
    retry(lambda: kube.patch(path, body, APPLY))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        crds = load(args.paths)
        kube = connect(args.kubeconfig, user_agent=FIELD_MANAGER, request_timeout=30)
    except (OSError, ValueError) as exc:  # config.ConfigError is a ValueError
        print(f"gpupack-crds: {exc}", file=sys.stderr)
        return 2
    try:
        for crd in crds:
            name = str(crd["metadata"]["name"])  # type: ignore[index]
            try:
                apply(kube, name, crd)
            except ApiError as exc:
                print(
                    f"gpupack-crds: applying CustomResourceDefinition {name}: {exc}",
                    file=sys.stderr,
                )
                return 1
            print(f"CustomResourceDefinition {name}: applied")
    finally:
        kube.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
