"""Wheels of ``stageset`` per platform that carry the Go helpers the CLI runs (``make release``).

``stageset build`` and ``stageset diff`` render with two Go programs: the ``stageset-kustomize``
builder (:mod:`stageset.build.kustomize`) and the ``stageset-sops`` decryption helper
(:mod:`stageset.build.decrypt`).  A wheel of Python code alone would make every user install Go
and a checkout to build them, so ``make release`` also builds, into ``dist/<version>/``:

* ``stageset-<version>-py3-none-manylinux_2_17_<cpu>.manylinux2014_<cpu>.whl`` for ``x86_64`` and
  ``aarch64`` (:data:`PLATFORMS`): the package with both helpers in ``stageset/build/bin/``, where
  :func:`~stageset.build.kustomize.locate_binary` looks before the cache and ``PATH``;
* ``stageset-<version>-py3-none-any.whl``: the package alone, for every other platform (the
  helpers come from ``PATH`` there, e.g. a container image's).  Installers prefer a platform
  wheel over it wherever one fits.

How, and why this way: ``uv build --wheel`` builds the pure wheel exactly as for any other
install (hatchling, the project's own build backend; no build hook, so ``uv sync``'s editable
install is untouched); then, per platform, ``wheel unpack`` / ``wheel pack`` / ``wheel tags``
(the PyPA ``wheel`` tool, a dev dependency) put the helpers in, mark the wheel platlib
(``Root-Is-Purelib: false``), rewrite ``RECORD`` with every file's hash and retag it.  Every
Python file of every platform wheel is therefore the pure wheel's, byte for byte.

The tag is honest without ``auditwheel``: both helpers are built with cgo off
(:func:`~stageset.build.kustomize.run_go`), so they are static ELF executables that need no
glibc at all; ``manylinux_2_17`` (= ``manylinux2014``) is the floor installers and PyPI accept
for both CPUs.  Another CPU is only ``GOARCH`` (:attr:`~stageset.build.kustomize.GoBuild.goarch`):
the host's helpers are the cached builds the tests use, another CPU's are cross-built once into
a cache slot of their own (``<slot>-linux-<goarch>``).

Identity: none -- no cluster is touched; builds reach only the Go module proxy and PyPI (uv's
cache).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stageset.build.decrypt import HELPER_BUILD, HELPER_NAME, HELPER_PACKAGE, cached_helper
from stageset.build.kustomize import (
    BUILDER_NAME,
    BUILDER_PACKAGE,
    KUSTOMIZE_BUILD,
    GoBuild,
    cached_builder,
    ensure_go_binary,
)
from stageset.envtest.image import find_uv

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = "stageset/build/bin"
"""Where the helpers go inside the wheel (:data:`stageset.build.kustomize.PACKAGED_BINARIES`)."""
_EPOCH = "1700000000"
"""SOURCE_DATE_EPOCH for the zip entries' times, as the image's (the same inputs, the same bytes)."""


class WheelError(RuntimeError):
    pass


@dataclass(frozen=True)
class Platform:
    """One CPU a platform wheel is built for."""

    goarch: str
    machine: str
    """``platform.machine()`` on such a Linux host."""
    tag: str
    """The wheel's platform tag (compressed tag set: every name installers may look for)."""


PLATFORMS = (
    Platform(goarch="amd64", machine="x86_64", tag="manylinux_2_17_x86_64.manylinux2014_x86_64"),
    Platform(goarch="arm64", machine="aarch64", tag="manylinux_2_17_aarch64.manylinux2014_aarch64"),
)


def host_platform() -> Platform:
    """The platform of this machine (the wheel a test here can install)."""
    machine = platform.machine()
    for candidate in PLATFORMS:
        if candidate.machine == machine and sys.platform == "linux":
            return candidate
    raise WheelError(f"no platform wheel for {sys.platform}/{machine}")


