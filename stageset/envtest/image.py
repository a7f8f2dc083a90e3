"""Build the controller image without a container engine, as an OCI archive cached by content.

``python -m stageset.envtest.image`` prints the path of
``<cache>/image/stageset-<key>.oci.tar`` (an ``oci-archive``: ``podman load``, ``skopeo copy
oci-archive:...`` and ``crane`` read it), building it first when no archive with that key
exists.  The result is the image the ``Containerfile`` describes, made from the same
ingredients by other means:

1. **Base layer** -- ``mmdebstrap`` (Debian's package) makes a minimal root filesystem of the
   Containerfile's ``DEBIAN_SUITE`` with ``RUNTIME_PACKAGES`` (``essential`` variant, merged
   ``/usr``, documentation, manuals and locales left out like ``debian:*-slim``), from the
   Debian mirrors the host's apt is configured with.  Cached by its own key (suite, packages,
   options), so a code change does not re-bootstrap Debian.
2. **Application layer** -- a virtualenv at ``/opt/stageset`` created by the image's own
   ``python3`` (under ``chroot``), filled by ``uv pip install --target`` from ``uv.lock``
   (hash-checked wheels for the image's platform) plus the project's wheel, byte-compiled
   by the image's interpreter; the ``stageset-kustomize`` builder from the cache
   (:mod:`stageset.build.kustomize`);
   the numeric non-root user.
3. **Assembly** -- ``umoci`` (Debian's package) writes an OCI layout with the two layers and
   the config the Containerfile declares (``ENV``, ``LABEL``, ``USER``, ``WORKDIR``,
   ``ENTRYPOINT``), which is then tarred into the archive.

Settings come from the Containerfile itself (:func:`containerfile_settings`), so the two
builds cannot drift.  The archive's key hashes everything that goes into it (Containerfile,
this module, ``uv.lock``, ``pyproject.toml``, the package sources, the builder's module), so
a warm run with unchanged sources costs one hash of the tree.

Needs root (``mmdebstrap --mode=root``, ``chroot``) and the Debian packages ``mmdebstrap``
and ``umoci`` (``hack/bootstrap.sh`` installs them).  Identity: none -- no cluster is
touched; apt reaches only the configured Debian mirrors and uv only PyPI (its cache).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stageset.build.decrypt import SOPS_VERSION, ensure_helper
from stageset.build.kustomize import KUSTOMIZE_VERSION, cache_root, ensure_builder

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "Containerfile"
TAG = "stageset"
# Bumped when the recipe below changes in a way the hashed inputs do not show.
_RECIPE = "4"
# Debian's slim images leave these out; so do we (copyright files stay).
_DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright", "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/lintian/*",
)
# Fixed timestamps make the layers depend on their content only.
_EPOCH = 1700000000
_CREATED = "2023-11-14T22:13:20Z"
_SOURCE_DIRS = ("stageset", "sources")
_SOURCE_FILES = ("pyproject.toml", "uv.lock", "README.md", "Containerfile")
# Parts of third-party packages stageset never imports, left out to keep the image small: the
# kubernetes client's asyncio twin (68 MB with its byte code; we use the synchronous client as a
# transport only) and test suites.  tests/image runs the controller's imports inside the image.
_PRUNE = ("kubernetes/aio", "kubernetes/test", "kubernetes/e2e_test", "*/tests", "*/*/tests", "*/*/*/tests")
_APP_PATHS = ("opt/stageset", "usr/local/bin/stageset-kustomize", "usr/local/bin/stageset-sops", "etc/passwd",
              "etc/group", "home/stageset")


class ImageBuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class ContainerfileSettings:
    """What the Containerfile's final stage declares, as the daemonless build uses it."""

    suite: str
    packages: tuple[str, ...]
    uid: int
    user: str
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    entrypoint: tuple[str, ...] = ()


def _instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs with continuation lines joined and comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    pairs = []
    for line in joined:
        word, _, rest = line.partition(" ")
        pairs.append((word.upper(), rest.strip()))
    return pairs


def _pairs(arguments: str) -> dict[str, str]:
    result = {}
    for token in shlex.split(arguments):
        key, sep, value = token.partition("=")
        if not sep:
            raise ImageBuildError(f"Containerfile: expected KEY=value, got {token!r}")
        result[key] = value
    return result


