"""Hypothesis strategies driven by the generated CRD schemas in ``crds/``.

:func:`from_schema` walks an OpenAPI v3 (structural) schema: objects with their required and
optional properties, arrays within ``minItems``/``maxItems``, strings matching ``pattern``
within ``minLength``/``maxLength``, enums, integers from ``minimum``, booleans and maps.
Sizes are kept small so examples stay fast.  The CEL rules (``x-kubernetes-validations``)
are not interpreted here: every one of them is repeated as a validator on the pydantic
models (see :mod:`stageset.api.stageset`), so :func:`admitted` filters examples through the
models — what the CRD admits is what the models accept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

CRDS = Path(__file__).resolve().parents[2] / "crds"
MAX_ITEMS = 3


def crd_schema(plural: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / f"stages.metio.wtf_{plural}.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _string(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    low, high = int(schema.get("minLength", 0)), min(int(schema.get("maxLength", 40)), 40)
    if schema.get("format") == "date-time":
        return st.datetimes().map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%SZ"))
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
    return st.text(min_size=low, max_size=max(low, high))


def from_schema(schema: dict[str, Any], *, depth: int = 0) -> st.SearchStrategy[Any]:
    kind = schema.get("type")
    if kind == "object":
        properties: dict[str, Any] = schema.get("properties") or {}
        if not properties and isinstance(schema.get("additionalProperties"), dict):
            values = from_schema(schema["additionalProperties"], depth=depth + 1)
            return st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), values,
                                   max_size=MAX_ITEMS)
        required = set(schema.get("required") or [])
        return st.fixed_dictionaries(
            {name: from_schema(sub, depth=depth + 1) for name, sub in properties.items() if name in required},
            optional={name: from_schema(sub, depth=depth + 1) for name, sub in properties.items()
                      if name not in required})
    if kind == "array":
        low = int(schema.get("minItems", 0))
        high = min(int(schema.get("maxItems", MAX_ITEMS)), max(low, MAX_ITEMS))
        items = from_schema(schema.get("items") or {"type": "string"}, depth=depth + 1)
        return st.lists(items, min_size=low, max_size=high)
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        return st.integers(min_value=int(schema.get("minimum", 0)), max_value=10_000)
    if kind == "boolean":
        return st.booleans()
    return st.none()
