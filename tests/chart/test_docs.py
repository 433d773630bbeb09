"""docs/install.md's values table and values.schema.json list the same values."""

import json
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def leaves(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of the schema's values; an object without properties is one value."""
    found: set[str] = set()
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        if sub.get("type") == "object" and "properties" in sub:
            found |= leaves(sub, f"{path}.")
        else:
            found.add(path)
    return found


def documented() -> set[str]:
    table = (REPO / "docs" / "install.md").read_text().split("## Values", 1)[1].split("##", 1)[0]
    return set(re.findall(r"^\| `([a-zA-Z.]+)` \|", table, flags=re.MULTILINE))


def test_every_value_is_documented_and_every_documented_value_exists() -> None:
    schema = json.loads((REPO / "charts" / "gpupack" / "values.schema.json").read_text())
    assert documented() == leaves(schema)
