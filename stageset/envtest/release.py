"""``make release VERSION=x.y.z``: one version everywhere, then every artifact of the release.

The version's source of truth is ``pyproject.toml`` (``project.version``: what ``stageset
version`` reports); the chart's ``version`` and ``appVersion`` (the image tag it deploys by
default) and ``uv.lock``'s entry for the project follow it.  :func:`set_version` writes all of them,
so ``make release VERSION=x.y.z`` on a clean checkout is the version bump, and on the tagged
commit (the release workflow) changes nothing -- the workflow fails if it would.

Artifacts, in ``dist/<version>/``:

* ``stageset-<version>.tgz`` -- the chart (``helm package``, linted strictly first);
* ``stageset-<version>.oci.tar`` -- the image: the archive ``make image`` builds daemonlessly
  (:mod:`stageset.envtest.image`), tagged ``<version>``, labelled with the version and commit,
  and named ``ghcr.io/stageset/stageset:<version>`` (the chart's default image) for
  ``ctr images import`` and ``kind load image-archive``;
* ``stageset-<version>.sbom.cdx.json`` -- the image's SBOM (CycloneDX JSON) by ``syft``, built
  from the Go module proxy (:mod:`stageset.envtest.syft`): Debian packages, the Python packages
  of the virtualenv and the Go modules of the kustomize builder, read from the archive itself;
* ``stageset-<version>-py3-none-manylinux_2_17_{x86_64,aarch64}...whl`` -- the CLI, with the Go
  helpers ``build``/``diff`` run inside the package (:mod:`stageset.envtest.wheels`; the other
  CPU's helpers are cross-built once), and ``stageset-<version>-py3-none-any.whl`` without them,
  for every other platform;
* ``CHANGELOG-<version>.md`` -- this version's section of ``CHANGELOG.md`` (required), the
  release notes;
* ``SHA256SUMS`` -- of all of the above (``sha256sum -c SHA256SUMS``).

Needs root for the image (as ``make image``) and Go for the helpers.  Identity: none -- no
cluster is touched; builds reach only the Go module proxy, PyPI (uv's cache) and the Debian mirrors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml
from packaging.version import InvalidVersion, Version

from stageset.envtest.helm import ensure_helm
from stageset.envtest.image import _CREATED, TAG, _tar, ensure_image
from stageset.envtest.syft import ensure_syft
from stageset.envtest.wheels import PLATFORMS, Platform, WheelError, build_wheels

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "stageset"
# Semantic Versioning 2.0.0 (what Helm requires of a chart's version), without build metadata: a
# `+` has no place in an image tag.
VERSION = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(-(0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*)?$")


class ReleaseError(RuntimeError):
    pass


def current_version(root: Path = ROOT) -> str:
    match = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.MULTILINE)
    if match is None:
        raise ReleaseError("pyproject.toml has no project version")
    return match.group(1)


def image_repository(root: Path = ROOT) -> str:
    """The chart's default image: what the release workflow publishes."""
    values = yaml.safe_load((root / "helm" / "stageset" / "values.yaml").read_text())
    return str(values["image"]["repository"])


def check_version(version: str, root: Path = ROOT) -> None:
    """Everything ``make release`` needs of ``version``, checked before any file is written: the
    chart's semver (Helm), the Python package's PEP 440 (uv, pip and every later ``make``), and a
    CHANGELOG section (the release notes).  A version that fails any of them changes nothing."""
    problems = []
    if not VERSION.match(version):
        problems.append("not x.y.z or x.y.z-prerelease (Semantic Versioning, as Helm requires of the "
                        "chart's version)")
    try:
        Version(version)
    except InvalidVersion:
        problems.append("not a PEP 440 version (pyproject.toml): a pre-release is x.y.z-aN, -bN, -rcN or "
                        "-devN, e.g. 1.2.0-rc.1")
    if problems:
        raise ReleaseError(f"not a release version: {version!r}: " + "; ".join(problems))
    changelog_section((root / "CHANGELOG.md").read_text(), version)


def set_version(version: str, root: Path = ROOT) -> list[Path]:
    """Write ``version`` into pyproject.toml, uv.lock and Chart.yaml; returns the files changed.

    Every edit is computed first and the files are written only when all of them apply."""
    if not VERSION.match(version):
        raise ReleaseError(f"not a release version: {version!r} (x.y.z, optionally -suffix)")
    try:
        Version(version)
    except InvalidVersion:
        raise ReleaseError(f"not a release version: {version!r} (not PEP 440)") from None
    edits = [
        (root / "pyproject.toml", re.compile(r'^(version = ")[^"]+(")', re.MULTILINE)),
        (root / "uv.lock", re.compile(r'(\[\[package\]\]\nname = "stageset"\nversion = ")[^"]+(")')),
        (root / "helm" / "stageset" / "Chart.yaml", re.compile(r'^(version: )\S+()', re.MULTILINE)),
        (root / "helm" / "stageset" / "Chart.yaml", re.compile(r'^(appVersion: ")[^"]+(")', re.MULTILINE)),
    ]
    texts = {path: path.read_text() for path, _ in edits}
    updated = dict(texts)
    for path, pattern in edits:
        updated[path], count = pattern.subn(lambda m: f"{m.group(1)}{version}{m.group(2)}", updated[path],
                                            count=1)
        if count != 1:
            raise ReleaseError(f"{path.relative_to(root)}: found no version to set")
    changed = [path for path in texts if updated[path] != texts[path]]
    for path in changed:
        path.write_text(updated[path])
    return changed