def containerfile_settings(text: str | None = None) -> ContainerfileSettings:
    """Parse the settings the daemonless build shares with the Containerfile."""
    instructions = _instructions(CONTAINERFILE.read_text() if text is None else text)
    args: dict[str, str] = {}
    for word, rest in instructions:
        if word == "FROM":
            break
        if word == "ARG":
            args.update(_pairs(rest))
    final = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    env: dict[str, str] = {}
    labels: dict[str, str] = {}
    user, workdir, entrypoint = "", "/", ()
    for word, rest in instructions[final + 1:]:
        if word == "ENV":
            env.update(_pairs(rest))
        elif word == "LABEL":
            labels.update(_pairs(rest))
        elif word == "USER":
            user = rest
        elif word == "WORKDIR":
            workdir = rest
        elif word == "ENTRYPOINT":
            entrypoint = tuple(json.loads(rest))
    for required in ("DEBIAN_SUITE", "RUNTIME_PACKAGES", "STAGESET_UID"):
        if required not in args:
            raise ImageBuildError(f"Containerfile: global ARG {required} is missing")
    uid = int(args["STAGESET_UID"])
    if not uid or user != f"{uid}:{uid}":
        raise ImageBuildError(f"Containerfile: USER must be the numeric non-root {uid}:{uid}, not {user!r}")
    if not entrypoint:
        raise ImageBuildError("Containerfile: ENTRYPOINT (JSON form) is missing")
    return ContainerfileSettings(suite=args["DEBIAN_SUITE"], packages=tuple(args["RUNTIME_PACKAGES"].split()),
                                 uid=uid, user=user, env=env, labels=labels, workdir=workdir,
                                 entrypoint=entrypoint)


# --------------------------------------------------------------------------- keys and paths


def image_dir() -> Path:
    return cache_root() / "image"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


def base_key(settings: ContainerfileSettings) -> str:
    return _digest(_RECIPE.encode(), settings.suite.encode(), " ".join(settings.packages).encode(),
                   "\n".join(_DPKG_EXCLUDES).encode())


