"""Bounded YAML and JSON reading: limits are enforced while parsing, never after.

Why a pre-check: libyaml's composer (``CSafeLoader``) recurses in C once per nesting
level, so ~50,000 nested ``[`` in a 100 KB file overflow the C stack and kill the whole
process (a segfault no ``try`` can catch); and it composes a whole document before any
check could run, so a 4 MiB flow sequence costs ~900 MiB before being refused.  Here
libyaml's *parser* runs first and yields one event at a time (no recursion, constant
memory); depth, node, alias and document counts are checked on every event — nodes as
they would be with every alias expanded, each anchor remembering the size of its node —
and only a document stream that passed is composed, by the same C code, now known to be
shallow and small.  (The composed graph's expansion is measured once more, as a second
line of defence.)

JSON is scanned the same way before ``json.loads``: strings are skipped by a linear
regular expression, brackets and separators are counted (nodes) and nesting measured.

Both charge a per-stage :class:`StageBudget` (bytes, nodes, objects) so that many small
files cannot add up to what one big file may not be.

YAML is read as Kubernetes reads it: timestamps stay strings.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, cast

import yaml
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    NodeEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)

from stageset.build.errors import BuildError
from stageset.build.limits import BuildLimits

try:
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover - PyYAML without libyaml
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]


class Loader(_BaseLoader):
    """Safe YAML, with timestamps kept as strings."""


def _timestamp_as_text(loader: Loader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)


@dataclass
class StageBudget:
    """What one stage's build has used so far; every charge checks its limit at once."""

    limits: BuildLimits
    bytes: int = 0
    nodes: int = 0
    objects: int = 0

    def charge_bytes(self, size: int, where: str, *, per_file: bool = True) -> None:
        if per_file and size > self.limits.max_file_bytes:
            raise BuildError(f"{where}: {size} bytes is more than the limit of "
                             f"{self.limits.max_file_bytes} bytes per file")
        self.bytes += size
        if self.bytes > self.limits.max_stage_bytes:
            raise BuildError(f"{where}: the stage's manifests add up to more than "
                             f"{self.limits.max_stage_bytes} bytes")

    def nodes_left(self) -> int:
        return self.limits.max_stage_nodes - self.nodes

    def charge_nodes(self, count: int, where: str) -> None:
        self.nodes += count
        if self.nodes > self.limits.max_stage_nodes:
            raise BuildError(f"{where}: the stage's manifests hold more than "
                             f"{self.limits.max_stage_nodes} YAML/JSON nodes")

    def charge_objects(self, count: int, where: str) -> None:
        self.objects += count
        if self.objects > self.limits.max_stage_objects:
            raise BuildError(f"{where}: the stage renders more than {self.limits.max_stage_objects} objects")


# --------------------------------------------------------------------------- YAML


# Complexity above the limit (15) on purpose: one walk of the YAML event stream; each branch is one event
# kind's limit.
def _precheck_yaml(  # noqa: C901
        text: str, where: str, limits: BuildLimits, budget: StageBudget | None, *,
        syntax_errors: bool = True) -> None:
    """Walk the event stream once; refuse at the first event past a limit.

    Nodes are counted as they would be with every alias expanded: each anchor remembers how
    many nodes its node stands for, and an alias adds that many, so a "billion laughs" is
    refused after a few hundred events without ever being composed.  ``budget`` None checks
    the per-file limits only; ``syntax_errors`` False leaves invalid YAML to whoever reads it.
    """
    depth = nodes = document_nodes = expanded = aliases = documents = 0
    anchors: dict[str, int] = {}
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, expanded count before the node)
    nodes_left = budget.nodes_left() if budget is not None else limits.max_stage_nodes
    max_depth, max_document_nodes = limits.max_depth, limits.max_document_nodes
    loader = Loader(text)
    try:
        while True:
            event = loader.get_event()
            if event is None:
                break
            kind = type(event)
            if kind is ScalarEvent:
                nodes += 1
                document_nodes += 1
                expanded += 1
                anchor = cast(NodeEvent, event).anchor
                if anchor is not None:
                    anchors[anchor] = 1
            elif kind is MappingStartEvent or kind is SequenceStartEvent:
                nodes += 1
                document_nodes += 1
                open_nodes.append((cast(NodeEvent, event).anchor, expanded))
                expanded += 1
                depth += 1
                if depth > max_depth:
                    raise BuildError(f"{where}: document {documents} is nested more than "
                                     f"{max_depth} levels deep")
            elif kind is MappingEndEvent or kind is SequenceEndEvent:
                depth -= 1
                anchor, before = open_nodes.pop()
                if anchor is not None:
                    anchors[anchor] = expanded - before
                continue
            elif kind is AliasEvent:
                nodes += 1
                document_nodes += 1
                expanded += anchors.get(cast(AliasEvent, event).anchor or "", 1)
                aliases += 1
                if aliases > limits.max_aliases:
                    raise BuildError(f"{where}: more than {limits.max_aliases} YAML aliases")
            elif kind is DocumentStartEvent:
                documents += 1
                document_nodes = expanded = 0
                anchors.clear()
                if documents > limits.max_documents_per_file:
                    raise BuildError(f"{where}: more than {limits.max_documents_per_file} YAML documents")
                continue
            else:
                continue
            if expanded > max_document_nodes:
                if document_nodes > max_document_nodes:
                    raise BuildError(f"{where}: document {documents} has more than {max_document_nodes} "
                                     "YAML nodes")
                raise BuildError(f"{where}: document {documents} expands to more than "
                                 f"{max_document_nodes} YAML nodes through aliases; refusing it")
            if nodes > nodes_left and budget is not None:
                budget.charge_nodes(nodes, where)
    except yaml.YAMLError as error:
        if syntax_errors:
            raise BuildError(f"{where}: not valid YAML: {error}") from None
        return
    finally:
        loader.dispose()
    if budget is not None:
        budget.charge_nodes(nodes, where)


