"""The GitHub Actions workflows, checked by ``actionlint`` (built from the Go module proxy): they
cannot run here, so their syntax, expressions, contexts, action inputs and permissions are what
is checked, plus the facts the release depends on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from stageset.envtest.actionlint import ensure_actionlint
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
    for needed in ("make test", 'make release VERSION="$version"', "cosign sign --yes", "cosign attest",
                   '"$HELM" push'):
        assert needed in scripts, needed
