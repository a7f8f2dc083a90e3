"""The objects of one stage, from the files of its source root: kustomize or plain files, then substitution.

Entry points: :func:`prepare` (read and check what the build will load: a
:class:`Prepared`, whose :meth:`Prepared.digest` is the render cache key material) and
:func:`render` (build it), or :func:`build_stage` for both at once.  ``files`` is always
the whole source root (relative POSIX path -> bytes) and ``path`` the stage path in it;
what may be loaded from where is :mod:`stageset.build.sourceroot`'s business.

1. **kustomize or plain.**  A stage path holding a kustomization is built by kustomize
   (:mod:`stageset.build.kustomize`).  A path without one is built the way Flux's
   kustomize-controller generates a kustomization for it: subdirectories with their own
   kustomization are built by kustomize, one unit each; every other ``.yaml``, ``.yml`` or
   ``.json`` file below the path is read here, in sorted path order, multi-document, with
   ``kind: *List`` documents expanded into their items.  Files that are not Kubernetes
   manifests are **skipped** — see :func:`_classify` for the exact rule — so CI
   workflows, Helm ``values.yaml``/``Chart.yaml`` or tool configuration beside the
   manifests do not fail the build.  Objects annotated
   ``config.kubernetes.io/local-config: "true"`` are left out, as kustomize leaves them out.
2. **Bounds.**  Everything is parsed under :class:`~stageset.build.limits.BuildLimits`
   (:mod:`stageset.build.parse`): depth, nodes, aliases, documents, bytes and objects.
3. **Patches** (the stage's ``patches``, when it has any): applied to the built objects —
   plain files and kustomize output alike — in order, by kustomize itself
   (:func:`~stageset.build.kustomize.kustomize_patch`), after the build and before
   substitution, as Flux applies ``spec.patches``.  A failure names the patch
   (``patches[1]: ...``).  Scalar styles survive the round trip, so a quoted ``"${PORT}"`` is
   still a string when it is substituted.
4. **Substitution** (only when ``variables`` is given, i.e. the stage has ``postBuild``),
   applied to the rendered objects as Flux does after ``kustomize build``: ``${var}``,
   ``${var:=default}``, ``$${var}`` escapes (:mod:`stageset.build.variables`).  It works
   on YAML scalars, not on raw text: an unquoted scalar is typed again after expansion
   (``replicas: ${REPLICAS}`` becomes the integer ``3``) while a quoted one stays a
   string (``port: "${PORT}"`` stays ``"8080"``), exactly what re-reading the substituted
   text would give; but a value can never inject YAML structure (a newline or ``: `` in
   a Secret value stays inside its string).  An object annotated or labelled
   ``stages.metio.wtf/substitute: disabled`` (or Flux's
   ``kustomize.toolkit.fluxcd.io/substitute: disabled``) is left as it is.

Invariants: a path that yields no object is an error, never an empty set, so an emptied or
mistyped path can never be read as "prune everything"; two documents of one stage naming
the same object are an error naming both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.resolver import Resolver

from stageset.build.errors import BuildError
from stageset.build.kustomize import kustomize_build, kustomize_patch
from stageset.build.limits import BuildLimits
from stageset.build.parse import StageBudget, construct, load_json, load_yaml, precheck
from stageset.build.sopsfiles import encrypted_files
from stageset.build.sourceroot import KUSTOMIZATION_FILES, MANIFEST_SUFFIXES, Plan, SourceTree, plan_build
from stageset.build.variables import has_expansion, substitute
from stageset.kube.types import KubeObject

SUBSTITUTE_OPT_OUT = ("stages.metio.wtf/substitute", "kustomize.toolkit.fluxcd.io/substitute")
"""Annotation or label keys; the value ``disabled`` turns substitution off for that object."""
LOCAL_CONFIG = "config.kubernetes.io/local-config"
"""kustomize's annotation for objects that configure the build and are never applied."""
_STR = "tag:yaml.org,2002:str"
_RESOLVER = Resolver()


@dataclass(frozen=True)
class _Manifest:
    where: str
    """File and document (``deploy/app.yaml: document 2``) or ``kustomize build: document 5``."""
    value: KubeObject
    node: yaml.Node | None
    """The YAML node the object was read from, kept only when it will be substituted;
    ``None`` for JSON, whose strings stay strings."""


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


def _local_config(value: KubeObject) -> bool:
    metadata = value.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return isinstance(annotations, dict) and str(annotations.get(LOCAL_CONFIG, "false")).lower() != "false"


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
            checked = _check(item_where, item)
            if not _local_config(checked):
                yield _Manifest(item_where, checked, item_node)
        return
    checked = _check(where, value)
    if not _local_config(checked):
        yield _Manifest(where, checked, node)