def precheck(text: str, *, where: str, limits: BuildLimits) -> None:
    """The per-file limits of :func:`load_yaml` on a file that another program will parse
    (kustomize's inputs); YAML it cannot parse is left for that program to report."""
    _precheck_yaml(text, where, limits, None, syntax_errors=False)


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


def load_yaml(text: str, *, where: str, limits: BuildLimits, budget: StageBudget
              ) -> list[tuple[yaml.Node, Any]]:
    """Every document of ``text`` as ``(node, value)``; empty documents are left out.

    Raises :class:`BuildError` naming ``where`` for invalid YAML and for any limit.
    """
    _precheck_yaml(text, where, limits, budget)
    loader = Loader(text)
    documents: list[tuple[yaml.Node, Any]] = []
    index = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            index += 1
            if node is None:  # pragma: no cover - check_node said there is one
                break
            if _expanded_size(node) > limits.max_document_nodes:
                raise BuildError(f"{where}: document {index} expands to more than "
                                 f"{limits.max_document_nodes} YAML nodes through aliases; refusing it")
            documents.append((node, loader.construct_document(node)))
    except yaml.YAMLError as error:
        raise BuildError(f"{where}: not valid YAML: {error}") from None
    finally:
        loader.dispose()
    return documents


def construct(node: yaml.Node) -> Any:
    """The value of an already composed (and checked) node."""
    loader = Loader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


# --------------------------------------------------------------------------- JSON

# One token per string or structural character.  A string token always matches: up to its
# closing quote, or to the end of the text when it has none (json.loads reports that), so the
# scan is one linear pass whatever the input.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\Z)|[\[\]{},:]', re.DOTALL)


def _precheck_json(text: str, where: str, limits: BuildLimits, budget: StageBudget) -> None:
    """Count values and nesting token by token, stopping at the first limit (no copies of ``text``)."""
    max_nodes, max_depth, nodes_left = limits.max_document_nodes, limits.max_depth, budget.nodes_left()
    # Valid JSON has at most three tokens per value (a key, a ':' and a ','): more tokens than
    # that cannot be within the node limit, whatever they are.
    max_tokens = 3 * max_nodes + 3
    nodes, depth = 1, 0
    for tokens, match in enumerate(_JSON_TOKEN.finditer(text), start=1):
        char = text[match.start()]
        if char == "[" or char == "{":
            nodes += 1
            depth += 1
            if depth > max_depth:
                raise BuildError(f"{where}: nested more than {max_depth} levels deep")
        elif char == "]" or char == "}":
            depth -= 1
        elif char == "," or char == ":":
            nodes += 1
        if nodes > max_nodes or tokens > max_tokens:
            raise BuildError(f"{where}: more than {max_nodes} JSON values")
        if nodes > nodes_left:
            budget.charge_nodes(nodes, where)  # raises: the stage's budget is spent
    budget.charge_nodes(nodes, where)


def load_json(text: str, *, where: str, limits: BuildLimits, budget: StageBudget) -> Any:
    """``json.loads`` of ``text`` after the depth and size pre-check."""
    _precheck_json(text, where, limits, budget)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise BuildError(f"{where}: not valid JSON: {error}") from None
    except RecursionError:  # pragma: no cover - the pre-check bounds the depth first
        raise BuildError(f"{where}: nested too deeply") from None
