"""What a stage's build may load: the source root, a stage path, and the files kustomize is given.

A stage's ``path`` says where its build **starts**; the build may load any file of the
same source tree (the *source root*: the repository at the GitRepository's revision,
after its ignore rules) and nothing outside it — as Flux and the reference controller
do.  An overlay at ``apps/production`` may therefore use ``../base``, a component in
``../../components/tls``, a patch in ``../../patches/replicas.yaml`` or a
``configMapGenerator`` file anywhere in the tree.

:func:`plan_build` turns ``(files of the root, stage path)`` into a :class:`Plan`:

* **The stage path holds a kustomization** (``kustomization.yaml``, ``kustomization.yml``
  or ``Kustomization``): one kustomize unit, the path itself.
* **It does not**: the path is built as Flux's kustomize-controller *generates* a
  kustomization for it — recursively, a subdirectory holding its own kustomization is one
  kustomize unit (and is not descended into), and every other ``.yaml``, ``.yml`` or
  ``.json`` file is a manifest file read directly (files that are not Kubernetes objects
  are skipped there, see :mod:`stageset.build.render`).

Every kustomization reachable from the units is then read and checked, following
``resources``/``bases``/``components`` directories and generator/transformer
configurations transitively, before kustomize runs:

* remote references (``https://``, ``git@``, ``github.com/...``, ``file://``) are refused;
* absolute paths and paths that climb above the root ("escapes the artifact root") are
  refused, and so are references to files the tree does not hold ("not found in
  artifact"); every message names the kustomization file, the field and the entry;
* Helm (``helmCharts``, ``HelmChartInflationGenerator``) and KRM functions
  (``config.kubernetes.io/function``: exec or container plugins) are refused.

The files kustomize is given (:attr:`Plan.inputs`) are exactly the kustomization files
reached, the plain files of their directories, and every file they name.  kustomize
then runs on an in-memory filesystem holding only those files
(:mod:`stageset.build.kustomize`), so what a build can read is *exactly* what the render
cache key covers (:attr:`Plan.digest_material`), and a change elsewhere in the repository
re-renders nothing.  The checks above give good messages; the in-memory filesystem is
what makes escaping impossible even through a path this module does not know about.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import posixpath
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from stageset.build.errors import BuildError
from stageset.build.limits import BuildLimits
from stageset.build.parse import StageBudget, load_yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

# Forms kustomize treats as remote (its repospec parser and remote-file loader): an optional
# `git::`, then a URL scheme, an scp-like `user@host:`, or a bare `github.com/`.
_REMOTE = re.compile(r"^(?:git::)?(?:[a-z][a-z0-9+.\-]*://|[a-z0-9_.\-]+@[^/]*:|github\.com[/:])",
                     re.IGNORECASE)
_URL_ANYWHERE = re.compile(r"^\s*(?:git::)?[a-z][a-z0-9+.\-]*://", re.IGNORECASE)
# Free-form content kustomize never loads from: label/annotation values, inline patches, literals.
_FREE_FORM_KEYS = frozenset({"commonLabels", "commonAnnotations", "labels", "annotations", "pairs", "options",
                             "metadata", "buildMetadata", "patch", "literals", "images", "replicas", "vars",
                             "nameSuffix", "namePrefix"})
_HELM_FIELDS = ("helmCharts", "helmChartInflationGenerator", "helmGlobals")
_FUNCTION_ANNOTATIONS = ("config.kubernetes.io/function", "config.k8s.io/function")

UNIT, FILE, PLUGIN = "unit", "file", "plugin"
"""How an entry is loaded: a kustomization directory (or a resource file), a plain file, or a
generator/transformer/validator configuration (file, directory, or inline YAML)."""


def normalize_stage_path(path: str) -> str:
    """``"./apps/prod/"`` -> ``"apps/prod"``; ``"./"`` -> ``""``; refuse absolute and ``..`` paths."""
    if path.startswith("/"):
        raise BuildError(f"path {path!r} is absolute; stage paths are relative to the source root")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BuildError(f"path {path!r} escapes the artifact root")
    return "/".join(parts)


def _join(directory: str, entry: str) -> str | None:
    """``entry`` resolved against ``directory`` inside the root; None when it climbs above it."""
    resolved = posixpath.normpath(posixpath.join(directory, entry))
    if resolved == ".":
        return ""
    if resolved == ".." or resolved.startswith("../"):
        return None
    return resolved


@runtime_checkable
class IndexedFiles(Protocol):
    """Files that know each file's size and SHA-256 without reading it (a stored artifact,
    :class:`sources.artifacts.StoredTree`): planning and keying a build then read only the files
    the build loads, and sizes are checked before a byte is read."""

    def size(self, name: str, /) -> int: ...

    def sha256(self, name: str, /) -> str: ...


class SourceTree:
    """The files of a source root (relative POSIX path -> content), with directory look-ups.

    ``files`` may read each file when it is looked up (:class:`IndexedFiles`): nothing here reads
    a file the build does not load, so a build's memory is what it loads, not the tree's size."""

    def __init__(self, files: Mapping[str, bytes], unreadable: Mapping[str, str] | None = None):
        self.files = files
        self._indexed = files if isinstance(files, IndexedFiles) else None
        # Entries the source could not read safely (submodules, links leaving the root): path ->
        # why.  Only a build that would load one of them fails, with that reason.
        self.unreadable = dict(unreadable or {})
        self._sorted = sorted(files)
        self._children: dict[str, list[str]] = defaultdict(list)
        self._dirs: set[str] = {""}
        for name in files:
            parent = posixpath.dirname(name)
            self._children[parent].append(name)
            while parent and parent not in self._dirs:
                self._dirs.add(parent)
                parent = posixpath.dirname(parent)
        for names in self._children.values():
            names.sort()

    def is_file(self, path: str) -> bool:
        return path in self.files

    def size(self, name: str) -> int:
        """Bytes of file ``name`` (from the index when there is one: nothing is read)."""
        return self._indexed.size(name) if self._indexed is not None else len(self.files[name])

    def sha256(self, name: str) -> str:
        """SHA-256 (hex) of file ``name`` (from the index when there is one: nothing is read)."""
        if self._indexed is not None:
            return self._indexed.sha256(name)
        return hashlib.sha256(self.files[name]).hexdigest()

    def is_dir(self, path: str) -> bool:
        return path in self._dirs

    def direct_files(self, directory: str) -> list[str]:
        return self._children.get(directory, [])

    def under(self, directory: str) -> Iterator[str]:
        """Every file below ``directory`` (recursively), in sorted order."""
        if not directory:
            return iter(self._sorted)
        prefix = f"{directory}/"
        start = bisect.bisect_left(self._sorted, prefix)
        return itertools.takewhile(lambda name: name.startswith(prefix), self._sorted[start:])

    def unreadable_at(self, path: str) -> str | None:
        """Why ``path`` (or a directory above it) could not be read, if so."""
        parts = path.split("/") if path else []
        for depth in range(len(parts), 0, -1):
            reason = self.unreadable.get("/".join(parts[:depth]))
            if reason is not None:
                return reason
        return None

    def unreadable_under(self, directory: str) -> list[str]:
        """Unreadable entries at or below ``directory``."""
        prefix = f"{directory}/" if directory else ""
        return sorted(p for p in self.unreadable if p == directory or p.startswith(prefix))

    def kustomization(self, directory: str) -> str | None:
        """The kustomization file of ``directory``, if it has one."""
        for name in KUSTOMIZATION_FILES:
            candidate = f"{directory}/{name}" if directory else name
            if candidate in self.files:
                return candidate
        return None


@dataclass(frozen=True)
class Plan:
    """How one stage is built from the root's files."""

    stage_dir: str
    """The stage path relative to the root (``""`` for the root)."""
    units: tuple[str, ...]
    """Directories built by kustomize, in order."""
    plain: tuple[str, ...]
    """Manifest files read directly (only when the stage path has no kustomization)."""
    inputs: tuple[str, ...]
    """Every file kustomize is given (sorted): nothing else is visible to it."""
    named: frozenset[str] = frozenset()
    """The inputs a kustomization (or a generator's configuration) names, and the kustomizations:
    what kustomize reads for sure (the rest of ``inputs`` are files beside a kustomization)."""
    generator_sources: tuple[tuple[str, str], ...] = ()
    """``(file, role)`` for files a ``secretGenerator``/``configMapGenerator`` reads: role
    ``secret-env`` (its ``envs``), ``secret-file`` (its ``files``) or ``configmap``."""

    def digest_material(self, tree: SourceTree) -> list[Any]:
        """Everything the build's result depends on, for a cache key (contents as SHA-256)."""

        return [self.stage_dir, list(self.units), [[n, tree.sha256(n)] for n in self.plain],
                [[n, tree.sha256(n)] for n in self.inputs]]


