"""Kustomize builds on a filesystem that holds only the stage's files; the binaries that run them.

Two binaries come from the checked-in wrapper module ``hack/kustomize`` (go.mod + go.sum,
built from the Go module proxy with ``go build -mod=readonly``, cached outside the checkout):

* ``stageset-kustomize`` (``hack/kustomize/cmd/stageset-kustomize``) — what the controller
  runs.  It links kustomize's own build library (``sigs.k8s.io/kustomize/api/krusty``, the
  engine of ``kustomize build``) at :data:`KUSTOMIZE_VERSION`, reads the files it may use as
  a tar stream on stdin into an **in-memory filesystem**, and builds the directories named on
  its command line.  Nothing of the machine's filesystem is visible to the build: no
  ServiceAccount token, no other tenant's files, no mirror.  Loads are not restricted to a
  kustomization's own directory (Flux's ``LoadRestrictionsNone``), because the filesystem
  only holds the source root's files that :mod:`stageset.build.sourceroot` selected.
  Builtin generators and transformers only (no exec, container or Go plugins, no Helm);
  every HTTP request fails inside the program.
* ``kustomize`` — the upstream command at the same version, used by the tests to check
  that our builds equal ``kustomize build --load-restrictor LoadRestrictionsNone``.

Locating the builder (:func:`locate_builder`, at runtime; the SOPS helper of
:mod:`stageset.build.decrypt` is found the same way):

1. ``$STAGESET_KUSTOMIZE_BUILDER`` naming an executable file (an error if it does not);
2. the binary shipped inside the installed package, ``stageset/build/bin/stageset-kustomize``
   (:data:`PACKAGED_BINARIES`): a platform wheel of ``make release`` carries it
   (:mod:`stageset.envtest.wheels`), so ``uv tool install stageset`` needs no Go; it was built
   from the same wrapper module as the package's own code, so it always matches it.  A checkout
   has no such directory (``.gitignore``d, never written there);
3. the binary this project builds, ``<cache>/tools/stageset-kustomize-<version>-<source
   digest>/stageset-kustomize`` where ``<cache>`` is ``$STAGESET_CACHE_DIR`` or
   ``${XDG_CACHE_HOME:-~/.cache}/stageset`` (the digest covers the wrapper module, so an
   edited builder is rebuilt);
4. ``stageset-kustomize`` on ``PATH`` (a container image installs it there).

Building (:func:`ensure_builder`, :func:`ensure_kustomize`; ``python -m stageset.build``
builds both, once, under a file lock).

Running (:func:`kustomize_build`):

* the environment is built from scratch: ``HOME`` does not exist, ``PATH`` is empty (no
  ``git`` to clone remote bases with, no ``helm``, no shell) and every ``*_PROXY``
  variable names a closed local port;
* a time limit (:attr:`~stageset.build.limits.BuildLimits.kustomize_timeout`), a limit
  on the memory it may map (``RLIMIT_DATA``) and ``GOMEMLIMIT``
  (:attr:`~stageset.build.limits.BuildLimits.kustomize_memory_bytes`), and the output is
  read only up to :attr:`~stageset.build.limits.BuildLimits.max_stage_bytes`;
* a failure becomes :class:`~stageset.build.errors.BuildError` carrying kustomize's own
  message, trimmed, with paths relative to the source root.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stageset.build.errors import BuildError
from stageset.build.limits import BuildLimits

KUSTOMIZE_VERSION = "v5.8.2"
"""Pinned ``sigs.k8s.io/kustomize/kustomize/v5`` (library ``api`` v0.21.2).  v5.8.3 needs Go >= 1.27."""
KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5"
BUILDER_PACKAGE = "./cmd/stageset-kustomize"
BUILDER_NAME = "stageset-kustomize"
ENV_OVERRIDE = "STAGESET_KUSTOMIZE"
"""Names an upstream ``kustomize`` binary for the tests (nothing is built)."""
ENV_BUILDER = "STAGESET_KUSTOMIZE_BUILDER"
"""Names the ``stageset-kustomize`` builder the controller runs (nothing is built)."""
WRAPPER = Path(__file__).resolve().parents[2] / "hack" / "kustomize"
"""The checked-in wrapper module; only present in a checkout (the build is a dev/CI step)."""
PACKAGED_BINARIES = Path(__file__).resolve().parent / "bin"
"""Where a platform wheel puts the Go helpers it ships (absent in a checkout and a pure wheel)."""

_MAX_MESSAGE = 2000
_GO_RUNTIME_DATA = 128 * 1024 * 1024
"""Writable memory the Go runtime maps before the build allocates anything (~75 MiB measured)."""
# Nothing listens on port 0: a connection to it is refused at once, without DNS or a timeout.
_NO_PROXY_ROUTE = "http://127.0.0.1:0"


class KustomizeNotFoundError(BuildError):
    """No usable kustomize builder: a deployment problem, not a problem of the stage's files."""


