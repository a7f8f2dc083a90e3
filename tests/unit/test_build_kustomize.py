"""Finding and building the two binaries, and what the builder is sent (no binary run here)."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from stageset.build import BuildError, BuildLimits, KustomizeNotFoundError, locate_builder
from stageset.build import kustomize as kz


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STAGESET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    monkeypatch.delenv(kz.ENV_OVERRIDE, raising=False)
    monkeypatch.delenv(kz.ENV_BUILDER, raising=False)
    return tmp_path


def test_builder_override_wins_and_must_exist(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    executable(kz.cached_builder())
    override = executable(isolated / "mine" / "stageset-kustomize")
    monkeypatch.setenv(kz.ENV_BUILDER, str(override))
    assert locate_builder() == override
    assert kz.ensure_builder(log=False) == override
    monkeypatch.setenv(kz.ENV_BUILDER, str(isolated / "nope"))
    with pytest.raises(KustomizeNotFoundError, match=r"STAGESET_KUSTOMIZE_BUILDER=.*nope is not an exec"):
        locate_builder()


def test_builder_from_the_cache_then_path(isolated: Path) -> None:
    on_path = executable(isolated / "path" / "stageset-kustomize")
    assert locate_builder() == on_path
    cached = executable(kz.cached_builder())
    assert cached.parent.parent == isolated / "cache" / "tools"
    assert cached.parent.name.startswith(f"stageset-kustomize-{kz.KUSTOMIZE_VERSION}-")
    assert locate_builder() == cached


def test_the_builder_the_package_ships_comes_before_the_cache(
        isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A platform wheel's own builder (stageset/build/bin/) wins over the cache and PATH; the
    override still wins over it."""
    packaged = isolated / "site-packages" / "stageset" / "build" / "bin"
    monkeypatch.setattr(kz, "PACKAGED_BINARIES", packaged)
    executable(isolated / "path" / "stageset-kustomize")
    cached = executable(kz.cached_builder())
    assert locate_builder() == cached
    shipped = executable(packaged / "stageset-kustomize")
    assert locate_builder() == shipped
    override = executable(isolated / "mine" / "stageset-kustomize")
    monkeypatch.setenv(kz.ENV_BUILDER, str(override))
    assert locate_builder() == override


def test_the_wheels_put_the_helpers_where_the_cli_looks() -> None:
    from stageset.envtest.wheels import PACKAGED

    assert kz.PACKAGED_BINARIES.as_posix().endswith(f"/{PACKAGED}")


def test_upstream_kustomize_override_cache_and_path(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = executable(isolated / "path" / "kustomize")
    assert kz.locate_kustomize() == on_path
    cached = executable(kz.cached_binary())
    assert cached == isolated / "cache" / "tools" / f"kustomize-{kz.KUSTOMIZE_VERSION}" / "kustomize"
    assert kz.locate_kustomize() == cached
    override = executable(isolated / "mine" / "kustomize")
    monkeypatch.setenv(kz.ENV_OVERRIDE, str(override))
    assert kz.ensure_kustomize(log=False) == override


def test_missing_builder_says_how_to_get_one(isolated: Path) -> None:
    with pytest.raises(KustomizeNotFoundError, match=r"python -m stageset\.build"):
        locate_builder()
    assert issubclass(KustomizeNotFoundError, BuildError)


def test_the_builder_cache_slot_follows_its_sources() -> None:
    slot = kz.cached_builder().parent.name
    assert slot == f"stageset-kustomize-{kz.KUSTOMIZE_VERSION}-{kz._builder_sources_digest()}"
    assert (kz.WRAPPER / "cmd" / "stageset-kustomize" / "main.go").is_file()


def test_wrapper_module_pins_the_version() -> None:
    go_mod = (kz.WRAPPER / "go.mod").read_text()
    assert f"{kz.KUSTOMIZE_MODULE} {kz.KUSTOMIZE_VERSION}\n" in go_mod
    assert f"{kz.KUSTOMIZE_MODULE} {kz.KUSTOMIZE_VERSION}/go.mod" in (kz.WRAPPER / "go.sum").read_text()


def test_the_tree_is_sent_as_regular_files_only() -> None:
    payload = kz.tar_stream({"b/c.yaml": b"x", "a.yaml": b"yy"})
    with tarfile.open(fileobj=io.BytesIO(payload)) as archive:
        members = archive.getmembers()
        assert [(m.name, m.size, m.isreg()) for m in members] == [("a.yaml", 2, True), ("b/c.yaml", 1, True)]


@pytest.mark.parametrize("name", ["/abs.yaml", "../up.yaml", "a//b.yaml", "a/./b.yaml", "a\\b.yaml", ""])
def test_unsafe_file_names_are_never_sent(name: str) -> None:
    with pytest.raises(BuildError, match="refusing unsafe file name"):
        kz.tar_stream({name: b"x"})


def test_the_environment_has_no_path_home_or_route_out() -> None:
    env = kz._environment(kz.BuildLimits())
    assert env["PATH"] == ""
    assert env["HOME"] == "/nonexistent"
    assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == env["ALL_PROXY"] == "http://127.0.0.1:0"
    assert env["GOMEMLIMIT"] == str(kz.BuildLimits().kustomize_memory_bytes)
    assert not any(key.startswith(("KUBE", "GIT_", "AWS_", "GOOGLE_")) for key in env)


def test_the_builder_is_the_first_process_the_kernel_kills_when_memory_runs_out(tmp_path: Path) -> None:
    # A stand-in builder that reports what the kernel would weigh it by once its input arrived.
    builder = tmp_path / "builder"
    builder.write_text("#!/bin/sh\n/bin/cat >/dev/null\necho \"adj: $(/bin/cat /proc/self/oom_score_adj)\"\n")
    builder.chmod(0o755)
    out = kz.kustomize_build({"kustomization.yaml": b"resources: []\n"}, ["."], limits=BuildLimits(),
                          binary=builder)
    assert out.strip() == "adj: 1000"