def changelog_section(text: str, version: str) -> str:
    """The ``## [version]`` section of a Keep-a-Changelog file (heading included)."""
    heading = re.compile(rf"^## \[{re.escape(version)}\].*$", re.MULTILINE)
    found = heading.search(text)
    if found is None:
        raise ReleaseError(f"CHANGELOG.md has no section for {version}: add `## [{version}] - <date>` "
                           "with what changed (move the Unreleased entries there)")
    following = re.compile(r"^## \[", re.MULTILINE).search(text, found.end())
    section = text[found.start():following.start() if following else len(text)].strip()
    if section == found.group(0).strip():
        raise ReleaseError(f"CHANGELOG.md's section for {version} is empty")
    return section + "\n"


def _run(args: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ReleaseError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout


def package_chart(version: str, out: Path) -> Path:
    helm = str(ensure_helm(log=False))
    with tempfile.TemporaryDirectory(prefix="stageset-helm-") as home:
        env = {**os.environ, "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
               "HELM_DATA_HOME": f"{home}/data"}
        _run([helm, "lint", "--strict", str(CHART)], env=env)
        _run([helm, "package", str(CHART), "--version", version, "--app-version", version,
              "--destination", str(out)], env=env)
    return out / f"stageset-{version}.tgz"


def _commit() -> str:
    try:
        return _run(["git", "rev-parse", "HEAD"], cwd=ROOT).strip()
    except (ReleaseError, OSError):
        return "unknown"


def release_image(archive: Path, version: str, out: Path) -> Path:
    """The ``make image`` archive tagged ``version`` (its config labelled with the version and the
    commit), named ``<chart's repository>:<version>`` for containerd."""
    target = out / f"stageset-{version}.oci.tar"
    with tempfile.TemporaryDirectory(prefix="stageset-release-") as tmp:
        layout = Path(tmp) / "oci"
        layout.mkdir()
        _run(["tar", "--extract", "--file", str(archive), "--directory", str(layout)])
        labels = {"org.opencontainers.image.version": version, "org.opencontainers.image.revision": _commit(),
                  "org.opencontainers.image.source": "https://github.com/stageset/stageset"}
        _run(["umoci", "config", "--image", f"{layout}:{TAG}", "--tag", version, "--no-history",
              "--created", _CREATED, *(f"--config.label={k}={v}" for k, v in labels.items())])
        _run(["umoci", "rm", "--image", f"{layout}:{TAG}"])
        _run(["umoci", "gc", "--layout", str(layout)])
        index_path = layout / "index.json"
        index = json.loads(index_path.read_text())
        (manifest,) = index["manifests"]
        manifest.setdefault("annotations", {}).update({
            "org.opencontainers.image.ref.name": version,
            "io.containerd.image.name": f"{image_repository()}:{version}"})
        index_path.write_text(json.dumps(index, separators=(",", ":")))
        staged = Path(tmp) / "image.oci.tar"
        # Entries without a "./" prefix: scanners (syft) refuse that entry as a path traversal.
        _tar(source=layout, paths=sorted(p.name for p in layout.iterdir()), out=staged)
        shutil.move(staged, target)
    return target


def sbom(image: Path, version: str, out: Path) -> Path:
    target = out / f"stageset-{version}.sbom.cdx.json"
    env = {**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false"}
    _run([str(ensure_syft()), "scan", f"oci-archive:{image}", "--quiet", "--source-name", "stageset",
          "--source-version", version, "-o", f"cyclonedx-json={target}"], env=env)
    return target


def checksums(files: list[Path], out: Path) -> Path:
    lines = []
    for path in sorted(files):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        lines.append(f"{digest.hexdigest()}  {path.name}\n")
    target = out / "SHA256SUMS"
    target.write_text("".join(lines))
    return target


def release(version: str, *, dist: Path, image: Path | None = None,
            platforms: Sequence[Platform] = PLATFORMS) -> list[Path]:
    """Every artifact of ``version`` into ``dist/<version>/`` (the versions must already be set);
    a platform wheel for each of ``platforms`` (the tests pass the host's only)."""
    if current_version() != version:
        raise ReleaseError(f"pyproject.toml says {current_version()}, not {version}: set_version first")
    notes = changelog_section((ROOT / "CHANGELOG.md").read_text(), version)
    out = dist / version
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / f"CHANGELOG-{version}.md").write_text(notes)
    artifacts = [out / f"CHANGELOG-{version}.md", package_chart(version, out)]
    archive = release_image(image or ensure_image(), version, out)
    artifacts += [archive, sbom(archive, version, out)]
    try:
        artifacts += build_wheels(out, platforms=platforms)
    except WheelError as error:
        raise ReleaseError(str(error)) from None
    return [*artifacts, checksums(artifacts, out)]


def main(argv: list[str], *, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(prog="python -m stageset.envtest.release",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("version", help="x.y.z")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="where dist/<version>/ goes")
    args = parser.parse_args(argv)
    try:
        check_version(args.version, root)
        for path in set_version(args.version, root):
            print(f"set version {args.version} in {path.relative_to(root)}", file=sys.stderr)
        for path in release(args.version, dist=args.dist):
            print(path)
    except ReleaseError as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