def _looks_like_object(value: Any) -> bool:
    """A document that means to be a Kubernetes object: a mapping with ``kind`` or ``metadata``."""
    return isinstance(value, dict) and ("kind" in value or "metadata" in value)


def _classify(name: str, documents: list[tuple[yaml.Node | None, Any]]) -> bool:
    """Whether a plain file holds Kubernetes manifests (True) or is some other YAML/JSON (False).

    The rule: a file is a manifest file when any of its documents is a mapping with a
    ``kind`` or a ``metadata`` field.  Such a file must then consist of complete objects
    only (``apiVersion``, ``kind``, ``metadata.name``; empty documents are fine), and a
    document that is incomplete is an error naming it — a mistyped ``kind:`` must never
    make an object silently disappear (and be pruned).  A file none of whose documents
    looks like an object (a CI workflow, Helm ``values.yaml`` or ``Chart.yaml``, a
    ``docker-compose.yml``) is skipped.
    """
    if not any(_looks_like_object(value) for _, value in documents):
        return False
    for index, (_, value) in enumerate(documents):
        if value is not None and not _looks_like_object(value):
            raise BuildError(f"{name}: document {index + 1} is not a Kubernetes object (no kind or "
                             "metadata) but other documents of the file are")
    return True


def _read_plain(name: str, content: bytes, *, limits: BuildLimits, budget: StageBudget,
                keep_nodes: bool) -> list[_Manifest]:
    budget.charge_bytes(len(content), name)
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise BuildError(f"{name}: not UTF-8 text") from None
    documents: list[tuple[yaml.Node | None, Any]]
    if name.endswith(".json"):
        loaded = load_json(text, where=name, limits=limits, budget=budget)
        documents = [(None, document) for document in (loaded if isinstance(loaded, list) else [loaded])]
    else:
        documents = list(load_yaml(text, where=name, limits=limits, budget=budget))
    if not _classify(name, documents):
        return []
    manifests: list[_Manifest] = []
    for index, (node, document) in enumerate(documents):
        manifests.extend(_objects(f"{name}: document {index + 1}", document, node if keep_nodes else None))
    budget.charge_objects(len(manifests), name)
    return manifests


def _read_kustomize_output(text: str, *, limits: BuildLimits, budget: StageBudget, keep_nodes: bool,
                           where: str = "kustomize build output", label: str = "kustomize build"
                           ) -> list[_Manifest]:
    """The objects of a kustomize output stream, charged to ``budget`` (bytes, then objects)."""
    budget.charge_bytes(len(text.encode()), where, per_file=False)
    manifests: list[_Manifest] = []
    for index, (node, document) in enumerate(load_yaml(text, where=where, limits=limits, budget=budget)):
        manifests.extend(_objects(f"{label}: document {index + 1}", document,
                                  node if keep_nodes else None))
    budget.charge_objects(len(manifests), where)
    return manifests


_Path = tuple[str | int, ...]