# --------------------------------------------------------------------------- locating


def cache_root() -> Path:
    """``$STAGESET_CACHE_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/stageset``; shared with envtest."""
    configured = os.environ.get("STAGESET_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stageset"


def cached_binary() -> Path:
    """Where :func:`ensure_kustomize` puts the upstream ``kustomize`` it builds."""
    return cache_root() / "tools" / f"kustomize-{KUSTOMIZE_VERSION}" / "kustomize"


@functools.cache
def _builder_sources_digest() -> str:
    """A digest of the wrapper module's files, so an edited builder gets a new cache slot."""
    return sources_digest(WRAPPER)


def cached_builder() -> Path:
    """Where :func:`ensure_builder` puts the ``stageset-kustomize`` it builds."""
    slot = f"{BUILDER_NAME}-{KUSTOMIZE_VERSION}-{_builder_sources_digest()}"
    return cache_root() / "tools" / slot / BUILDER_NAME


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def locate_binary(*, env: str, cached: Path, name: str, error: type[KustomizeNotFoundError]) -> Path:
    """A runtime binary: ``$env`` naming an executable, else the one the installed package ships,
    else the cached build, else ``name`` on PATH."""
    override = os.environ.get(env)
    if override:
        if _executable(Path(override)):
            return Path(override)
        raise error(f"{env}={override} is not an executable file")
    # The package's own copy first: it was built with this very code, the cache may hold another
    # checkout's build, PATH anything at all.
    for candidate in (PACKAGED_BINARIES / name, cached):
        if _executable(candidate):
            return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    raise error(f"no {name} binary: set {env}, put {name} on PATH, "
                "or build it with `python -m stageset.build`")


def locate_kustomize() -> Path:
    """The upstream kustomize binary: the ``STAGESET_KUSTOMIZE`` override, the cached build, or PATH."""
    return locate_binary(env=ENV_OVERRIDE, cached=cached_binary(), name="kustomize",
                         error=KustomizeNotFoundError)


def locate_builder() -> Path:
    """The builder the controller runs: ``STAGESET_KUSTOMIZE_BUILDER``, the cached build, or PATH."""
    return locate_binary(env=ENV_BUILDER, cached=cached_builder(), name=BUILDER_NAME,
                         error=KustomizeNotFoundError)


# --------------------------------------------------------------------------- building


class GoError(RuntimeError):
    pass


def run_go(args: list[str], *, cwd: Path, extra_env: Mapping[str, str] | None = None) -> str:
    """``go args`` in ``cwd`` without cgo or inherited GOFLAGS; its stdout, or :class:`GoError`."""
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.pop("GOFLAGS", None)
    env.update(extra_env or {})
    result = subprocess.run(["go", *args], cwd=cwd, env=env, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise GoError(f"go {' '.join(args)} failed in {cwd}:\n{result.stderr[-4000:]}")
    return result.stdout


CHECKSUM_FAILURE = re.compile(r"verifying ([\w.\-/]+)@|sum\.golang\.org|checksum database")


@dataclass(frozen=True)
class GoBuild:
    """How one runtime binary is built from its checked-in wrapper module."""

    wrapper: Path
    version: str
    ldflags: str
    nosumdb: str
    """``GONOSUMDB`` for the one retry after a checksum-database failure (the module's host)."""
    env_override: str
    goarch: str | None = None
    """Cross-compile for ``linux/<goarch>`` (a release's wheel for another CPU); None: the host."""


KUSTOMIZE_BUILD = GoBuild(wrapper=WRAPPER, version=KUSTOMIZE_VERSION,
                          ldflags=f"-X sigs.k8s.io/kustomize/api/provenance.version={KUSTOMIZE_VERSION}",
                          nosumdb="sigs.k8s.io", env_override=ENV_BUILDER)


def build_into(target: Path, *, packages: Sequence[str], what: str, how: GoBuild, log: bool,
               name: str | None = None) -> None:
    """Build ``packages`` of ``how.wrapper`` into the directory ``target`` (as ``name`` when there is
    one package and a name), published atomically so a half-built directory is never a cache hit."""
    ldflags = f"-s -w {how.ldflags}".strip()
    args = ["build", "-mod=readonly", "-trimpath", "-buildvcs=false", "-ldflags", ldflags]
    with tempfile.TemporaryDirectory(prefix="stageset-build-", dir=target.parent) as tmp:
        staged = Path(tmp) / "bin"
        staged.mkdir()
        if log:
            print(f"building {what} ({how.version}) from the Go module proxy ...", file=sys.stderr,
                  flush=True)
        output = str(staged / name) if name is not None else f"{staged}/"
        command = [*args, "-o", output, *packages]
        # cgo is off (run_go), so another CPU is only GOARCH: the binary is static either way.
        target_env = {"GOOS": "linux", "GOARCH": how.goarch} if how.goarch else {}
        try:
            run_go(command, cwd=how.wrapper, extra_env=target_env)
        except GoError as error:
            # go.sum is checked in, so the checksum database is normally never asked; if a proxy
            # still fails to relay a look-up, retry with verification scoped off for that module only.
            if not CHECKSUM_FAILURE.search(str(error)):
                raise
            run_go(command, cwd=how.wrapper, extra_env={**target_env, "GONOSUMDB": how.nosumdb})
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)


def _ensure(binary: Path, *, package: str, name: str, log: bool, how: GoBuild = KUSTOMIZE_BUILD) -> Path:
    if _executable(binary):
        return binary
    if shutil.which("go") is None:
        override = how.env_override if name != "kustomize" else ENV_OVERRIDE
        raise RuntimeError(f"the Go toolchain is needed to build {name}; install go or set {override}")
    if not (how.wrapper / "go.sum").is_file():
        raise RuntimeError(f"the wrapper module {how.wrapper} is missing; build from a stageset checkout")
    target = binary.parent
    target.parent.mkdir(parents=True, exist_ok=True)
    # One build at a time per cache (parallel test workers).
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _executable(binary):
            build_into(target, packages=[package], what=name, how=how, log=log, name=name)
    return binary


def ensure_go_binary(binary: Path, *, package: str, name: str, how: GoBuild, log: bool = True) -> Path:
    """``binary``, built once from ``how.wrapper``'s ``package`` if it is not there (under a file lock)."""
    return _ensure(binary, package=package, name=name, log=log, how=how)


def sources_digest(wrapper: Path) -> str:
    """A digest of a wrapper module's files, so an edited module gets a new cache slot."""
    digest = hashlib.sha256()
    if wrapper.is_dir():
        for path in sorted(wrapper.rglob("*")):
            if path.is_file() and path.suffix in (".go", ".mod", ".sum"):
                digest.update(str(path.relative_to(wrapper)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def ensure_kustomize(*, log: bool = True) -> Path:
    """The upstream kustomize binary, building it once into the cache if needed (honours the override)."""
    if os.environ.get(ENV_OVERRIDE):
        return locate_kustomize()
    return _ensure(cached_binary(), package=KUSTOMIZE_MODULE, name="kustomize", log=log)


def ensure_builder(*, log: bool = True) -> Path:
    """The ``stageset-kustomize`` builder, built once into the cache if needed (honours the override)."""
    if os.environ.get(ENV_BUILDER):
        return locate_builder()
    return _ensure(cached_builder(), package=BUILDER_PACKAGE, name=BUILDER_NAME, log=log)


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
    # Adds the kustomize library modules cmd/stageset-kustomize imports.
    run_go(["mod", "tidy"], cwd=WRAPPER)


# --------------------------------------------------------------------------- running


def tar_stream(files: Mapping[str, bytes]) -> bytes:
    """``files`` (clean relative names) as an uncompressed tar stream, for a helper's stdin."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(files):
            parts = name.split("/")
            if (not name or name.startswith("/") or "\\" in name
                    or any(part in ("", ".", "..") for part in parts)):
                raise BuildError(f"refusing unsafe file name {name!r}")
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(files[name]))
    return buffer.getvalue()


def _environment(limits: BuildLimits) -> dict[str, str]:
    env = {
        "HOME": "/nonexistent",
        "PATH": "",
        "LANG": "C",
        "NO_PROXY": "",
        "no_proxy": "",
        "GOMEMLIMIT": str(limits.kustomize_memory_bytes),
        "GOTRACEBACK": "none",
    }
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[variable] = _NO_PROXY_ROUTE
    return env


def _trim(message: str) -> str:
    text = re.sub(r"^Error:\s*", "", message.strip())
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    return text or "no message"


class _Capped:
    """Reads a pipe to its end in a thread, keeping at most ``cap`` bytes."""

    def __init__(self, pipe: io.BufferedReader, cap: int, on_overflow: Callable[[], None] = lambda: None):
        self.data = bytearray()
        self.overflow = False
        self._pipe, self._cap, self._on_overflow = pipe, cap, on_overflow
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := self._pipe.read1(65536):
                if len(self.data) + len(chunk) > self._cap:
                    if not self.overflow:
                        self.overflow = True
                        self._on_overflow()
                    continue  # keep draining so the writer never blocks
                self.data += chunk

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


def _feed(pipe: io.BufferedWriter, data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        pipe.write(data)
    with contextlib.suppress(OSError, ValueError):
        pipe.close()


def kustomize_build(files: Mapping[str, bytes], directories: Sequence[str], *, limits: BuildLimits,
                    binary: Path | None = None) -> str:
    """Build each of ``directories`` (relative to the root, ``""`` for the root) from ``files``.

    ``files`` is everything the builds may read (relative path -> content).  Returns the YAML
    stream of all builds in order.  Raises :class:`BuildError` for kustomize failures,
    timeouts, memory and output limits; :class:`KustomizeNotFoundError` when no builder runs.
    """
    arguments = [directory or "." for directory in directories]
    return _run_builder(arguments, files, limits=limits, binary=binary, failed="kustomize build failed: ")


def kustomize_patch(resources: str, patches: Sequence[Mapping[str, object]], *, limits: BuildLimits,
                    binary: Path | None = None) -> str:
    """Apply ``patches`` (kustomize ``Patch`` entries: ``{"patch": text, "target": {...}}``), in
    order, to the objects of the YAML stream ``resources``; returns the patched stream.

    Runs ``stageset-kustomize --patch``: each patch is applied by kustomize itself, so strategic
    merge and JSON 6902 patches and target selectors mean what they mean in a kustomization.
    A failure is a :class:`BuildError` whose message starts with ``patches[<index>]:``."""
    files = {"resources.yaml": resources.encode(), "patches.json": json.dumps(list(patches)).encode()}
    return _run_builder(["--patch"], files, limits=limits, binary=binary, failed="")


def _run_builder(arguments: Sequence[str], files: Mapping[str, bytes], *, limits: BuildLimits,
                 binary: Path | None, failed: str) -> str:
    executable = binary or locate_builder()
    result = run_isolated([str(executable), *arguments], tar_stream(files), limits=limits,
                          what="kustomize build", program=BUILDER_NAME)
    stderr = result.stderr
    if result.returncode != 0:
        if "out of memory" in stderr:
            raise BuildError("kustomize build ran out of memory (limit "
                             f"{limits.kustomize_memory_bytes // (1024 * 1024)} MiB)")
        raise BuildError(f"{failed}{_trim(stderr)}")
    try:
        return result.stdout.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BuildError("kustomize build printed output that is not UTF-8") from error


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: bytes
    stderr: str


def run_isolated(command: Sequence[str], payload: bytes, *, limits: BuildLimits, what: str,
                 program: str) -> Completed:
    """Run one of our Go helpers on ``payload`` (its stdin) under the build limits.

    The environment is built from scratch (no HOME, an empty PATH, proxies that refuse), the
    working directory is ``/``, the time limit is ``kustomize_timeout``, the memory limit
    ``kustomize_memory_bytes`` (``RLIMIT_DATA`` and ``GOMEMLIMIT``), stdout is read up to
    ``max_stage_bytes`` and stderr up to 64 KiB.  Raises :class:`BuildError` (naming ``what``)
    for a timeout, a memory or output limit, or a signal; :class:`KustomizeNotFoundError` when
    the program cannot be started.  Any other exit status is the caller's to read.
    """
    try:
        process = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=_environment(limits), cwd="/",
                                   start_new_session=True)
    except OSError as error:
        raise KustomizeNotFoundError(f"cannot run {program} at {command[0]}: {error}") from error
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    with contextlib.suppress(OSError, ValueError):
        # Before any input arrives, so the work itself runs under the limit.  RLIMIT_DATA
        # counts the writable memory a process maps; RLIMIT_AS would not do: the Go runtime
        # reserves ~1.5 GiB of address space it never touches.
        limit = limits.kustomize_memory_bytes + _GO_RUNTIME_DATA
        resource.prlimit(process.pid, resource.RLIMIT_DATA, (limit, limit))
    with contextlib.suppress(OSError):
        # If the container's memory runs out anyway (builds of several workers at once), the
        # kernel kills a helper, never the shared controller: the build fails, the process stays.
        Path(f"/proc/{process.pid}/oom_score_adj").write_text("1000")
    out = _Capped(process.stdout, limits.max_stage_bytes, process.kill)  # type: ignore[arg-type]
    err = _Capped(process.stderr, 64 * 1024)  # type: ignore[arg-type]
    feeder = threading.Thread(target=_feed, args=(process.stdin, payload), daemon=True)
    feeder.start()
    timed_out = False
    try:
        process.wait(timeout=limits.kustomize_timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        process.kill()
        process.wait()
    finally:
        for pipe_reader in (out, err):
            pipe_reader.join(timeout=5)
        feeder.join(timeout=5)
        for pipe in (process.stdout, process.stderr):
            with contextlib.suppress(OSError):
                pipe.close()
    if timed_out and not out.overflow:
        raise BuildError(f"{what} timed out after {limits.kustomize_timeout:g}s")
    stderr = err.data.decode("utf-8", "replace")
    if out.overflow:  # (checked first: the process was killed for it)
        raise BuildError(f"{what} printed more than {limits.max_stage_bytes} bytes (the limit "
                         "of manifest bytes per stage)")
    if process.returncode == -9 or (process.returncode != 0 and "out of memory" in stderr):
        raise BuildError(f"{what} ran out of memory (limit "
                         f"{limits.kustomize_memory_bytes // (1024 * 1024)} MiB)")
    if process.returncode < 0:
        raise BuildError(f"{what} was killed by signal {-process.returncode}")
    return Completed(returncode=process.returncode, stdout=bytes(out.data), stderr=stderr)


def main(argv: list[str]) -> int:
    """``python -m stageset.build [--update]``: build both binaries once; print the builder's path."""
    if "--update" in argv:
        update_wrapper()
    with contextlib.redirect_stdout(sys.stderr):
        ensure_kustomize()
        binary = ensure_builder()
    print(binary)
    return 0
