"""Render the manifests of one stage from the files under its path.

Invariant: a path that yields no manifest is an error, never an empty set, so an
emptied or mistyped path can never be read as "prune everything".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import yaml

from stageset.kube.types import KubeObject

_MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::=([^}]*))?\}")


class BuildError(ValueError):
    """The stage's source cannot be turned into manifests; the message says where and why."""


def substitute(text: str, variables: Mapping[str, str], *, origin: str) -> str:
    """Replace ``${var}`` and ``${var:=default}``; an unset variable without default is an error."""

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in variables:
            return variables[name]
        if default is not None:
            return default
        raise BuildError(f"{origin}: variable ${{{name}}} is not set and has no default")

    return _VARIABLE.sub(replace, text)


def _documents(path: str, content: bytes) -> list[KubeObject]:
    text = content.decode("utf-8")
    try:
        if path.endswith(".json"):
            loaded = json.loads(text)
            documents = loaded if isinstance(loaded, list) else [loaded]
        else:
            documents = list(yaml.safe_load_all(text))
    except (yaml.YAMLError, json.JSONDecodeError) as error:
        raise BuildError(f"{path}: not valid YAML/JSON: {error}") from error
    objects: list[KubeObject] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise BuildError(f"{path}: document {index + 1} is not a mapping")
        if document.get("kind", "").endswith("List") and isinstance(document.get("items"), list):
            objects.extend(item for item in document["items"] if isinstance(item, dict))
            continue
        for field in ("apiVersion", "kind"):
            if not document.get(field):
                raise BuildError(f"{path}: document {index + 1} has no {field}")
        if not document.get("metadata", {}).get("name"):
            raise BuildError(f"{path}: document {index + 1} ({document['kind']}) has no metadata.name")
        objects.append(document)
    return objects


def render_manifests(
    files: Mapping[str, bytes], *, variables: Mapping[str, str] | None = None, origin: str = "."
) -> list[KubeObject]:
    """All objects in every ``.yaml``/``.yml``/``.json`` file of ``files``, in sorted path order."""
    objects: list[KubeObject] = []
    for path in sorted(files):
        if not path.endswith(_MANIFEST_SUFFIXES):
            continue
        content = files[path]
        if variables is not None:
            content = substitute(content.decode("utf-8"), variables, origin=path).encode()
        objects.extend(_documents(path, content))
    if not objects:
        raise BuildError(f"path {origin!r} holds no manifests (.yaml, .yml or .json files)")
    return objects
