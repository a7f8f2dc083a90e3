"""Kustomize overlays, built by a real ``kustomize`` binary, offline and confined to the stage path.

Locating the binary (:func:`locate_kustomize`, used at runtime by the controller):

1. ``$STAGESET_KUSTOMIZE`` naming an executable file (an error if it does not);
2. the binary this project builds, ``<cache>/tools/kustomize-<version>/kustomize`` where
   ``<cache>`` is ``$STAGESET_CACHE_DIR`` or ``${XDG_CACHE_HOME:-~/.cache}/stageset``;
3. a ``kustomize`` on ``PATH``.

Building it (:func:`ensure_kustomize`, used by tests, ``hack/test.sh`` and
``python -m stageset.build``): the checked-in wrapper module in
``hack/kustomize`` (go.mod + go.sum + tools.go) requires
``sigs.k8s.io/kustomize/kustomize/v5`` at :data:`KUSTOMIZE_VERSION`; ``go build
-mod=readonly`` builds the command from the Go module proxy into the cache, once, under
a file lock.  ``--update`` regenerates go.mod/go.sum after a version bump.

Running it (:func:`kustomize_build`) safely:

* the stage's files (only the stage path's subtree, as read from Git) are written into a
  fresh private temporary directory; nothing else of the controller's filesystem is
  visible through them;
* every kustomization file in the tree is checked first (:func:`check_kustomizations`):
  remote resources (``https://``, ``github.com/...``, ``git@...``, ``file://`` ...) and
  paths that leave the stage path (``../base`` above the path, absolute paths) are
  refused with an error naming the file and entry, and so are Helm charts.  The files
  are only the stage path's subtree, so a base *above* the path (``resources: [../../base]``
  from ``path: ./overlays/prod``) cannot be loaded: point the stage ``path`` at a directory
  holding both the base and the overlay, with a root ``kustomization.yaml`` that lists
  the overlay, or vendor the base into the path;
* ``kustomize build <dir> --load-restrictor LoadRestrictionsRootOnly`` without
  ``--enable-alpha-plugins``, ``--enable-exec`` or ``--enable-helm``, so exec and
  container KRM functions and Helm are refused by kustomize itself;
* the environment is built from scratch: ``HOME``, ``XDG_*`` and ``TMPDIR`` point into
  the temporary directory, ``PATH`` is an empty directory (no ``git`` to clone with, no
  ``helm``, no shell), and every ``*_PROXY`` variable names a closed local port, so even
  an HTTP fetch that slipped past the check cannot leave the machine;
* a timeout; a failure becomes :class:`~stageset.build.errors.BuildError` carrying
  kustomize's own message, trimmed, with the temporary directory removed from paths.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from stageset.build.errors import BuildError

KUSTOMIZE_VERSION = "v5.8.2"
"""Pinned ``sigs.k8s.io/kustomize/kustomize/v5``.  (v5.8.3 needs Go >= 1.27.)"""
KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5"
ENV_OVERRIDE = "STAGESET_KUSTOMIZE"
WRAPPER = Path(__file__).resolve().parents[2] / "hack" / "kustomize"
"""The checked-in wrapper module; only present in a checkout (the build is a dev/CI step)."""

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
DEFAULT_TIMEOUT = 60.0
_MAX_MESSAGE = 2000
_TREE = "tree"
# Nothing listens on port 0: a connection to it is refused at once, without DNS or a timeout.
_NO_PROXY_ROUTE = "http://127.0.0.1:0"


class KustomizeNotFoundError(BuildError):
    """No usable kustomize binary: a deployment problem, not a problem of the stage's files."""


# --------------------------------------------------------------------------- locating


