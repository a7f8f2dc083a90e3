"""Render the manifests of one stage from the files under its path, then substitute variables.

:func:`build_stage` is the entry point:

1. **kustomize or plain.**  If the root of the path holds ``kustomization.yaml``,
   ``kustomization.yml`` or ``Kustomization``, the overlay is built by a real kustomize
   (:mod:`stageset.build.kustomize`: offline, no plugins, loads confined to the path).
   Otherwise every ``.yaml``/``.yml``/``.json`` file is read, recursively, in sorted path
   order, multi-document, with ``kind: *List`` documents expanded into their items.  A
   kustomization file *below* the root is an error in plain mode (it would otherwise be
   silently misread as a manifest).
2. **substitution** (only when ``variables`` is given, i.e. the stage has ``postBuild``),
   applied to the rendered objects as Flux does after ``kustomize build``: ``${var}``,
   ``${var:=default}``, ``$${var}`` escapes (:mod:`stageset.build.variables`).  It works
   on YAML scalars, not on raw text: an unquoted scalar is typed again after expansion
   (``replicas: ${REPLICAS}`` becomes the integer ``3``) while a quoted one stays a
   string (``port: "${PORT}"`` stays ``"8080"``), exactly what re-reading the substituted
   text would give; but a value can never inject YAML structure (a newline or ``: `` in
   a Secret value stays inside its string).  An object annotated or labelled
   ``stages.metio.wtf/substitute: disabled`` (or Flux's
   ``kustomize.toolkit.fluxcd.io/substitute: disabled``) is left as it is.

Invariant: a path that yields no object is an error, never an empty set, so an emptied or
mistyped path can never be read as "prune everything".

YAML is read as Kubernetes reads it: timestamps stay strings (PyYAML would make them
``datetime``, which cannot be sent to the apiserver).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.resolver import Resolver

from stageset.build.errors import BuildError
from stageset.build.kustomize import DEFAULT_TIMEOUT, KUSTOMIZATION_FILES, has_kustomization, kustomize_build
from stageset.build.variables import has_expansion, substitute
from stageset.kube.types import KubeObject

try:
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover - PyYAML without libyaml
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]

_MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
SUBSTITUTE_OPT_OUT = ("stages.metio.wtf/substitute", "kustomize.toolkit.fluxcd.io/substitute")
"""Annotation or label keys; the value ``disabled`` turns substitution off for that object."""
_STR = "tag:yaml.org,2002:str"
_RESOLVER = Resolver()


class _Loader(_BaseLoader):
    """Safe YAML, with timestamps kept as strings."""


def _timestamp_as_text(loader: _Loader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)


@dataclass(frozen=True)
class _Manifest:
    where: str
    """File and document (``deploy/app.yaml: document 2``) or ``kustomize build: document 5``."""
    value: KubeObject
    node: yaml.Node | None
    """The YAML node the object was read from; ``None`` for JSON, whose strings stay strings."""


# A document may not expand (through YAML aliases) to more nodes than this: aliases are
# shared while parsing, but every later step (hashing, JSON for the apiserver) expands them,
# so a "billion laughs" file would otherwise exhaust the controller's memory.
MAX_EXPANDED_NODES = 200_000


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes ``root`` stands for with every alias expanded (linear in distinct nodes)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            sizes[id(node)] = 1
            continue
        if children_done:
            sizes[id(node)] = 1 + sum(sizes.get(id(child), 1) for child in children)
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def _compose(text: str, where: str) -> list[tuple[yaml.Node, Any]]:
    loader = _Loader(text)
    documents: list[tuple[yaml.Node, Any]] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # pragma: no cover - check_node said there is one
                break
            if _expanded_size(node) > MAX_EXPANDED_NODES:
                raise BuildError(f"{where}: document {len(documents) + 1} expands to more than "
                                 f"{MAX_EXPANDED_NODES} YAML nodes through aliases; refusing it")
            documents.append((node, loader.construct_document(node)))
    except yaml.YAMLError as error:
        raise BuildError(f"{where}: not valid YAML/JSON: {error}") from error
    finally:
        loader.dispose()
    return documents


def _construct(node: yaml.Node) -> Any:
    loader = _Loader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _describe(value: KubeObject) -> str:
    metadata = value.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    namespace, name = metadata.get("namespace"), metadata.get("name")
    return f"{value.get('kind')} {namespace}/{name}" if namespace else f"{value.get('kind')} {name}"


def _check(where: str, value: Any) -> KubeObject:
    if not isinstance(value, dict):
        raise BuildError(f"{where} is not a mapping")
    for field in ("apiVersion", "kind"):
        if not value.get(field) or not isinstance(value[field], str):
            raise BuildError(f"{where} has no {field}")
    metadata = value.get("metadata")
    if not isinstance(metadata, dict) or not metadata.get("name") or not isinstance(metadata["name"], str):
        raise BuildError(f"{where} ({value['kind']}) has no metadata.name")
    return value


def _list_item_nodes(node: yaml.Node | None, count: int) -> list[yaml.Node | None]:
    if isinstance(node, yaml.MappingNode):
        for key, item in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == "items" and \
                    isinstance(item, yaml.SequenceNode) and len(item.value) == count:
                return list(item.value)
    return [None] * count


def _objects(where: str, value: Any, node: yaml.Node | None) -> Iterator[_Manifest]:
    if value is None:
        return
    if not isinstance(value, dict):
        raise BuildError(f"{where} is not a mapping")
    kind, items = value.get("kind"), value.get("items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        item_nodes = _list_item_nodes(node, len(items))
        for index, (item, item_node) in enumerate(zip(items, item_nodes, strict=True)):
            item_where = f"{where}, item {index + 1}"
            yield _Manifest(item_where, _check(item_where, item), item_node)
        return
    yield _Manifest(where, _check(where, value), node)


def _plain(files: Mapping[str, bytes]) -> list[_Manifest]:
    manifests: list[_Manifest] = []
    for path in sorted(files):
        if not path.endswith(_MANIFEST_SUFFIXES):
            continue
        if posixpath.basename(path) in KUSTOMIZATION_FILES:
            raise BuildError(f"{path}: a kustomization below the root of the stage path is not built; "
                             f"set the stage path to {posixpath.dirname(path)!r} or add a "
                             "kustomization.yaml at the root that lists it")
        try:
            text = files[path].decode("utf-8")
        except UnicodeDecodeError as error:
            raise BuildError(f"{path}: not UTF-8 text") from error
        if path.endswith(".json"):
            try:
                loaded = json.loads(text)
            except json.JSONDecodeError as error:
                raise BuildError(f"{path}: not valid YAML/JSON: {error}") from error
            for index, document in enumerate(loaded if isinstance(loaded, list) else [loaded]):
                manifests.extend(_objects(f"{path}: document {index + 1}", document, None))
        else:
            for index, (node, document) in enumerate(_compose(text, path)):
                manifests.extend(_objects(f"{path}: document {index + 1}", document, node))
    return manifests


def _kustomized(files: Mapping[str, bytes], *, binary: Path | None, timeout: float) -> list[_Manifest]:
    text = kustomize_build(files, binary=binary, timeout=timeout)
    manifests: list[_Manifest] = []
    for index, (node, document) in enumerate(_compose(text, "kustomize build output")):
        manifests.extend(_objects(f"kustomize build: document {index + 1}", document, node))
    return manifests


# --------------------------------------------------------------------------- substitution


def _opted_out(value: KubeObject) -> bool:
    metadata = value.get("metadata") or {}
    for field in ("annotations", "labels"):
        marks = metadata.get(field)
        if isinstance(marks, dict) and any(marks.get(key) == "disabled" for key in SUBSTITUTE_OPT_OUT):
            return True
    return False


def _node_has_expansion(root: yaml.Node) -> bool:
    seen: set[int] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if has_expansion(node.value):
                return True
        elif isinstance(node, yaml.SequenceNode):
            pending.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, item in node.value:
                pending.extend((key, item))
    return False


def _substitute_node(node: yaml.Node, variables: Mapping[str, str], origin: str,
                     memo: dict[int, yaml.Node]) -> yaml.Node:
    """A copy of ``node`` with every scalar expanded; shared (aliased) nodes are expanded once."""
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, yaml.ScalarNode):
        if not has_expansion(node.value):
            memo[id(node)] = node
            return node
        value = substitute(node.value, variables, origin=origin)
        tag = node.tag
        if not node.style and tag == _STR:
            # An unquoted scalar is typed by its text, as if the substituted YAML were read again.
            tag = str(_RESOLVER.resolve(yaml.ScalarNode, value, (True, False)))  # type: ignore[no-untyped-call]
        result: yaml.Node = yaml.ScalarNode(tag, value, node.start_mark, node.end_mark, style=node.style)
        memo[id(node)] = result
        return result
    if isinstance(node, yaml.SequenceNode):
        sequence = yaml.SequenceNode(node.tag, [], node.start_mark, node.end_mark, flow_style=node.flow_style)
        memo[id(node)] = sequence
        sequence.value = [_substitute_node(item, variables, origin, memo) for item in node.value]
        return sequence
    if isinstance(node, yaml.MappingNode):
        mapping = yaml.MappingNode(node.tag, [], node.start_mark, node.end_mark, flow_style=node.flow_style)
        memo[id(node)] = mapping
        mapping.value = [(_substitute_node(key, variables, origin, memo),
                          _substitute_node(item, variables, origin, memo)) for key, item in node.value]
        return mapping
    return node  # pragma: no cover - yaml has no other node kinds


def _substitute_value(value: Any, variables: Mapping[str, str], origin: str) -> Any:
    """JSON documents: every string is expanded and stays a string."""
    if isinstance(value, str):
        return substitute(value, variables, origin=origin) if has_expansion(value) else value
    if isinstance(value, list):
        return [_substitute_value(item, variables, origin) for item in value]
    if isinstance(value, dict):
        return {_substitute_value(key, variables, origin): _substitute_value(item, variables, origin)
                for key, item in value.items()}
    return value


def _substituted(manifest: _Manifest, variables: Mapping[str, str]) -> KubeObject:
    if _opted_out(manifest.value):
        return manifest.value
    origin = f"{_describe(manifest.value)} ({manifest.where})"
    if manifest.node is None:
        result = _substitute_value(manifest.value, variables, origin)
    else:
        if not _node_has_expansion(manifest.node):
            return manifest.value
        node = _substitute_node(manifest.node, variables, origin, {})
        try:
            result = _construct(node)
        except Exception:
            # The reason may quote a substituted value; keep values out of messages.
            raise BuildError(f"{origin}: the object cannot be read after substitution") from None
    return _check(f"{origin} after substitution", result)


# --------------------------------------------------------------------------- entry points


def build_stage(files: Mapping[str, bytes], *, path: str = ".", variables: Mapping[str, str] | None = None,
                kustomize: Path | None = None, timeout: float = DEFAULT_TIMEOUT) -> list[KubeObject]:
    """The objects of a stage: kustomize or plain files, then substitution; never an empty list.

    ``files`` is the stage path's subtree (relative POSIX path -> bytes); ``path`` only
    names it in messages.  ``variables`` is ``None`` when the stage has no ``postBuild``
    (nothing is substituted) or the result of
    :func:`~stageset.build.variables.merge_variables`.  ``kustomize`` overrides
    :func:`~stageset.build.kustomize.locate_kustomize`; ``timeout`` bounds the kustomize run.
    Raises :class:`BuildError` (:class:`~stageset.build.kustomize.KustomizeNotFoundError`
    when the binary is missing).
    """
    try:
        if has_kustomization(files):
            manifests = _kustomized(files, binary=kustomize, timeout=timeout)
            if not manifests:
                raise BuildError(f"path {path!r}: the kustomization built no objects")
        else:
            manifests = _plain(files)
            if not manifests:
                raise BuildError(f"path {path!r} holds no manifests (.yaml, .yml or .json files)")
        if variables is None:
            return [manifest.value for manifest in manifests]
        return [_substituted(manifest, variables) for manifest in manifests]
    except RecursionError:
        raise BuildError(f"path {path!r}: a document is nested too deeply") from None


def render_manifests(
    files: Mapping[str, bytes], *, variables: Mapping[str, str] | None = None, origin: str = "."
) -> list[KubeObject]:
    """Kept for callers of the first version: :func:`build_stage` with ``path=origin``."""
    return build_stage(files, path=origin, variables=variables)