def _source_files() -> list[Path]:
    files = [ROOT / name for name in _SOURCE_FILES]
    for directory in _SOURCE_DIRS:
        files += sorted(p for p in (ROOT / directory).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return files


def image_key(settings: ContainerfileSettings) -> str:
    builder = sorted((ROOT / "hack" / "kustomize").rglob("*")) + sorted((ROOT / "hack" / "sops").rglob("*"))
    parts = [base_key(settings).encode(), KUSTOMIZE_VERSION.encode(), SOPS_VERSION.encode(),
             Path(__file__).read_bytes(), *(p.read_bytes() for p in builder if p.is_file())]
    for path in _source_files():
        parts += [str(path.relative_to(ROOT)).encode(), path.read_bytes()]
    return _digest(*parts)


def archive_path(settings: ContainerfileSettings | None = None) -> Path:
    settings = settings or containerfile_settings()
    return image_dir() / f"stageset-{image_key(settings)}.oci.tar"


# --------------------------------------------------------------------------- steps


def _run(args: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
         log: bool = False) -> str:
    if log:
        print(f"image: {' '.join(args)[:200]}", file=sys.stderr, flush=True)
    result = subprocess.run(args, cwd=cwd, env=env, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise ImageBuildError(f"{' '.join(args)[:300]} failed ({result.returncode}):\n"
                              f"{(result.stderr or result.stdout)[-4000:]}")
    return result.stdout


def _tar(*, source: Path, paths: list[str], out: Path) -> None:
    """A deterministic uncompressed tar of ``paths`` under ``source`` (numeric owners kept)."""
    _run(["tar", "--create", "--file", str(out), "--directory", str(source), "--sort=name",
          "--numeric-owner", f"--mtime=@{_EPOCH}", "--clamp-mtime", "--xattrs",
          "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime", *paths])


def _debian_sources(suite: str) -> list[Path]:
    """The host's enabled apt source files that carry ``suite`` (handed to mmdebstrap)."""
    candidates = [Path("/etc/apt/sources.list"),
                  *map(Path, sorted(glob.glob("/etc/apt/sources.list.d/*.list"))),
                  *map(Path, sorted(glob.glob("/etc/apt/sources.list.d/*.sources")))]
    found = [path for path in candidates if path.is_file() and re.search(
        rf"^(?!\s*#).*\b{re.escape(suite)}\b", path.read_text(), re.MULTILINE)]
    if not found:
        raise ImageBuildError(f"no apt source for Debian {suite} on this host (/etc/apt/sources.list*)")
    return found


def _require_tools() -> None:
    if os.geteuid() != 0:
        raise ImageBuildError("the daemonless image build needs root (mmdebstrap --mode=root, chroot)")
    missing = [tool for tool in ("mmdebstrap", "umoci", "tar", "strip") if shutil.which(tool) is None]
    if missing:
        raise ImageBuildError(f"missing {', '.join(missing)}: run ./hack/bootstrap.sh (installs the "
                              "Debian packages mmdebstrap, umoci and binutils)")


def build_base(settings: ContainerfileSettings, out: Path, *, log: bool) -> None:
    """Debian's minimal root filesystem with the runtime packages, as a layer tarball."""
    with tempfile.TemporaryDirectory(prefix="stageset-base-", dir=out.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        args = ["mmdebstrap", "--mode=root", "--variant=essential", "--format=directory",
                "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
                f"--include={','.join(settings.packages)}",
                "--aptopt=Acquire::Check-Valid-Until \"false\"",
                *(f"--dpkgopt={option}" for option in _DPKG_EXCLUDES),
                # Leave nothing of the build behind: caches, logs, the package lists.
                "--customize-hook=rm -rf \"$1\"/var/cache/* \"$1\"/var/log/* \"$1\"/var/lib/apt/lists/*"
                " \"$1\"/tmp/*",
                settings.suite, str(rootfs), *map(str, _debian_sources(settings.suite))]
        _run(args, env={**os.environ, "SOURCE_DATE_EPOCH": str(_EPOCH)}, log=log)
        staged = Path(tmp) / "base.tar"
        _tar(source=rootfs, paths=["."], out=staged)
        staged.rename(out)


def find_uv() -> str:
    """uv: `$UV` (the Makefile passes the pinned one), else on PATH, else the one bootstrap pinned."""
    configured = os.environ.get("UV")
    if configured:
        return configured
    pinned = sorted(glob.glob(str(cache_root() / "tools" / "uv-*" / "bin" / "uv")))
    found = shutil.which("uv") or (pinned[-1] if pinned else None)
    if not found:
        raise ImageBuildError("uv not found: run ./hack/bootstrap.sh or set UV")
    return found


def _python_version(rootfs: Path) -> str:
    return _run(["chroot", str(rootfs), "/usr/bin/python3", "-c",
                 "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"]).strip()


_LAUNCHER = """#!/opt/stageset/bin/python
import sys

from stageset.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
"""


def build_app(settings: ContainerfileSettings, *, base: Path, work: Path, out: Path, log: bool) -> None:
    """The application layer: the locked virtualenv, stageset, the kustomize builder and the user."""
    rootfs = work / "rootfs"
    rootfs.mkdir()
    _run(["tar", "--extract", "--file", str(base), "--directory", str(rootfs), "--numeric-owner",
          "--same-permissions", "--xattrs"])
    uv = find_uv()
    venv = rootfs / "opt" / "stageset"
    _run(["chroot", str(rootfs), "/usr/bin/python3", "-m", "venv", "--without-pip", "/opt/stageset"], log=log)
    version = _python_version(rootfs)
    site = venv / "lib" / f"python{version}" / "site-packages"
    requirements = work / "requirements.txt"
    _run([uv, "export", "--frozen", "--no-dev", "--no-emit-project", "--quiet", "-o", str(requirements)],
         cwd=ROOT, log=log)
    wheels = work / "wheel"
    _run([uv, "build", "--wheel", "--quiet", "--out-dir", str(wheels)], cwd=ROOT, log=log)
    # The image's platform (glibc of the Debian suite; manylinux_2_36 covers bookworm), not the host's.
    # Copies, never hard links into uv's cache: files of the image are changed below (stripped),
    # and a change through a link would change every virtualenv sharing the file, under running
    # processes.
    target = ["--target", str(site), "--python-version", version,
              "--python-platform", "x86_64-manylinux_2_36", "--only-binary", ":all:", "--no-deps",
              "--link-mode", "copy", "--quiet"]
    _run([uv, "pip", "install", *target, "--require-hashes", "-r", str(requirements)], cwd=ROOT, log=log)
    _run([uv, "pip", "install", *target, *map(str, sorted(wheels.glob("*.whl")))], cwd=ROOT, log=log)
    # --target leaves host-specific launchers in site-packages/bin: the venv gets its own.
    shutil.rmtree(site / "bin", ignore_errors=True)
    for pattern in _PRUNE:
        for pruned in site.glob(pattern):
            if pruned.is_dir() and pruned.relative_to(site).parts[0] not in _SOURCE_DIRS:
                shutil.rmtree(pruned)
    # Wheels ship their extension modules with symbol tables; nothing at run time reads them.
    # Each is stripped into a new file that replaces it (GNU strip rewrites a hard-linked file in
    # place, through every link).
    for library in sorted(p for p in site.rglob("*.so*") if p.is_file() and not p.is_symlink()):
        stripped = library.with_name(library.name + ".stripped")
        _run(["strip", "--strip-unneeded", "-o", str(stripped), str(library)])
        stripped.chmod(library.stat().st_mode)
        os.replace(stripped, library)
    launcher = venv / "bin" / "stageset"
    launcher.write_text(_LAUNCHER)
    launcher.chmod(0o755)
    _run(["chroot", str(rootfs), "/opt/stageset/bin/python", "-m", "compileall", "-q",
          "--invalidation-mode", "unchecked-hash", "/opt/stageset"], log=log)
    builder = rootfs / "usr" / "local" / "bin" / "stageset-kustomize"
    builder.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ensure_builder(log=log), builder)
    builder.chmod(0o755)
    helper = rootfs / "usr" / "local" / "bin" / "stageset-sops"
    shutil.copy2(ensure_helper(log=log), helper)
    helper.chmod(0o755)
    uid = settings.uid
    with (rootfs / "etc" / "passwd").open("a") as passwd:
        passwd.write(f"stageset:x:{uid}:{uid}:stageset:/home/stageset:/usr/sbin/nologin\n")
    with (rootfs / "etc" / "group").open("a") as group:
        group.write(f"stageset:x:{uid}:\n")
    home = rootfs / "home" / "stageset"
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, uid, uid)
    for path in _APP_PATHS:
        os.utime(rootfs / path, (_EPOCH, _EPOCH), follow_symlinks=False)
    _tar(source=rootfs, paths=list(_APP_PATHS), out=out)


def assemble(settings: ContainerfileSettings, *, layers: list[tuple[Path, str]], layout: Path) -> None:
    image = f"{layout}:{TAG}"
    _run(["umoci", "init", "--layout", str(layout)])
    _run(["umoci", "new", "--image", image])
    for tarball, comment in layers:
        _run(["umoci", "raw", "add-layer", "--image", image, "--history.created", _CREATED,
              "--history.comment", comment, str(tarball)])
    config = ["umoci", "config", "--image", image, "--no-history", "--created", _CREATED,
              "--author", "stageset", "--os", "linux", "--architecture", "amd64",
              "--config.user", settings.user, "--config.workingdir", settings.workdir,
              "--clear=config.entrypoint", "--clear=config.cmd", "--clear=config.env"]
    config += [f"--config.entrypoint={part}" for part in settings.entrypoint]
    config += [f"--config.env={key}={value}" for key, value in settings.env.items()]
    config += [f"--config.label={key}={value}" for key, value in settings.labels.items()]
    _run(config)
    _run(["umoci", "gc", "--layout", str(layout)])


def image_summary(layout: Path) -> dict[str, Any]:
    """Layer sizes (compressed blobs as pulled, and unpacked) read from the OCI layout."""
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"].split(":", 1)[1]
    manifest = json.loads((layout / "blobs" / "sha256" / manifest_digest).read_text())
    config_digest = manifest["config"]["digest"].split(":", 1)[1]
    config = json.loads((layout / "blobs" / "sha256" / config_digest).read_text())
    compressed = sum(int(layer["size"]) for layer in manifest["layers"])
    return {"manifest": index["manifests"][0]["digest"], "layers": len(manifest["layers"]),
            "compressed_bytes": compressed, "config": config.get("config", {})}


def build(settings: ContainerfileSettings, out: Path, *, log: bool = True) -> None:
    _require_tools()
    out.parent.mkdir(parents=True, exist_ok=True)
    base = out.parent / f"base-{base_key(settings)}.tar"
    if not base.is_file():
        if log:
            print(f"image: bootstrapping Debian {settings.suite} with {' '.join(settings.packages)} ...",
                  file=sys.stderr, flush=True)
        build_base(settings, base, log=log)
    with tempfile.TemporaryDirectory(prefix="stageset-image-", dir=out.parent) as tmp:
        work = Path(tmp)
        app = work / "app.tar"
        build_app(settings, base=base, work=work, out=app, log=log)
        layout = work / "oci"
        assemble(settings, layers=[(base, f"Debian {settings.suite}: {' '.join(settings.packages)}"),
                                   (app, "stageset, its locked environment, the builder, the user")],
                 layout=layout)
        summary = image_summary(layout)
        staged = work / "image.oci.tar"
        _tar(source=layout, paths=["."], out=staged)
        summary["archive_bytes"] = staged.stat().st_size
        out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
        staged.rename(out)
    # Keep the cache bounded, but not to one entry: checkouts of different content (worktrees,
    # branches) build side by side and must not delete each other's archive under their tests.
    _prune(out.parent, "stageset-*.oci.tar", keep=out, newest=3)
    _prune(out.parent, "base-*.tar", keep=base, newest=2)


def _prune(directory: Path, pattern: str, *, keep: Path, newest: int) -> None:
    """Delete all but ``keep`` and the ``newest`` most recently written files matching ``pattern``."""
    found = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in [p for p in found if p != keep][newest - 1:]:
        stale.unlink(missing_ok=True)
        stale.with_suffix(".json").unlink(missing_ok=True)


def ensure_image(*, log: bool = True) -> Path:
    """The archive for the current sources, building it once (under a lock) if needed."""
    settings = containerfile_settings()
    out = archive_path(settings)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_file():
            build(settings, out, log=log)
    return out


def main(argv: list[str]) -> int:
    path = ensure_image()
    if "--summary" in argv:
        print(path.with_suffix(".json").read_text(), file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