def cache_root() -> Path:
    """``$STAGESET_CACHE_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/stageset``; shared with envtest."""
    configured = os.environ.get("STAGESET_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stageset"


def cached_binary() -> Path:
    """Where :func:`ensure_kustomize` puts the binary it builds."""
    return cache_root() / "tools" / f"kustomize-{KUSTOMIZE_VERSION}" / "kustomize"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def locate_kustomize() -> Path:
    """The kustomize binary to run: the ``STAGESET_KUSTOMIZE`` override, the cached build, or PATH."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        if _executable(Path(override)):
            return Path(override)
        raise KustomizeNotFoundError(f"{ENV_OVERRIDE}={override} is not an executable file")
    cached = cached_binary()
    if _executable(cached):
        return cached
    found = shutil.which("kustomize")
    if found:
        return Path(found)
    raise KustomizeNotFoundError(
        f"no kustomize binary: set {ENV_OVERRIDE}, put kustomize on PATH, "
        "or build it with `python -m stageset.build`"
    )


# --------------------------------------------------------------------------- building


class GoError(RuntimeError):
    pass


def _go(args: list[str], *, cwd: Path, extra_env: Mapping[str, str] | None = None) -> str:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.pop("GOFLAGS", None)
    env.update(extra_env or {})
    result = subprocess.run(["go", *args], cwd=cwd, env=env, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise GoError(f"go {' '.join(args)} failed in {cwd}:\n{result.stderr[-4000:]}")
    return result.stdout


_CHECKSUM_FAILURE = re.compile(r"verifying ([\w.\-/]+)@|sum\.golang\.org|checksum database")


def _build_into(target: Path, *, log: bool) -> None:
    args = ["build", "-mod=readonly", "-trimpath", "-buildvcs=false",
            "-ldflags", f"-s -w -X sigs.k8s.io/kustomize/api/provenance.version={KUSTOMIZE_VERSION}"]
    with tempfile.TemporaryDirectory(prefix="stageset-build-", dir=target.parent) as tmp:
        staged = Path(tmp) / "bin"
        staged.mkdir()
        if log:
            print(f"building kustomize {KUSTOMIZE_VERSION} from the Go module proxy ...",
                  file=sys.stderr, flush=True)
        command = [*args, "-o", str(staged / "kustomize"), KUSTOMIZE_MODULE]
        try:
            _go(command, cwd=WRAPPER)
        except GoError as error:
            # go.sum is checked in, so the checksum database is normally never asked; if a proxy
            # still fails to relay a look-up, retry with verification scoped off for kustomize only.
            if not _CHECKSUM_FAILURE.search(str(error)):
                raise
            _go(command, cwd=WRAPPER, extra_env={"GONOSUMDB": "sigs.k8s.io"})
        # Publish atomically so a half-built directory is never mistaken for a cache hit.
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)


def ensure_kustomize(*, log: bool = True) -> Path:
    """The kustomize binary, building it once into the cache if needed (honours the override)."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        return locate_kustomize()
    binary = cached_binary()
    if _executable(binary):
        return binary
    if shutil.which("go") is None:
        raise RuntimeError("the Go toolchain is needed to build kustomize; install go "
                           f"or set {ENV_OVERRIDE} to a kustomize binary")
    if not (WRAPPER / "go.sum").is_file():
        raise RuntimeError(f"the wrapper module {WRAPPER} is missing; build from a stageset checkout")
    target = binary.parent
    target.parent.mkdir(parents=True, exist_ok=True)
    # One build at a time per cache (parallel test workers).
    with (target.parent / f".kustomize-{KUSTOMIZE_VERSION}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _executable(binary):
            _build_into(target, log=log)
    return binary


def update_wrapper() -> None:
    """Regenerate ``hack/kustomize`` (go.mod, go.sum, tools.go) for :data:`KUSTOMIZE_VERSION`."""
    WRAPPER.mkdir(parents=True, exist_ok=True)
    (WRAPPER / "go.mod").write_text(
        "// Generated by `python -m stageset.build --update`; do not edit.\n"
        "module stageset.local/tools/kustomize\n\ngo 1.24\n\n"
        f"require {KUSTOMIZE_MODULE} {KUSTOMIZE_VERSION}\n"
    )
    (WRAPPER / "tools.go").write_text(
        "//go:build tools\n\n"
        "// Package tools pins the command this module builds, so `go mod tidy` keeps go.sum whole.\n"
        "package tools\n\n"
        f'import _ "{KUSTOMIZE_MODULE}"\n'
    )
    _go(["mod", "tidy"], cwd=WRAPPER)


# --------------------------------------------------------------------------- checking


def has_kustomization(files: Mapping[str, bytes]) -> bool:
    """Whether the root of the stage path holds a kustomization file."""
    return any(name in files for name in KUSTOMIZATION_FILES)


def _kustomization_files(files: Mapping[str, bytes]) -> list[str]:
    return sorted(path for path in files if posixpath.basename(path) in KUSTOMIZATION_FILES)


# Forms kustomize treats as remote (api/internal/git/repospec.go and loader.IsRemoteFile):
# an optional `git::`, then a URL scheme, an scp-like `user@`, or a bare `github.com/`.
_REMOTE = re.compile(r"^(?:git::)?(?:[a-z][a-z0-9+.\-]*://|[a-z][a-z0-9-]*@|github\.com[/:])", re.IGNORECASE)
_URL_ANYWHERE = re.compile(r"^\s*(?:git::)?[a-z][a-z0-9+.\-]*://", re.IGNORECASE)
# Free-form content kustomize never loads from: label/annotation values, inline patches.
_FREE_FORM_KEYS = frozenset({"commonLabels", "commonAnnotations", "labels", "metadata", "buildMetadata",
                             "patch", "literals"})


def _entries(document: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(field, path) for every entry of a kustomization that kustomize loads as a file or directory."""

    def strings(field: str, value: Any) -> Iterator[tuple[str, str]]:
        if isinstance(value, str):
            yield field, value
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    yield field, item

    for field in ("resources", "bases", "components", "crds", "configurations"):
        yield from strings(field, document.get(field))
    for field in ("generators", "transformers", "validators", "patchesStrategicMerge"):
        # Entries may also be inline YAML; only one-line entries are paths.
        for name, entry in strings(field, document.get(field)):
            if "\n" not in entry.strip():
                yield name, entry
    for field in ("patches", "patchesJson6902", "replacements"):
        for item in document.get(field) or []:
            if isinstance(item, Mapping) and isinstance(item.get("path"), str):
                yield f"{field}[].path", item["path"]
    openapi = document.get("openapi")
    if isinstance(openapi, Mapping) and isinstance(openapi.get("path"), str):
        yield "openapi.path", openapi["path"]
    for field in ("configMapGenerator", "secretGenerator"):
        for item in document.get(field) or []:
            if not isinstance(item, Mapping):
                continue
            for name, entry in strings(f"{field}[].files", item.get("files")):
                yield name, entry.split("=", 1)[1] if "=" in entry else entry
            yield from strings(f"{field}[].envs", item.get("envs"))
            yield from strings(f"{field}[].env", item.get("env"))


def _urls_anywhere(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Strings that start like a URL anywhere outside free-form fields (fields we do not know yet)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key not in _FREE_FORM_KEYS:
                yield from _urls_anywhere(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for item in value:
            yield from _urls_anywhere(item, where)
    elif isinstance(value, str) and _URL_ANYWHERE.match(value):
        yield where, value


def check_kustomizations(files: Mapping[str, bytes]) -> None:
    """Refuse remote references, paths leaving the tree, and Helm, in every kustomization file.

    All kustomization files in the tree are checked, used or not, so that no path kustomize
    might follow escapes the check.
    """
    for path in _kustomization_files(files):
        try:
            document = yaml.safe_load(files[path].decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            raise BuildError(f"{path}: not valid YAML: {error}") from error
        if document is None:
            continue
        if not isinstance(document, Mapping):
            raise BuildError(f"{path}: a kustomization must be a mapping")
        for field in ("helmCharts", "helmChartInflationGenerator", "helmGlobals"):
            if document.get(field):
                raise BuildError(f"{path}: {field}: Helm charts are not supported in kustomizations")
        directory = posixpath.dirname(path)
        entries = list(_entries(document)) + list(_urls_anywhere(document, ""))
        for field, entry in entries:
            target = entry.strip()
            if not target:
                continue
            if _REMOTE.match(target) or _URL_ANYWHERE.match(target):
                raise BuildError(f"{path}: {field}: remote reference {target!r} is not supported; "
                                 "kustomize runs offline, so whatever it loads must be inside the stage path")
            if target.startswith("/"):
                raise BuildError(f"{path}: {field}: absolute path {target!r} is not allowed")
            resolved = posixpath.normpath(posixpath.join(directory, target))
            if resolved == ".." or resolved.startswith("../"):
                raise BuildError(f"{path}: {field}: {target!r} points outside the stage path; "
                                 "only files under the stage path are available to kustomize")


# --------------------------------------------------------------------------- running


def _write_tree(files: Mapping[str, bytes], root: Path) -> None:
    for relative, content in files.items():
        parts = relative.split("/")
        if (not relative or relative.startswith("/") or "\\" in relative
                or any(part in ("", ".", "..") for part in parts)):
            raise BuildError(f"refusing unsafe file name {relative!r}")
        target = root.joinpath(*parts)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("xb") as handle:
                handle.write(content)
        except OSError as error:
            raise BuildError(f"cannot write {relative!r} for kustomize: {error.strerror}") from error


def _environment(scratch: Path) -> dict[str, str]:
    home = scratch / "home"
    empty_path = scratch / "bin"
    for directory in (home, empty_path):
        directory.mkdir()
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_RUNTIME_DIR": str(home),
        "KUSTOMIZE_PLUGIN_HOME": str(home / "plugins"),
        "TMPDIR": str(home),
        "PATH": str(empty_path),
        "LANG": "C",
        "NO_PROXY": "",
        "no_proxy": "",
    }
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[variable] = _NO_PROXY_ROUTE
    return env


def _trim(message: str, tree: Path) -> str:
    """Kustomize's message, with our temporary directory turned back into paths relative to the tree."""
    text = message.replace(str(tree) + os.sep, "").replace(str(tree), ".")
    text = text.replace(str(tree.parent) + os.sep, "../").replace(str(tree.parent), "..").strip()
    text = re.sub(r"^Error:\s*", "", text)
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    return text or "no message"


def kustomize_build(files: Mapping[str, bytes], *, binary: Path | None = None,
                    timeout: float = DEFAULT_TIMEOUT) -> str:
    """``kustomize build`` of the root kustomization in ``files``; the YAML stream it printed.

    Raises :class:`BuildError` for refused references, kustomize failures and timeouts.
    """
    if not has_kustomization(files):
        raise BuildError("no kustomization.yaml, kustomization.yml or Kustomization at the stage path")
    check_kustomizations(files)
    executable = binary or locate_kustomize()
    with tempfile.TemporaryDirectory(prefix="stageset-kustomize-") as tmp:
        scratch = Path(tmp)
        tree = scratch / _TREE
        tree.mkdir()
        _write_tree(files, tree)
        command = [str(executable), "build", str(tree), "--load-restrictor", "LoadRestrictionsRootOnly"]
        try:
            result = subprocess.run(command, cwd=scratch, env=_environment(scratch), check=False,
                                    stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as error:
            raise BuildError(f"kustomize build timed out after {timeout:g}s") from error
        except OSError as error:
            raise KustomizeNotFoundError(f"cannot run kustomize at {executable}: {error}") from error
        if result.returncode != 0:
            stderr = result.stderr.decode("utf-8", "replace")
            raise BuildError(f"kustomize build failed: {_trim(stderr, tree)}")
        try:
            return result.stdout.decode("utf-8")
        except UnicodeDecodeError as error:
            raise BuildError("kustomize build printed output that is not UTF-8") from error


def main(argv: list[str]) -> int:
    """``python -m stageset.build [--update]``: build kustomize once (or use the override); print its path."""
    if "--update" in argv:
        update_wrapper()
    with contextlib.redirect_stdout(sys.stderr):
        binary = ensure_kustomize()
    print(binary)
    return 0