def helper_binaries(target: Platform, *, log: bool = True) -> dict[str, Path]:
    """The two helpers for ``target``: built once into the cache (the host's are the tests' builds).

    Environment overrides (``STAGESET_KUSTOMIZE_BUILDER``, ...) are not used: a wheel ships what
    the checked-in wrapper modules build, nothing that happens to be on this machine."""
    builds: tuple[tuple[str, str, GoBuild, Path], ...] = (
        (BUILDER_NAME, BUILDER_PACKAGE, KUSTOMIZE_BUILD, cached_builder()),
        (HELPER_NAME, HELPER_PACKAGE, HELPER_BUILD, cached_helper()),
    )
    host = _host_goarch()
    found: dict[str, Path] = {}
    for name, package, how, cached in builds:
        binary = cached
        if target.goarch != host:
            binary = cached.parent.with_name(f"{cached.parent.name}-linux-{target.goarch}") / name
            how = dataclasses.replace(how, goarch=target.goarch)
        try:
            found[name] = ensure_go_binary(binary, package=package, name=name, how=how, log=log)
        except RuntimeError as error:  # no Go, or the build failed (GoError)
            raise WheelError(f"{name} for linux/{target.goarch}: {error}") from None
    return found


def _host_goarch() -> str:
    try:
        return host_platform().goarch
    except WheelError:
        return ""  # no host platform wheel: every build is a cross build


def _run(args: Sequence[str], *, cwd: Path | None = None) -> str:
    env = {**os.environ, "SOURCE_DATE_EPOCH": _EPOCH}
    result = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise WheelError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout


def pure_wheel(out: Path, *, root: Path = ROOT) -> Path:
    """``uv build --wheel`` of the checkout at ``root`` into ``out``: the wheel every other starts from."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stageset-wheel-") as tmp:
        _run([find_uv(), "build", "--wheel", "--quiet", "--out-dir", tmp, str(root)])
        (built,) = Path(tmp).glob("*.whl")
        if not built.name.endswith("-py3-none-any.whl"):
            raise WheelError(f"uv build made {built.name}, not a pure wheel")
        target = out / built.name
        shutil.move(built, target)
    return target


def _wheel_tool(*args: str) -> str:
    return _run([sys.executable, "-m", "wheel", *args])


def platform_wheel(pure: Path, target: Platform, out: Path, *, log: bool = True) -> Path:
    """``pure`` with ``target``'s helpers in ``stageset/build/bin/``, tagged for ``target``."""
    binaries = helper_binaries(target, log=log)
    with tempfile.TemporaryDirectory(prefix="stageset-wheel-") as tmp:
        _wheel_tool("unpack", "--dest", tmp, str(pure))
        (unpacked,) = (p for p in Path(tmp).iterdir() if p.is_dir())
        bin_dir = unpacked / PACKAGED
        bin_dir.mkdir(parents=True)
        for name, binary in sorted(binaries.items()):
            shutil.copyfile(binary, bin_dir / name)
            (bin_dir / name).chmod(0o755)  # the zip entry keeps the mode; installers restore +x
        (dist_info,) = unpacked.glob("*.dist-info")
        metadata = dist_info / "WHEEL"
        text = metadata.read_text()
        if "Root-Is-Purelib: true\n" not in text:
            raise WheelError(f"{pure.name}: unexpected WHEEL file:\n{text}")
        # Native code: installed into platlib, as every wheel with a platform tag should be.
        metadata.write_text(text.replace("Root-Is-Purelib: true\n", "Root-Is-Purelib: false\n"))
        packed = Path(tmp) / "packed"
        packed.mkdir()
        _wheel_tool("pack", "--dest-dir", str(packed), str(unpacked))
        (repacked,) = packed.glob("*.whl")
        _wheel_tool("tags", "--remove", "--platform-tag", target.tag, str(repacked))
        (tagged,) = packed.glob("*.whl")
        result = out / tagged.name
        shutil.move(tagged, result)
    return result


def build_wheels(out: Path, *, platforms: Sequence[Platform] = PLATFORMS, log: bool = True) -> list[Path]:
    """The pure wheel and one platform wheel per ``platforms`` entry, into ``out``."""
    pure = pure_wheel(out)
    return [pure, *(platform_wheel(pure, target, out, log=log) for target in platforms)]


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m stageset.envtest.wheels",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "wheels", help="where the wheels go")
    parser.add_argument("--host-only", action="store_true", help="this machine's platform wheel only")
    args = parser.parse_args(argv)
    try:
        platforms = (host_platform(),) if args.host_only else PLATFORMS
        for path in build_wheels(args.out, platforms=platforms):
            print(path)
    except WheelError as error:
        print(f"wheels: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