# --------------------------------------------------------------------------- kustomization entries


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        yield from (item for item in value if isinstance(item, str))


# Complexity above the limit (15) on purpose: one branch per kustomization field kustomize loads files from.
def _entries(document: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:  # noqa: C901
    """``(field, entry, how)`` for every entry of a kustomization that kustomize loads."""
    for field in ("resources", "bases", "components"):
        for entry in _strings(document.get(field)):
            yield field, entry, UNIT
    for field in ("generators", "transformers", "validators"):
        for entry in _strings(document.get(field)):
            yield field, entry, PLUGIN
    for field in ("crds", "configurations"):
        for entry in _strings(document.get(field)):
            yield field, entry, FILE
    for entry in _strings(document.get("patchesStrategicMerge")):
        if "\n" not in entry.strip():  # otherwise an inline patch
            yield "patchesStrategicMerge", entry, FILE
    for field in ("patches", "patchesJson6902", "replacements"):
        items = document.get(field)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping) and isinstance(item.get("path"), str):
                yield f"{field}[].path", item["path"], FILE
    openapi = document.get("openapi")
    if isinstance(openapi, Mapping) and isinstance(openapi.get("path"), str):
        yield "openapi.path", openapi["path"], FILE
    for field in ("configMapGenerator", "secretGenerator"):
        items = document.get(field)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping):
                yield from _kv_sources(f"{field}[]", item)


