"""Push what ``make release`` produced to an OCI registry: the image archive and the chart.

``python -m stageset.envtest.publish VERSION --registry HOST`` pushes ``dist/<version>/``:

* the image archive ``stageset-<version>.oci.tar`` to ``HOST/<image path>:<version>`` with
  ``skopeo copy`` (``--preserve-digests``: the digest pushed is the archive's, the one signed);
* the chart ``stageset-<version>.tgz`` to ``oci://HOST/<owner>/charts`` with ``helm push`` (so it is
  ``oci://HOST/<owner>/charts/stageset``, version ``<version>``),

where ``<image path>`` is the chart's default ``image.repository`` without its registry
(``stageset/stageset``) and ``<owner>`` its first part.  So the chart installed from ``HOST`` finds
its image by one value, the registry override: ``--set image.registry=HOST``.  It prints one JSON
object: the two references by digest (what the release workflow signs) and the chart's ``oci://``
address.

The release workflow (``.github/workflows/release.yaml``) runs exactly this against ghcr.io on a
tag; ``tests/node/test_chart.py`` runs it against a loopback registry
(:mod:`stageset.envtest.registry`, ``--plain-http``) and installs from there with one
``helm install``.

Why skopeo (Debian's) pushes the image: it reads the ``oci-archive:`` the release writes as it is
(``crane`` and ``oras`` want an unpacked layout), it is one ``apt-get install`` (no Go build, no
module download; ``hack/bootstrap.sh`` installs it), and it keeps digests
(``--preserve-digests``).  The chart goes with the helm the project builds (:mod:`stageset.envtest.helm`).

Identity: whatever credentials skopeo and helm hold for the registry (``skopeo login`` / ``helm
registry login`` before; none on loopback).  No cluster is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from stageset.envtest.helm import ensure_helm
from stageset.envtest.release import ROOT, ReleaseError, image_repository

_DIGEST = re.compile(r"^Digest:\s*(sha256:[0-9a-f]{64})\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Published:
    version: str
    image: str
    """``HOST/<image path>@sha256:...``"""
    image_tag: str
    """``HOST/<image path>:<version>``"""
    chart: str
    """``HOST/<owner>/charts/stageset@sha256:...``"""
    chart_url: str
    """``oci://HOST/<owner>/charts/stageset``: what ``helm install`` takes, with ``--version``."""


def image_path() -> str:
    """The chart's default image repository without its registry (``stageset/stageset``)."""
    repository = image_repository()
    first, _, rest = repository.partition("/")
    return rest if rest and ("." in first or ":" in first or first == "localhost") else repository


def default_registry() -> str:
    """The registry of the chart's default image (``ghcr.io``)."""
    return image_repository().removesuffix(f"/{image_path()}") or "docker.io"


def chart_repository(registry: str) -> str:
    """``HOST/<owner>/charts``: where ``helm push`` puts the chart."""
    owner = image_path().split("/", 1)[0]
    return f"{registry}/{owner}/charts"


def _run(args: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ReleaseError(f"{' '.join(args)} failed ({result.returncode}):\n"
                           f"{(result.stderr or result.stdout)[-4000:]}")
    return result


def push_image(archive: Path, reference: str, *, plain_http: bool) -> str:
    """``skopeo copy`` of the OCI archive to ``reference``; the digest pushed."""
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise ReleaseError("skopeo is needed to push the image (apt-get install skopeo; "
                           "hack/bootstrap.sh does)")
    with tempfile.TemporaryDirectory(prefix="stageset-publish-") as tmp:
        digestfile = Path(tmp) / "digest"
        _run([skopeo, "copy", "--retry-times", "3", "--preserve-digests", "--digestfile", str(digestfile),
              *(["--dest-tls-verify=false"] if plain_http else []),
              f"oci-archive:{archive}", f"docker://{reference}"])
        return digestfile.read_text().strip()


def push_chart(package: Path, repository: str, *, plain_http: bool, env: dict[str, str] | None = None) -> str:
    """``helm push`` of the packaged chart to ``oci://repository``; the digest pushed."""
    result = _run([str(ensure_helm(log=False)), "push", str(package), f"oci://{repository}",
                   *(["--plain-http"] if plain_http else [])], env=env)
    found = _DIGEST.search(result.stdout + result.stderr)
    if found is None:
        raise ReleaseError(f"helm push printed no digest:\n{result.stdout}{result.stderr}")
    return found.group(1)


def publish(version: str, *, dist: Path, registry: str, plain_http: bool = False,
            helm_env: dict[str, str] | None = None) -> Published:
    """Push ``dist/<version>/``'s image archive and chart to ``registry`` (see the module)."""
    out = dist / version
    archive, package = out / f"stageset-{version}.oci.tar", out / f"stageset-{version}.tgz"
    for path in (archive, package):
        if not path.is_file():
            raise ReleaseError(f"{path} is missing: run `make release VERSION={version}` first")
    registry = registry.rstrip("/")
    image = f"{registry}/{image_path()}"
    image_digest = push_image(archive, f"{image}:{version}", plain_http=plain_http)
    charts = chart_repository(registry)
    chart_digest = push_chart(package, charts, plain_http=plain_http, env=helm_env)
    return Published(version=version, image=f"{image}@{image_digest}", image_tag=f"{image}:{version}",
                     chart=f"{charts}/stageset@{chart_digest}", chart_url=f"oci://{charts}/stageset")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m stageset.envtest.publish",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("version", help="x.y.z (dist/<version>/ made by `make release`)")
    parser.add_argument("--registry", default=default_registry(),
                        help=f"the registry host (default: the chart's, {default_registry()})")
    parser.add_argument("--plain-http", action="store_true", help="a registry without TLS (loopback only)")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist")
    args = parser.parse_args(argv)
    try:
        published = publish(args.version, dist=args.dist, registry=args.registry, plain_http=args.plain_http,
                            helm_env=dict(os.environ))
    except ReleaseError as error:
        print(f"publish: {error}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(published)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
