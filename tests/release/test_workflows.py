"""The GitHub Actions workflows, checked by ``actionlint`` (built from the Go module proxy): they
cannot run here, so their syntax, expressions, contexts, action inputs and permissions are what
is checked, plus the facts the release depends on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from stageset.controller.settings import DEFAULT_RUNBOOK_BASE_URL
from stageset.envtest.actionlint import ensure_actionlint
from stageset.envtest.publish import chart_repository
from stageset.envtest.release import image_repository

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ensure_actionlint(log=False)), "-no-color", *map(str, files)],
                          capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


def test_the_workflows_pass_actionlint(tmp_path: Path) -> None:
    files = sorted(WORKFLOWS.glob("*.yaml"))
    assert {f.name for f in files} == {"ci.yaml", "release.yaml"}
    result = actionlint(*files)
    assert result.returncode == 0, result.stdout + result.stderr
    # The check can fail: a step that reads an undefined output and an unknown context is refused.
    broken = tmp_path / ".github" / "workflows" / "broken.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text((WORKFLOWS / "release.yaml").read_text().replace(
        "steps.release.outputs.version", "steps.relase.outputs.version", 1))
    refused = actionlint(broken)
    assert refused.returncode != 0
    assert "relase" in refused.stdout


def test_ci_runs_the_test_command_and_release_publishes_the_chart_s_default_image() -> None:
    ci = yaml.safe_load((WORKFLOWS / "ci.yaml").read_text())
    assert "pull_request" in ci[True]  # YAML 1.1 reads the key `on` as True
    assert any(step.get("run", "").strip().endswith("make test") for step in ci["jobs"]["test"]["steps"])
    release = yaml.safe_load((WORKFLOWS / "release.yaml").read_text())
    assert release["env"]["IMAGE"] == image_repository()
    job = release["jobs"]["release"]
    assert job["permissions"] == {"contents": "write", "packages": "write", "id-token": "write"}
    scripts = "\n".join(step.get("run", "") for step in job["steps"])
    # The push is `make publish` (stageset.envtest.publish), the very step tests/node/test_chart.py
    # runs against a loopback registry before it installs the chart from there.
    for needed in ("make test", 'make release VERSION="$version"', "cosign sign --yes", "cosign attest",
                   'make --silent publish VERSION="$VERSION" REGISTRY=ghcr.io'):
        assert needed in scripts, needed
    assert release["env"]["CHARTS"] == f"oci://{chart_repository('ghcr.io')}"
    assert "skopeo copy" not in scripts  # no second way to push
    assert '"$HELM" push' not in scripts


def test_release_publishes_the_wheels_to_pypi_and_the_docs_where_the_runbook_links_point() -> None:
    release = yaml.safe_load((WORKFLOWS / "release.yaml").read_text())
    jobs = release["jobs"]
    steps = jobs["release"]["steps"]
    scripts = "\n".join(step.get("run", "") for step in steps)
    uses = [step.get("uses", "") for step in steps]
    # Every wheel make release built (the platform wheels carry the Go helpers), and nothing else.
    assert 'cp "dist/${VERSION}"/*.whl wheels/' in scripts
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    # PyPI by trusted publishing: an OIDC token of this job, no stored secret.
    pypi = jobs["pypi"]
    assert pypi["needs"] == "release"
    assert pypi["permissions"] == {"id-token": "write"}
    assert any(s.get("uses", "").startswith("pypa/gh-action-pypi-publish@") for s in pypi["steps"])
    assert "secrets." not in yaml.safe_dump(pypi)
    # The docs: built by make docs (mkdocs --strict, offline) and deployed to GitHub Pages, the
    # site mkdocs.yml names, under which the controller's default runbook links live.
    assert "make docs" in scripts
    (pages,) = (s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert pages["with"]["path"] == "site/"
    docs = jobs["docs"]
    assert docs["needs"] == "release"
    assert docs["permissions"] == {"pages": "write", "id-token": "write"}
    assert docs["environment"]["name"] == "github-pages"
    assert any(s.get("uses", "").startswith("actions/deploy-pages@") for s in docs["steps"])
    site_url = next(line.split(": ", 1)[1] for line in (ROOT / "mkdocs.yml").read_text().splitlines()
                    if line.startswith("site_url: "))
    assert site_url + "runbooks/" == DEFAULT_RUNBOOK_BASE_URL