def _kv_sources(field: str, item: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    for entry in _strings(item.get("files")):
        yield f"{field}.files", entry.split("=", 1)[1] if "=" in entry else entry, FILE
    for entry in _strings(item.get("envs")):
        yield f"{field}.envs", entry, FILE
    for entry in _strings(item.get("env")):
        yield f"{field}.env", entry, FILE


def _plugin_entries(config: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """Files a builtin generator/transformer configuration names (paths relative to its kustomization)."""
    kind = config.get("kind")
    if kind in ("ConfigMapGenerator", "SecretGenerator"):
        yield from _kv_sources(str(kind), config)
    for field in ("path", "targetFilePath"):
        if isinstance(config.get(field), str):
            yield f"{kind}.{field}", config[field], FILE
    for entry in _strings(config.get("paths")):
        yield f"{kind}.paths", entry, FILE
    replacements = config.get("replacements")
    for item in replacements if isinstance(replacements, list) else []:
        if isinstance(item, Mapping) and isinstance(item.get("path"), str):
            yield f"{kind}.replacements[].path", item["path"], FILE


def _generator_role(field: str) -> str | None:
    """What a generator does with a file it names (``field`` as :func:`_kv_sources` names it)."""
    lowered = field.lower()
    if lowered.startswith("configmapgenerator"):
        return "configmap"
    if lowered.startswith("secretgenerator"):
        return "secret-env" if lowered.endswith((".envs", ".env")) else "secret-file"
    return None


def _urls_anywhere(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Strings that start like a URL outside free-form fields (fields this module does not know)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key not in _FREE_FORM_KEYS:
                yield from _urls_anywhere(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for item in value:
            yield from _urls_anywhere(item, where)
    elif isinstance(value, str) and _URL_ANYWHERE.match(value):
        yield where, value


# --------------------------------------------------------------------------- the closure


class _Closure:
    """Walks kustomizations from the units; collects the files kustomize may read."""

    def __init__(self, tree: SourceTree, limits: BuildLimits, budget: StageBudget):
        self.tree = tree
        self.limits = limits
        self.budget = budget
        self.inputs: set[str] = set()
        self.named: set[str] = set()
        self.roles: set[tuple[str, str]] = set()
        self.visited: set[str] = set()
        # Directories listed under generators/transformers/validators -> the directory of the
        # kustomization that listed them: the configurations such a directory builds name
        # files relative to that outer kustomization, as kustomize loads them.
        self.plugin_dirs: dict[str, str] = {}

    def _load(self, name: str) -> list[Any]:
        self.budget.charge_bytes(self.tree.size(name), name)  # before a byte is read
        content = self.tree.files[name]
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError:
            raise BuildError(f"{name}: not UTF-8 text") from None
        return [value for _, value in load_yaml(text, where=name, limits=self.limits, budget=self.budget)]

    def directory(self, directory: str, *, referrer: str) -> None:
        """A kustomization directory: its kustomization, its own files, and what it names."""
        if directory in self.visited:
            return
        self.visited.add(directory)
        kustomization = self.tree.kustomization(directory)
        if kustomization is None:
            shown = directory or "."
            raise BuildError(f"{referrer}: directory {shown!r} has no kustomization.yaml, "
                             "kustomization.yml or Kustomization")
        # kustomize reads only what a kustomization names, but files beside it are what a
        # reference most often means (and cost little); subdirectories come in when named.
        self.inputs.update(self.tree.direct_files(directory))
        self.named.add(kustomization)
        documents = self._load(kustomization)
        if not documents:
            return
        document = documents[0]
        if len(documents) > 1 or not isinstance(document, Mapping):
            raise BuildError(f"{kustomization}: a kustomization must be one YAML mapping")
        if isinstance(document.get("sops"), Mapping):
            raise BuildError(f"{kustomization}: a kustomization cannot be SOPS-encrypted; encrypt the "
                             "files it names instead")
        for field in _HELM_FIELDS:
            if document.get(field):
                raise BuildError(f"{kustomization}: {field}: Helm charts are not supported in "
                                 "kustomizations")
        for where, value in _urls_anywhere(document, ""):
            raise BuildError(f"{kustomization}: {where}: remote reference {value.strip()!r} is not "
                             "supported; builds load only files of the source")
        for field in ("generators", "transformers", "validators"):
            for entry in _strings(document.get(field)):
                if "\n" in entry.strip():
                    self._inline_plugin(kustomization, field, entry)
        for field, entry, how in _entries(document):
            self.entry(kustomization, directory, field, entry, how)

    def _inline_plugin(self, kustomization: str, field: str, text: str) -> None:
        where = f"{kustomization}: {field} (inline)"
        self.budget.charge_bytes(len(text.encode()), where)
        for _, config in load_yaml(text, where=where, limits=self.limits, budget=self.budget):
            self._plugin_config(where, posixpath.dirname(kustomization), config)

    def _plugin_config(self, where: str, directory: str, config: Any, *, lenient: bool = False) -> None:
        if not isinstance(config, Mapping):
            return
        kind = config.get("kind")
        metadata = config.get("metadata")
        annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
        if isinstance(annotations, Mapping) and any(key in annotations for key in _FUNCTION_ANNOTATIONS):
            raise BuildError(f"{where}: {kind}: exec and container KRM functions are not supported")
        if kind == "HelmChartInflationGenerator":
            raise BuildError(f"{where}: HelmChartInflationGenerator: Helm charts are not supported in "
                             "kustomizations")
        for field, entry, how in _plugin_entries(config):
            self.entry(where, directory, field, entry, how, lenient=lenient)

    # Complexity above the limit (15) on purpose: one branch per kind of reference kustomize accepts (remote,
    # absolute, outside the root, file, directory).
    def entry(self, referrer: str, directory: str, field: str, entry: str, how: str, *,  # noqa: C901
              lenient: bool = False) -> None:
        """Check one reference and collect what it loads; ``lenient`` skips targets not found
        (names in configurations that a generator directory may still rewrite)."""
        target = entry.strip()
        if not target:
            return
        if _REMOTE.match(target) or _URL_ANYWHERE.match(target):
            raise BuildError(f"{referrer}: {field}: remote reference {target!r} is not supported; "
                             "builds load only files of the source (remote bases and URLs are refused)")
        if target.startswith("/"):
            raise BuildError(f"{referrer}: {field}: absolute path {target!r} escapes the artifact root; "
                             "use a path relative to the kustomization")
        resolved = _join(directory, target)
        if resolved is None:
            raise BuildError(f"{referrer}: {field}: {target!r} escapes the artifact root")
        reason = self.tree.unreadable_at(resolved)
        if reason is not None:
            raise BuildError(f"{referrer}: {field}: {target!r} cannot be read: {reason}")
        role = _generator_role(field)
        if self.tree.is_file(resolved):
            self.inputs.add(resolved)
            self.named.add(resolved)
            if role is not None:
                self.roles.add((resolved, role))
            outer = self.plugin_dirs.get(directory)
            if how == PLUGIN or (how == UNIT and outer is not None):
                for config in self._load(resolved):
                    self._plugin_config(resolved, directory if how == PLUGIN else outer or "", config,
                                        lenient=how != PLUGIN)
            return
        if self.tree.is_dir(resolved):
            if how == FILE:
                # A generator's `files: [dir/]` reads the directory's files.
                direct = list(self.tree.direct_files(resolved))
                self.inputs.update(direct)
                self.named.update(direct)
                if role is not None:
                    self.roles.update((name, role) for name in direct)
                return
            if how == PLUGIN:
                self.plugin_dirs.setdefault(resolved, directory)
            elif directory in self.plugin_dirs:
                self.plugin_dirs.setdefault(resolved, self.plugin_dirs[directory])
            self.directory(resolved, referrer=f"{referrer}: {field}: {target!r}")
            return
        if lenient:
            return
        raise BuildError(f"{referrer}: {field}: {target!r} not found in artifact"
                         f"{'' if resolved == target else f' (looked for {resolved!r})'}")


def plan_build(files: Mapping[str, bytes], path: str, *, limits: BuildLimits, budget: StageBudget,
               unreadable: Mapping[str, str] | None = None) -> tuple[SourceTree, Plan]:
    """The plan of the stage at ``path`` in the root ``files``; raises :class:`BuildError`.

    ``unreadable`` names entries of the root the source left out as unsafe (path -> why): the
    stage path itself, anything below a path without a kustomization, and anything a
    kustomization names fail the build with that reason; entries nothing loads are no error.
    """
    tree = SourceTree(files, unreadable)
    stage_dir = normalize_stage_path(path)
    reason = tree.unreadable_at(stage_dir) if stage_dir else None
    if reason is not None:
        raise BuildError(f"path {path!r} cannot be read: {reason}")
    if not tree.is_dir(stage_dir):
        if tree.is_file(stage_dir):
            raise BuildError(f"path {path!r} is a file, not a directory")
        raise BuildError(f"path {path!r} not found in artifact")
    closure = _Closure(tree, limits, budget)
    units: list[str] = []
    plain: list[str] = []
    if tree.kustomization(stage_dir) is not None:
        units.append(stage_dir)
    else:
        # Every file below a path without a kustomization is read: none may be missing.
        for entry in tree.unreadable_under(stage_dir):
            raise BuildError(f"path {path!r}: {tree.unreadable[entry]}")
        inside: str | None = None  # the unit the walk is currently inside of
        prefix_len = len(stage_dir) + 1 if stage_dir else 0
        for name in tree.under(stage_dir):
            if inside is not None and name.startswith(f"{inside}/"):
                continue
            inside = None
            # The shallowest directory between the stage path and the file holding a kustomization.
            parts = name[prefix_len:].split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                candidate = "/".join(filter(None, [stage_dir, *parts[:depth]]))
                if tree.kustomization(candidate) is not None:
                    inside = candidate
                    break
            if inside is not None:
                units.append(inside)
            elif name.endswith(MANIFEST_SUFFIXES):
                plain.append(name)
    for unit in units:
        closure.directory(unit, referrer=f"path {path!r}")
    return tree, Plan(stage_dir=stage_dir, units=tuple(units), plain=tuple(plain),
                      inputs=tuple(sorted(closure.inputs)), named=frozenset(closure.named),
                      generator_sources=tuple(sorted(closure.roles)))