def _quoted_expansions(root: yaml.Node) -> set[_Path]:
    """Where ``root`` holds a quoted scalar with a ``${...}``: kustomize drops quotes it does not need,
    and substitution types an unquoted scalar by its value, so these are quoted again after the
    patches (a quoted ``"${PORT}"`` must stay a string)."""
    found: set[_Path] = set()
    pending: list[tuple[yaml.Node, _Path]] = [(root, ())]
    seen: set[int] = set()
    while pending:
        node, path = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if node.style in ("'", '"') and has_expansion(node.value):
                found.add(path)
        elif isinstance(node, yaml.SequenceNode):
            pending.extend((item, (*path, index)) for index, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            pending.extend((item, (*path, str(key.value))) for key, item in node.value
                           if isinstance(key, yaml.ScalarNode))
    return found


def _requote(root: yaml.Node, paths: set[_Path]) -> None:
    for path in paths:
        node: yaml.Node | None = root
        for step in path:
            if isinstance(node, yaml.MappingNode) and isinstance(step, str):
                node = next((item for key, item in node.value
                             if isinstance(key, yaml.ScalarNode) and key.value == step), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
                node = node.value[step]
            else:
                node = None
            if node is None:
                break
        if isinstance(node, yaml.ScalarNode) and not node.style and node.tag == _STR \
                and has_expansion(node.value):
            node.style = '"'


def _identity(value: KubeObject) -> tuple[str, str, str, str]:
    metadata = value.get("metadata") or {}
    return (str(value.get("apiVersion")), str(value.get("kind")), str(metadata.get("namespace") or ""),
            str(metadata.get("name")))


def _apply_patches(manifests: list[_Manifest], patches: Sequence[Mapping[str, Any]], *, limits: BuildLimits,
                   keep_nodes: bool, kustomize: Path | None) -> list[_Manifest]:
    """The manifests with ``patches`` applied by kustomize (see :func:`kustomize_patch`)."""
    documents = [yaml.serialize(manifest.node) if manifest.node is not None
                 else json.dumps(manifest.value) + "\n" for manifest in manifests]
    quoted = {_identity(m.value): paths for m in manifests
              if m.node is not None and (paths := _quoted_expansions(m.node))}
    text = kustomize_patch("---\n".join(documents), patches, limits=limits, binary=kustomize)
    # Bounded afresh: the patched output, not the build before it, is what the stage is made of.
    patched = _read_kustomize_output(text, limits=limits, budget=StageBudget(limits), keep_nodes=keep_nodes,
                                     where="patched objects", label="after patches")
    for manifest in patched:
        requote = quoted.get(_identity(manifest.value))
        if manifest.node is not None and requote:
            _requote(manifest.node, requote)
    if not patched:
        raise BuildError("patches left no object in the stage")
    return patched


def _check_duplicates(manifests: list[_Manifest]) -> None:
    seen: dict[tuple[str, str, str, str], str] = {}
    for manifest in manifests:
        value = manifest.value
        group = str(value["apiVersion"]).rpartition("/")[0]
        metadata = value["metadata"]
        key = (group, str(value["kind"]), str(metadata.get("namespace") or ""), str(metadata["name"]))
        if key in seen:
            raise BuildError(f"{_describe(value)} is defined twice in this stage: {seen[key]} and "
                             f"{manifest.where}")
        seen[key] = manifest.where


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
            result = construct(node)
        except Exception:
            # The reason may quote a substituted value; keep values out of messages.
            raise BuildError(f"{origin}: the object cannot be read after substitution") from None
    return _check(f"{origin} after substitution", result)


# --------------------------------------------------------------------------- entry points


@dataclass(frozen=True)
class Prepared:
    """A stage's build, checked and ready to run: what it reads is known, nothing is built yet."""

    path: str
    tree: SourceTree
    plan: Plan
    limits: BuildLimits
    budget: StageBudget
    decrypted: Mapping[str, bytes] = dataclasses.field(default_factory=dict, repr=False)
    """Files replaced by their decrypted content (:meth:`with_decrypted`); never in the tree itself."""
    withheld: frozenset[str] = frozenset()
    """SOPS files beside a kustomization that nothing names: not given to kustomize."""

    def digest(self) -> str:
        """SHA-256 over every input of the build (paths and contents) and its plan."""
        material = json.dumps(self.plan.digest_material(self.tree), separators=(",", ":"))
        return hashlib.sha256(material.encode()).hexdigest()

    def sops_files(self) -> tuple[dict[str, str], tuple[str, ...]]:
        """``({file: SOPS format}, withheld)``: see :func:`stageset.build.sopsfiles.encrypted_files`."""
        plan = self.plan
        return encrypted_files(self.tree.files, plain=plan.plain, inputs=plan.inputs, named=plan.named,
                               generator_sources=plan.generator_sources, limits=self.limits)

    def with_decrypted(self, files: Mapping[str, bytes], withheld: Sequence[str] = ()) -> Prepared:
        """The same build reading ``files`` (decrypted) instead of the tree's, and without ``withheld``."""
        return dataclasses.replace(self, decrypted=dict(files), withheld=frozenset(withheld))

    def content(self, name: str) -> bytes:
        found = self.decrypted.get(name)
        return self.tree.files[name] if found is None else found


def prepare(files: Mapping[str, bytes], *, path: str = ".", limits: BuildLimits | None = None,
            unreadable: Mapping[str, str] | None = None) -> Prepared:
    """Check the stage at ``path`` of the root ``files`` and find what its build reads.

    Raises :class:`BuildError` for a missing path, refused references (escapes, absolute
    paths, remote bases, Helm, KRM functions), a needed entry in ``unreadable`` (what the
    source left out as unsafe: path -> why) and limits.
    """
    limits = limits or BuildLimits()
    budget = StageBudget(limits)
    tree, plan = plan_build(files, path, limits=limits, budget=budget, unreadable=unreadable)
    prepared = Prepared(path=path, tree=tree, plan=plan, limits=limits, budget=budget)
    _check_sizes(prepared)  # before anything reads the files (SOPS detection, the build)
    return prepared


class _Inputs(Mapping[str, bytes]):
    """The files given to kustomize, each read when it is handed over: a stored artifact's come from
    disk then, one at a time, instead of all at once beside the stream they are copied into."""

    def __init__(self, prepared: Prepared, names: Sequence[str]):
        self._prepared, self._names = prepared, frozenset(names)

    def __getitem__(self, name: str) -> bytes:
        if name not in self._names:
            raise KeyError(name)
        return self._prepared.content(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names))

    def __len__(self) -> int:
        return len(self._names)


def _check_sizes(prepared: Prepared) -> None:
    """Before a byte is read: every plain file, and the files given to kustomize together, within
    the stage's bytes (``max_stage_bytes``) and each file within ``max_file_bytes`` — so a build
    holds at most what the limits allow, however large the tree (sizes come from an artifact's
    index without reading, :meth:`SourceTree.size`)."""
    limits, plan, tree = prepared.limits, prepared.plan, prepared.tree
    given = [name for name in plan.inputs if name not in prepared.withheld] if plan.units else []
    for names, what in ((plan.plain, "the stage's manifest files"), (given, "the files given to kustomize")):
        total = 0
        for name in names:
            size = len(prepared.decrypted[name]) if name in prepared.decrypted else tree.size(name)
            if size > limits.max_file_bytes and (names is plan.plain or name.endswith(MANIFEST_SUFFIXES)
                                                 or posixpath.basename(name) in KUSTOMIZATION_FILES):
                raise BuildError(f"{name}: {size} bytes is more than the limit of "
                                 f"{limits.max_file_bytes} bytes per file")
            total += size
            if total > limits.max_stage_bytes:
                raise BuildError(f"{name}: {what} add up to more than {limits.max_stage_bytes} bytes")


def render(prepared: Prepared, *, variables: Mapping[str, str] | None = None,
           kustomize: Path | None = None, patches: Sequence[Mapping[str, Any]] = ()) -> list[KubeObject]:
    """The objects of a prepared stage: kustomize units and plain files, patches, then substitution.

    ``variables`` is ``None`` when the stage has no ``postBuild`` (nothing is substituted)
    or the result of :func:`~stageset.build.variables.merge_variables`.  ``patches`` are
    kustomize ``Patch`` entries (``{"patch": text, "target": {...}}``).  ``kustomize``
    overrides :func:`~stageset.build.kustomize.locate_builder`.  Never an empty list.
    Raises :class:`BuildError` (:class:`~stageset.build.kustomize.KustomizeNotFoundError`
    when the builder is missing).
    """
    plan, limits, budget, path = prepared.plan, prepared.limits, prepared.budget, prepared.path
    keep_nodes = variables is not None
    manifests: list[_Manifest] = []
    _check_sizes(prepared)
    for name in plan.plain:
        manifests.extend(_read_plain(name, prepared.content(name), limits=limits, budget=budget,
                                     keep_nodes=keep_nodes))
    if plan.units:
        inputs = _Inputs(prepared, [name for name in plan.inputs if name not in prepared.withheld])
        for name, content in inputs.items():
            # kustomize's YAML parser has no depth or expansion limits of ours: check first.
            if name.endswith(MANIFEST_SUFFIXES) or posixpath.basename(name) in KUSTOMIZATION_FILES:
                if len(content) > limits.max_file_bytes:
                    raise BuildError(f"{name}: {len(content)} bytes is more than the limit of "
                                     f"{limits.max_file_bytes} bytes per file")
                precheck(content.decode("utf-8", "replace"), where=name, limits=limits)
        text = kustomize_build(inputs, plan.units, limits=limits, binary=kustomize)
        built = _read_kustomize_output(text, limits=limits, budget=budget, keep_nodes=keep_nodes)
        if not built and not manifests:
            raise BuildError(f"path {path!r}: the kustomization built no objects")
        manifests.extend(built)
    if not manifests:
        raise BuildError(f"path {path!r} holds no manifests (.yaml, .yml or .json files with "
                         "Kubernetes objects)")
    _check_duplicates(manifests)
    if patches:
        manifests = _apply_patches(manifests, patches, limits=limits, keep_nodes=keep_nodes,
                                   kustomize=kustomize)
        _check_duplicates(manifests)
    if variables is None:
        return [manifest.value for manifest in manifests]
    return [_substituted(manifest, variables) for manifest in manifests]


def build_stage(files: Mapping[str, bytes], *, path: str = ".", variables: Mapping[str, str] | None = None,
                kustomize: Path | None = None, limits: BuildLimits | None = None,
                patches: Sequence[Mapping[str, Any]] = ()) -> list[KubeObject]:
    """:func:`prepare` then :func:`render`: the objects of the stage at ``path`` of the root ``files``."""
    return render(prepare(files, path=path, limits=limits), variables=variables, kustomize=kustomize,
                  patches=patches)
