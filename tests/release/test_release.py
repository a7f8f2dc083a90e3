"""``make release``: one version everywhere, the CHANGELOG section, and (as root, with the image the
test command built) every artifact, checked by opening each one (the wheels: the host's)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from stageset.cli.main import main
from stageset.envtest import release, wheels
from stageset.envtest.release import ReleaseError, changelog_section, current_version, set_version

ROOT = Path(__file__).resolve().parents[2]


def test_one_version_everywhere() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "helm" / "stageset" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version == current_version()
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    assert next(p["version"] for p in lock["package"] if p["name"] == "stageset") == version
    assert f"## [{version}]" in changelog_section((ROOT / "CHANGELOG.md").read_text(), version)
    printed = CliRunner().invoke(main, ["version", "--client"], catch_exceptions=False).stdout
    assert printed.startswith(f"client: stageset {version} ")
    assert (ROOT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]


def test_set_version_writes_every_file_once(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "uv.lock", "helm/stageset/Chart.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    changed = set_version("9.8.7-rc.1", root=tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in changed} == {
        "pyproject.toml", "uv.lock", "helm/stageset/Chart.yaml"}
    chart = yaml.safe_load((tmp_path / "helm/stageset/Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == ("9.8.7-rc.1", "9.8.7-rc.1")
    assert current_version(tmp_path) == "9.8.7-rc.1"
    lock = tomllib.loads((tmp_path / "uv.lock").read_text())
    assert next(p["version"] for p in lock["package"] if p["name"] == "stageset") == "9.8.7-rc.1"
    assert set_version("9.8.7-rc.1", root=tmp_path) == []  # the tagged commit: nothing changes
    with pytest.raises(ReleaseError, match="not a release version"):
        set_version("v1.0", root=tmp_path)


@pytest.mark.parametrize(("version", "says"), [
    ("0.0.0-test", "not a PEP 440 version"),  # semver, but uv and pip refuse it
    ("1.0", "Semantic Versioning"),  # PEP 440, but Helm refuses it as a chart version
    ("v1.0.0", "not x.y.z"),
    ("1.0.0+build.1", "not x.y.z"),
    ("9.9.9", "CHANGELOG.md has no section for 9.9.9"),  # a fine version without release notes
])
def test_make_release_with_a_bad_version_changes_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         version: str, says: str) -> None:
    """``make release VERSION=...`` (``python -m stageset.envtest.release``) checks the version and the
    release notes before it writes anything: a refused version leaves every file as it was."""
    files = ("pyproject.toml", "uv.lock", "helm/stageset/Chart.yaml", "CHANGELOG.md")
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    before = {name: (tmp_path / name).read_bytes() for name in files}
    assert release.main([version, "--dist", str(tmp_path / "dist")], root=tmp_path) == 1
    assert says in capsys.readouterr().err
    assert {name: (tmp_path / name).read_bytes() for name in files} == before
    assert not (tmp_path / "dist").exists()


CHANGELOG = """# Changelog

## [Unreleased]

## [1.1.0] - 2026-12-01

### Added
- a thing

## [1.0.0] - 2026-11-01

- first
"""


def test_changelog_section() -> None:
    assert changelog_section(CHANGELOG, "1.1.0") == "## [1.1.0] - 2026-12-01\n\n### Added\n- a thing\n"
    assert changelog_section(CHANGELOG, "1.0.0") == "## [1.0.0] - 2026-11-01\n\n- first\n"
    with pytest.raises(ReleaseError, match=r"no section for 1\.2\.0"):
        changelog_section(CHANGELOG, "1.2.0")
    with pytest.raises(ReleaseError, match="empty"):
        changelog_section("## [2.0.0]\n## [1.0.0]\nx\n", "2.0.0")


def _image() -> Path | None:
    from stageset.envtest.image import archive_path

    path = archive_path()
    return path if path.is_file() else None


@pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                    reason="the release's image step needs root (umoci), as make image does")
def test_make_release_produces_every_artifact(tmp_path: Path) -> None:
    """The real release steps on the image the test command built (hack/test.sh builds it before
    pytest; built here otherwise): chart, image, SBOM, notes, checksums -- each opened and checked."""
    version = current_version()
    # The host's platform wheel only: the other CPU's is the same steps with cross-built helpers,
    # left to `make release` (a cold cross build of both helpers is minutes of CPU).
    host = wheels.host_platform()
    artifacts = release.release(version, dist=tmp_path, image=_image(), platforms=(host,))
    out = tmp_path / version
    names = sorted(p.name for p in artifacts)
    platform_wheel = f"stageset-{version}-py3-none-{'.'.join(sorted(host.tag.split('.')))}.whl"
    assert names == sorted([f"CHANGELOG-{version}.md", f"stageset-{version}.tgz",
                            f"stageset-{version}.oci.tar", f"stageset-{version}.sbom.cdx.json",
                            f"stageset-{version}-py3-none-any.whl", platform_wheel, "SHA256SUMS"])
    # The wheel carries the helpers (tests/release/test_wheel.py installs and runs one).
    with zipfile.ZipFile(out / platform_wheel) as wheel:
        assert {f"{wheels.PACKAGED}/stageset-kustomize", f"{wheels.PACKAGED}/stageset-sops"} <= set(
            wheel.namelist())
    # The chart: this version, the image tag it deploys.
    with tarfile.open(out / f"stageset-{version}.tgz") as chart:
        meta = yaml.safe_load(chart.extractfile("stageset/Chart.yaml").read())  # type: ignore[union-attr]
        assert "stageset/templates/crds.yaml" in chart.getnames()
    assert (meta["version"], meta["appVersion"]) == (version, version)
    # The image: tagged with the version, named as the chart's default image, labelled.
    with tarfile.open(out / f"stageset-{version}.oci.tar") as image:
        index = json.loads(image.extractfile("index.json").read())  # type: ignore[union-attr]
        (manifest,) = index["manifests"]
        assert manifest["annotations"]["org.opencontainers.image.ref.name"] == version
        assert manifest["annotations"]["io.containerd.image.name"] == f"ghcr.io/stageset/stageset:{version}"
        blob = lambda digest: json.loads(image.extractfile(  # noqa: E731 - local reader
            f"blobs/sha256/{digest.split(':')[1]}").read())  # type: ignore[union-attr]
        config = blob(blob(manifest["digest"])["config"]["digest"])
        labels = config["config"]["Labels"]
        assert labels["org.opencontainers.image.version"] == version
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        assert config["config"]["Entrypoint"] == ["/opt/stageset/bin/stageset", "controller"]
    # The SBOM: Debian packages, the Python environment and the Go builder, read from the image.
    sbom = json.loads((out / f"stageset-{version}.sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    purls = [str(c.get("purl", "")) for c in sbom["components"]]
    for expected in ("pkg:deb/debian/python3", "pkg:pypi/kubernetes@", "pkg:pypi/stageset@" + version,
                     "pkg:golang/sigs.k8s.io/kustomize/api@"):
        assert any(p.startswith(expected) for p in purls), expected
    # The notes and the checksums of everything.
    assert (out / f"CHANGELOG-{version}.md").read_text().startswith(f"## [{version}]")
    sums = dict(reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines())
    assert sorted(sums) == sorted(n for n in names if n != "SHA256SUMS")
    for name, digest in sums.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
