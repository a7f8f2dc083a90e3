"""Rendered stages, keyed by exactly what their build read, so an unchanged stage is not re-rendered.

:func:`render_stage` is the one call the StageSet reconciler makes to turn a stage into
objects.  It works in two steps, each with its own key:

1. **Source key** — ``(url, commit, ignore, stage path, variables)``.  A commit fixes every
   byte of the tree, so a StageSet reconciled again at the same revision costs no Git read
   and no build at all (the warm no-op path).
   On a miss, a stage whose path holds no kustomization anywhere (a plain directory, built as
   Flux's generator builds it) reads only the files under its path (``read_path``): such a
   build loads nothing else, and in a monorepo of thousands of files reading the whole root
   first cost seconds before the first StageSet could be applied.  Anything else under the
   path (a kustomization, an entry the source left out as unsafe, a read that fails) falls
   back to the whole root, so errors and results are the root read's.
2. **Render key** — ``(url, digest of the build's inputs, variables)``.  On a new commit the
   source root is read once (and shared, through a small byte-bounded tree cache, by every
   stage reading the same commit), :func:`stageset.build.prepare` finds every file the build
   can load — the kustomizations reached, their files, and every file they name, or the
   manifest files of a plain path — and their contents are hashed.  kustomize is only ever
   given those files (an in-memory filesystem), so the key covers everything the build
   could read: a change in a shared base re-renders exactly the stages whose builds load
   it, and a change anywhere else (another team's directory, a README) re-renders nothing.
   Contents, not Git tree ids, are hashed: a symlink inside the tree is read as its
   target's content, which a tree id of the directory holding the link does not cover.

Variables enter keys only as a digest: values are never kept in keys or logs.  Entries
are shared read-only (the apply engine copies objects before labelling them).  Every map
is bounded, least recently used first out, so memory stays flat however many StageSets
there are.

Identity: nothing here talks to a cluster.  ``read_tree`` is the caller's read of the
shared Git mirror (the controller's own process; which commits a GitRepository may be
served is decided when it is fetched, with its own credentials).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stageset.build import BuildLimits, prepare, render
from stageset.build.sourceroot import KUSTOMIZATION_FILES, normalize_stage_path
from stageset.kube.types import KubeObject

MiB = 1024 * 1024


@dataclass(frozen=True)
class SourceRoot:
    """A source root as read for builds: its files, and what was left out as unsafe (path -> why)."""

    files: Mapping[str, bytes]
    unreadable: Mapping[str, str] = field(default_factory=dict)


def _variables_material(variables: Mapping[str, str] | None) -> list[list[str]] | None:
    # None (no postBuild: nothing substituted) is not {} (postBuild without variables).
    return None if variables is None else [[k, v] for k, v in sorted(variables.items())]


def render_key(*, url: str, tree: str, ignore: str | None, variables: Mapping[str, str] | None,
               patches: Sequence[Mapping[str, Any]] = ()) -> str:
    """The render cache key: ``tree`` is the digest of the build's inputs (:meth:`Prepared.digest`);
    the stage's ``patches`` are part of it."""
    material = json.dumps([url, tree, ignore, _variables_material(variables), list(patches)],
                          separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def source_key(*, url: str, commit: str, ignore: str | None, path: str,
               variables: Mapping[str, str] | None, patches: Sequence[Mapping[str, Any]] = ()) -> str:
    """What a stage renders from, before anything is read: equal keys render equal objects."""
    material = json.dumps(["source", url, commit, ignore, path, _variables_material(variables),
                           list(patches)], separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


_FILE_OVERHEAD = 200
"""Bytes a cached file costs beyond its path and content (CPython objects and dict slot)."""


class RenderCache:
    """Objects by render key, render keys by source key, and recently read trees (bounded in bytes)."""

    def __init__(self, *, max_entries: int = 256, max_tree_bytes: int = 32 * MiB):
        self._max = max_entries
        self._entries: OrderedDict[str, list[KubeObject]] = OrderedDict()
        self._sources: OrderedDict[str, str] = OrderedDict()
        self._max_tree_bytes = max_tree_bytes
        self._trees: OrderedDict[tuple[str, str, str | None], tuple[SourceRoot, int]] = OrderedDict()
        self._tree_bytes = 0
        self._lock = threading.Lock()
        # One read per tree at a time: workers that miss the same tree together wait for it.
        self._reading: dict[tuple[str, str, str | None], threading.Lock] = {}
        self.hits = 0
        self.misses = 0
        self.builds = 0
        """Stages actually built (kustomize run or files parsed), for tests and metrics."""
        self.tree_reads = 0

    def get(self, key: str) -> list[KubeObject] | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found

    def put(self, key: str, objects: list[KubeObject], *, built: bool = False) -> None:
        with self._lock:
            self.builds += built
            self._entries[key] = objects
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def resolve(self, source: str) -> list[KubeObject] | None:
        """The objects a source key rendered to last time, if still cached."""
        with self._lock:
            key = self._sources.get(source)
            if key is None:
                return None
            self._sources.move_to_end(source)
        return self.get(key)

    def remember(self, source: str, key: str) -> None:
        with self._lock:
            self._sources[source] = key
            self._sources.move_to_end(source)
            while len(self._sources) > 4 * self._max:
                self._sources.popitem(last=False)

    def tree(self, tree_id: tuple[str, str, str | None], read: Callable[[], SourceRoot]) -> SourceRoot:
        """The files of ``(url, commit, ignore)``: from the cache, or ``read()`` and keep it if it fits.
        Callers missing the same tree at once share one read."""
        with self._lock:
            reading = self._reading.setdefault(tree_id, threading.Lock())
        with reading:
            try:
                return self._tree(tree_id, read)
            finally:
                with self._lock:
                    self._reading.pop(tree_id, None)

    def _tree(self, tree_id: tuple[str, str, str | None], read: Callable[[], SourceRoot]) -> SourceRoot:
        with self._lock:
            found = self._trees.get(tree_id)
            if found is not None:
                self._trees.move_to_end(tree_id)
                return found[0]
        files = read()
        # What the files cost in memory, not only their bytes: in a tree of many small files
        # the path strings, bytes headers and dict slots outweigh the contents.
        size = sum(len(path) + len(content) + _FILE_OVERHEAD for path, content in files.files.items())
        with self._lock:
            self.tree_reads += 1
            if size <= self._max_tree_bytes and tree_id not in self._trees:
                self._trees[tree_id] = (files, size)
                self._tree_bytes += size
                while self._tree_bytes > self._max_tree_bytes:
                    _, (_, dropped) = self._trees.popitem(last=False)
                    self._tree_bytes -= dropped
        return files


def plain_subtree(path: str, read_path: Callable[[], SourceRoot]) -> SourceRoot | None:
    """The files under a stage's ``path`` as the root would hold them (keys from the root), when
    its build can load nothing else: no kustomization anywhere under it and nothing left out as
    unsafe.  ``None`` (read the whole root instead) otherwise, or when the read fails."""
    try:
        stage_dir = normalize_stage_path(path)
        found = read_path()
    except Exception:  # the whole root's read raises the error that counts
        return None
    if found.unreadable or any(name.rsplit("/", 1)[-1] in KUSTOMIZATION_FILES for name in found.files):
        return None
    prefix = f"{stage_dir}/" if stage_dir else ""
    return SourceRoot(files={prefix + name: content for name, content in found.files.items()})


def render_stage(cache: RenderCache, *, url: str, commit: str, ignore: str | None, path: str,
                 variables: Mapping[str, str] | None, read_tree: Callable[[], SourceRoot],
                 limits: BuildLimits, kustomize: Path | None = None,
                 patches: Sequence[Mapping[str, Any]] = (),
                 read_path: Callable[[], SourceRoot] | None = None) -> list[KubeObject]:
    """The objects of the stage at ``path`` of ``url`` at ``commit``, built at most once per input.

    ``read_tree`` returns the whole source root at ``commit`` (``MirrorStore.read_tree(url,
    commit=commit, path="./", ignore=ignore, unreadable=...)``); it is called only when the
    source key misses and the stage is not a plain directory that ``read_path`` (the files under
    ``path`` only, keys relative to it) can serve alone (:func:`plain_subtree`).  Raises what
    they raise (Git errors) and :class:`~stageset.build.BuildError`.
    """
    source = source_key(url=url, commit=commit, ignore=ignore, path=path, variables=variables,
                        patches=patches)
    cached = cache.resolve(source)
    if cached is not None:
        return cached
    root = plain_subtree(path, read_path) if read_path is not None else None
    if root is None:
        root = cache.tree((url, commit, ignore), read_tree)
    prepared = prepare(root.files, path=path, limits=limits, unreadable=root.unreadable)
    key = render_key(url=url, tree=prepared.digest(), ignore=ignore, variables=variables, patches=patches)
    objects = cache.get(key)
    if objects is None:
        objects = render(prepared, variables=variables, kustomize=kustomize, patches=patches)
        cache.put(key, objects, built=True)
    cache.remember(source, key)
    return objects
