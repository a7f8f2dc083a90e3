"""The real ``sops`` and ``age-keygen`` for the tests, built from the Go module proxy and cached.

Tests encrypt their fixtures during the run with the pinned SOPS release the controller's
decryption helper links (:data:`~stageset.build.decrypt.SOPS_VERSION`), so what is decrypted is
exactly what a user's ``sops`` writes.  Both commands come from the checked-in wrapper module
``hack/sops`` (its ``tools.go`` pins them; the same module builds the runtime helper
``stageset-sops``, so the two builds share every downloaded module and compiled package) and
land in ``<cache>/tools/sops-cli-<version>-<digest>/``, built once under a file lock.
``$STAGESET_SOPS`` and ``$STAGESET_AGE_KEYGEN`` naming executables use those instead.  Tests
only: nothing here is part of the image.

``--update`` regenerates ``hack/sops/go.sum`` (``go mod tidy``) after a version bump.

Identity: none.  Building touches no cluster, and the tests run both commands on local files
(``sops --version`` is never run: it asks GitHub for the latest release).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
from pathlib import Path

from stageset.build.decrypt import SOPS_MODULE, SOPS_VERSION, WRAPPER
from stageset.build.kustomize import GoBuild, build_into, cache_root, run_go

PACKAGES = {"sops": f"{SOPS_MODULE}/cmd/sops", "age-keygen": "filippo.io/age/cmd/age-keygen"}
OVERRIDES = {"sops": "STAGESET_SOPS", "age-keygen": "STAGESET_AGE_KEYGEN"}


def cache_dir() -> Path:
    """Keyed by the module's pins only: an edit of the runtime helper's code does not rebuild these."""
    pins = b"".join((WRAPPER / name).read_bytes() for name in ("go.mod", "go.sum", "tools.go"))
    digest = hashlib.sha256(pins)
    return cache_root() / "tools" / f"sops-cli-{SOPS_VERSION}-{digest.hexdigest()[:12]}"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def ensure(name: str, *, log: bool = True) -> Path:
    """The ``sops`` or ``age-keygen`` binary: the override, the cached build, or both built now."""
    override = os.environ.get(OVERRIDES[name])
    if override:
        if _executable(Path(override)):
            return Path(override)
        raise RuntimeError(f"{OVERRIDES[name]}={override} is not an executable file")
    target = cache_dir()
    if all(_executable(target / binary) for binary in PACKAGES):
        return target / name
    if shutil.which("go") is None:
        raise RuntimeError(f"the Go toolchain is needed to build {name}; install go or set {OVERRIDES[name]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(_executable(target / binary) for binary in PACKAGES):
            _build_into(target, log=log)
    return target / name


def _build_into(target: Path, *, log: bool) -> None:
    how = GoBuild(wrapper=WRAPPER, version=SOPS_VERSION, ldflags="", nosumdb="github.com/getsops,filippo.io",
                  env_override=OVERRIDES["sops"])
    build_into(target, packages=list(PACKAGES.values()), what="sops and age-keygen (tests only)", how=how,
               log=log)


def main(argv: list[str]) -> int:
    if "--update" in argv:
        run_go(["mod", "tidy"], cwd=WRAPPER)
    for name in PACKAGES:
        print(ensure(name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
