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

Builds run at most ``max_builds`` at once (the controller passes ``--workers``), whatever the
stages of one StageSet run concurrently: each build is a kustomize process with a memory limit of
its own, and the pod's memory limit is sized for one per worker (docs/sizing.md).

**Decrypted renders** (a build that reads SOPS-encrypted files) are never shared: the source
key of a StageSet with ``spec.decryption`` carries its scope (``namespace/name``), and the render
key of a build with SOPS inputs carries that scope and a digest of the keys it was decrypted
with.  Another StageSet, with the same sources and even the same key Secret, decrypts for itself;
one without keys fails.  A hit on a decrypted render re-reads the key Secret first (as the
StageSet's ServiceAccount): a revoked read fails the stage, a rotated key re-decrypts.  The
decrypted values are kept beside the entry (:class:`Seal`) and handed to the StageSet's redactor
on every hit.  Plaintext lives only in this process's memory: never on disk, never in the tree
cache (which holds what Git holds).  Measured (docs/secrets.md): caching a decrypted render
saves the helper run and the build on every pass at the cost of one Secret read.

Variables enter keys only as a digest: values are never kept in keys or logs.  Entries
are shared read-only (the apply engine copies objects before labelling them).  Every map
is bounded, least recently used first out, so memory stays flat however many StageSets
there are: rendered objects to ``max_render_bytes`` (estimated as their JSON length times
:data:`_OBJECT_FACTOR`, what parsed Kubernetes objects cost in CPython; a render larger than
the whole bound is served but not kept), source trees to ``max_tree_bytes``.

Identity: nothing here talks to a cluster.  ``read_tree`` is the caller's read of the
shared Git mirror (the controller's own process; which commits a GitRepository may be
served is decided when it is fetched, with its own credentials).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from stageset.build import BuildLimits, prepare, render
from stageset.build.decrypt import DecryptionKeys, decrypt
from stageset.build.errors import BuildError
from stageset.build.sopsfiles import describe
from stageset.build.sourceroot import KUSTOMIZATION_FILES, normalize_stage_path
from stageset.build.variables import substituted_forms
from stageset.kube.types import KubeObject

MiB = 1024 * 1024


@dataclass(frozen=True)
class SourceRoot:
    """A source root as read for builds: its files, and what was left out as unsafe (path -> why)."""

    files: Mapping[str, bytes]
    unreadable: Mapping[str, str] = field(default_factory=dict)
    on_disk: bool = False
    """``files`` reads each file from disk when asked (a stored artifact): never kept in the tree
    cache, whose bytes it would both cost (a read of every file) and not save."""


def _variables_material(variables: Mapping[str, str] | None) -> list[list[str]] | None:
    # None (no postBuild: nothing substituted) is not {} (postBuild without variables).
    return None if variables is None else [[k, v] for k, v in sorted(variables.items())]


def render_key(*, url: str, tree: str, ignore: str | None, variables: Mapping[str, str] | None,
               patches: Sequence[Mapping[str, Any]] = (), sealed: tuple[str, str] | None = None) -> str:
    """The render cache key: ``tree`` is the digest of the build's inputs (:meth:`Prepared.digest`);
    the stage's ``patches`` are part of it; ``sealed`` is ``(scope, keys digest)`` for a build that
    decrypts SOPS files (its render belongs to that StageSet and those keys only)."""
    material = json.dumps([url, tree, ignore, _variables_material(variables), list(patches),
                           *([list(sealed)] if sealed else [])], separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def source_key(*, url: str, commit: str, ignore: str | None, path: str,
               variables: Mapping[str, str] | None, patches: Sequence[Mapping[str, Any]] = (),
               scope: str | None = None) -> str:
    """What a stage renders from, before anything is read: equal keys render equal objects.
    ``scope`` is the StageSet of a stage that may decrypt (``spec.decryption``)."""
    material = json.dumps(["source", url, commit, ignore, path, _variables_material(variables),
                           list(patches), *([scope] if scope else [])], separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass(frozen=True)
class Seal:
    """What a decrypted render was decrypted with, and the values it decrypted (for the redactor)."""

    keys: str
    """:attr:`DecryptionKeys.digest` of the keys used."""
    values: frozenset[str] = field(repr=False)


class StageDecryption(Protocol):
    """A StageSet's ``spec.decryption`` for one stage's render (see
    :mod:`stageset.controller.render.decryption`)."""

    @property
    def scope(self) -> str:
        """``namespace/name`` of the StageSet: decrypted renders are never served outside it."""
        ...

    def keys(self) -> DecryptionKeys:
        """The key Secret's age and OpenPGP entries, read as the StageSet's ServiceAccount (once)."""
        ...

    def reveal(self, values: frozenset[str]) -> None:
        """Hand decrypted values to the StageSet's redactor before anything can show them."""
        ...


_OBJECT_FACTOR = 7
"""Memory a parsed object costs per byte of its compact JSON (measured: 5000 ConfigMaps of three
short keys take 7.0 MB as dicts and strings, 1.04 MB as JSON; large string values cost less)."""

_FILE_OVERHEAD = 200
"""Bytes a cached file costs beyond its path and content (CPython objects and dict slot)."""


class RenderCache:
    """Objects by render key, render keys by source key, and recently read trees (bounded in bytes)."""

    def __init__(self, *, max_entries: int = 256, max_tree_bytes: int = 32 * MiB,
                 max_render_bytes: int = 64 * MiB, max_builds: int | None = None):
        self._max = max_entries
        self._max_render_bytes = max_render_bytes
        self._entry_bytes: dict[str, int] = {}
        self._render_bytes = 0
        # None: unbounded (the CLI, tests); the controller bounds builds by its worker count.
        self.build_slots = threading.BoundedSemaphore(max_builds) if max_builds else None
        self._entries: OrderedDict[str, list[KubeObject]] = OrderedDict()
        self._seals: dict[str, Seal] = {}
        """Render keys of decrypted renders (evicted with their entry)."""
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
        found = self.get_entry(key)
        return None if found is None else found[0]

    def get_entry(self, key: str) -> tuple[list[KubeObject], Seal | None] | None:
        """The objects of a render key and, read under the same lock, their seal (if decrypted)."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found, self._seals.get(key)

    def put(self, key: str, objects: list[KubeObject], *, built: bool = False,
            seal: Seal | None = None) -> None:
        size = len(orjson.dumps(objects)) * _OBJECT_FACTOR
        with self._lock:
            self.builds += built
            if size > self._max_render_bytes:
                return  # served to this caller, not kept: it would push out every other render
            self._render_bytes += size - self._entry_bytes.get(key, 0)
            self._entry_bytes[key] = size
            self._entries[key] = objects
            self._entries.move_to_end(key)
            if seal is not None:
                self._seals[key] = seal
            while len(self._entries) > self._max or self._render_bytes > self._max_render_bytes:
                dropped, _ = self._entries.popitem(last=False)
                self._seals.pop(dropped, None)
                self._render_bytes -= self._entry_bytes.pop(dropped)

    @property
    def render_bytes(self) -> int:
        """The estimated memory of the rendered objects kept (at most ``max_render_bytes``)."""
        with self._lock:
            return self._render_bytes

    def resolve(self, source: str) -> list[KubeObject] | None:
        """The objects a source key rendered to last time, if still cached."""
        found = self.resolve_entry(source)
        return None if found is None else found[0]

    def resolve_entry(self, source: str) -> tuple[list[KubeObject], Seal | None] | None:
        """The objects a source key rendered to last time and their seal, if still cached."""
        with self._lock:
            key = self._sources.get(source)
            if key is None:
                return None
            self._sources.move_to_end(source)
        return self.get_entry(key)

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
        if files.on_disk:
            return files
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
                 decryption: StageDecryption | None = None,
                 read_path: Callable[[], SourceRoot] | None = None) -> list[KubeObject]:
    """The objects of the stage at ``path`` of ``url`` at ``commit``, built at most once per input.

    ``read_tree`` returns the whole source root at ``commit`` (``MirrorStore.read_tree(url,
    commit=commit, path="./", ignore=ignore, unreadable=...)``); it is called only when the
    source key misses and the stage is not a plain directory that ``read_path`` (the files under
    ``path`` only, keys relative to it) can serve alone (:func:`plain_subtree`).  ``decryption`` is
    the StageSet's ``spec.decryption`` (``None``: a SOPS file fails the build).  Raises what they
    raise (Git errors, the key Secret's read) and :class:`~stageset.build.BuildError`.
    """
    scope = decryption.scope if decryption is not None else None
    source = source_key(url=url, commit=commit, ignore=ignore, path=path, variables=variables,
                        patches=patches, scope=scope)
    hit = cache.resolve_entry(source)
    if hit is not None:
        cached, seal = hit
        if seal is None:
            return cached
        if decryption is not None and decryption.keys().digest == seal.keys:
            decryption.reveal(seal.values)
            return cached
        # The key Secret changed (rotated): decrypt again with what it holds now.
    root = plain_subtree(path, read_path) if read_path is not None else None
    if root is None:
        root = cache.tree((url, commit, ignore), read_tree)
    prepared = prepare(root.files, path=path, limits=limits, unreadable=root.unreadable)
    encrypted, withheld = prepared.sops_files()
    sealed: tuple[str, str] | None = None
    keys: DecryptionKeys | None = None
    if encrypted:
        if decryption is None:
            raise BuildError(f"{describe(encrypted)}: SOPS-encrypted, and this StageSet has no "
                             "spec.decryption: set it to a Secret holding the age or OpenPGP key")
        keys = decryption.keys()
        sealed = (decryption.scope, keys.digest)
    key = render_key(url=url, tree=prepared.digest(), ignore=ignore, variables=variables, patches=patches,
                     sealed=sealed)
    entry = cache.get_entry(key)
    objects, seal = entry if entry is not None else (None, None)
    if seal is not None and decryption is not None:
        decryption.reveal(seal.values)
    if objects is None:
        # The decryption helper and the build are isolated processes with the build's limits: both
        # count against the one-per-worker slots the pod's memory is sized for.
        with cache.build_slots or contextlib.nullcontext():
            if keys is not None and decryption is not None:
                opened = decrypt({name: prepared.tree.files[name] for name in encrypted}, encrypted,
                                 keys=keys, limits=limits)
                # The values as decrypted, and as substitution will change them (``${var}`` in a
                # value): before anything is built with them, since a failing build may quote one.
                values = opened.values | substituted_forms(opened.values, variables)
                decryption.reveal(values)
                prepared = prepared.with_decrypted(opened.files, withheld)
                seal = Seal(keys=keys.digest, values=values)
            elif withheld:
                prepared = prepared.with_decrypted({}, withheld)
            objects = render(prepared, variables=variables, kustomize=kustomize, patches=patches)
        cache.put(key, objects, built=True, seal=seal)
    cache.remember(source, key)
    return objects
