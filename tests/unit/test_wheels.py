"""Which helper builds a platform wheel takes: the host's are the test command's cached builds, another
CPU's are cross-built (GOOS/GOARCH, cgo off) into cache slots of their own.  ``go`` here is a
stand-in script that writes what it was asked for into the output file (the real cross build is
``make release``'s; tests/release/test_wheel.py installs and runs the host's real wheel)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from stageset.build.decrypt import HELPER_NAME, cached_helper
from stageset.build.kustomize import BUILDER_NAME, cached_builder
from stageset.envtest import wheels

FAKE_GO = """#!/bin/sh
# go build ... -o OUTPUT PACKAGE: write the target platform and cgo setting into OUTPUT.
while [ $# -gt 0 ]; do
    if [ "$1" = "-o" ]; then out="$2"; fi
    shift
done
printf '%s/%s cgo=%s' "${GOOS:-host}" "${GOARCH:-host}" "$CGO_ENABLED" > "$out"
chmod +x "$out"
"""


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("STAGESET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GOARCH", raising=False)
    monkeypatch.delenv("GOOS", raising=False)
    return go


def test_another_cpu_is_cross_built_into_its_own_slot(fake_go: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOARCH", "mips")  # the build environment's own GOARCH does not win
    host = wheels.host_platform()
    other = next(p for p in wheels.PLATFORMS if p != host)
    built = wheels.helper_binaries(other, log=False)
    assert set(built) == {BUILDER_NAME, HELPER_NAME}
    for name, cached in ((BUILDER_NAME, cached_builder()), (HELPER_NAME, cached_helper())):
        assert built[name] == cached.parent.with_name(f"{cached.parent.name}-linux-{other.goarch}") / name
        assert built[name].read_text() == f"linux/{other.goarch} cgo=0"
        assert not cached.exists()  # the host's slot is not touched


def test_the_host_takes_the_cached_builds(fake_go: Path) -> None:
    host = wheels.host_platform()
    built = wheels.helper_binaries(host, log=False)
    assert built == {BUILDER_NAME: cached_builder(), HELPER_NAME: cached_helper()}
    assert built[BUILDER_NAME].read_text() == "host/host cgo=0"  # not a cross build


def test_without_go_the_error_names_the_helper_and_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("STAGESET_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(wheels.WheelError, match=r"stageset-kustomize for linux/arm64: the Go toolchain"):
        wheels.helper_binaries(wheels.PLATFORMS[1], log=False)


def test_the_platform_tags_are_manylinux_for_both_cpus() -> None:
    assert {p.machine for p in wheels.PLATFORMS} == {"x86_64", "aarch64"}
    for target in wheels.PLATFORMS:
        assert target.tag == f"manylinux_2_17_{target.machine}.manylinux2014_{target.machine}"
