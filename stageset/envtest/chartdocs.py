"""Generate the chart's value reference, docs/reference/helm-values.md, from ``values.schema.json``.

``python -m stageset.envtest.chartdocs`` rewrites the block between
``<!-- values:begin -->`` and ``<!-- values:end -->``; ``--check`` exits 1 when the page is
not current (``tests/helm/test_docs.py`` runs the same check).  One row per value: its path,
type (with the enum, pattern or bounds the schema enforces), default and description, so the
page says exactly what ``helm install`` accepts.

Identity: none (reads and writes files of the checkout).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "helm" / "stageset" / "values.schema.json"
PAGE = ROOT / "docs" / "reference" / "helm-values.md"
BEGIN, END = "<!-- values:begin -->\n", "<!-- values:end -->"


def _type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "anyOf" in node:
        return " or ".join(_type(option) for option in node["anyOf"])
    kind = str(node.get("type", "any"))
    if kind == "array":
        items = node.get("items", {})
        text = f"list of {_type(items)}"
        if node.get("uniqueItems"):
            text += ", unique"
        return text
    if kind == "object" and "properties" not in node:
        values = node.get("additionalProperties")
        return f"map of {_type(values)}" if isinstance(values, dict) else "object"
    details = []
    if "pattern" in node:
        details.append(f"matching `{node['pattern']}`")
    if "minimum" in node or "maximum" in node:
        details.append(f"{node.get('minimum', '…')} to {node.get('maximum', '…')}")
    return kind + (f" ({', '.join(details)})" if details else "")


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return ""
    return f"`{json.dumps(node['default'], ensure_ascii=False)}`"


def rows(node: dict[str, Any], path: str = "") -> list[str]:
    found = []
    for key, child in node.get("properties", {}).items():
        here = f"{path}.{key}" if path else key
        if child.get("type") == "object" and "properties" in child:
            found += rows(child, here)
            continue
        description = " ".join(child.get("description", "").split()).replace("|", "\\|")
        kind = _type(child).replace("|", "\\|").replace("\\\\|", "\\|")
        found.append(f"| `{here}` | {kind} | {_default(child)} | {description} |")
    return found


def render(schema: dict[str, Any]) -> str:
    lines = ["| value | type | default | what it does |", "|---|---|---|---|", *rows(schema)]
    return "\n".join(lines) + "\n"


def updated(page: str, schema: dict[str, Any]) -> str:
    start, stop = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + render(schema) + page[stop:]


def main(argv: list[str]) -> int:
    schema = json.loads(SCHEMA.read_text())
    page = PAGE.read_text()
    fresh = updated(page, schema)
    if "--check" in argv:
        if fresh != page:
            print(f"{PAGE.relative_to(ROOT)} is not current: run `make docs`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
