"""The Containerfile and the daemonless build agree, and its pins are the project's (no root needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stageset.envtest.image import CONTAINERFILE, ImageBuildError, containerfile_settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_settings_the_daemonless_build_reads() -> None:
    settings = containerfile_settings()
    assert settings.suite == "bookworm"
    assert set(settings.packages) == {"python3", "libstdc++6", "openssh-client", "ca-certificates"}
    assert settings.uid == 65532
    assert settings.user == "65532:65532"
    assert settings.entrypoint == ("/opt/stageset/bin/stageset", "controller")
    assert settings.env["STAGESET_KUSTOMIZE_BUILDER"] == "/usr/local/bin/stageset-kustomize"
    assert settings.env["PYTHONDONTWRITEBYTECODE"] == "1"  # read-only root filesystem


def test_the_containerfile_pins_the_project_s_versions() -> None:
    text = CONTAINERFILE.read_text()
    bootstrap = (ROOT / "hack" / "bootstrap.sh").read_text()
    uv = re.search(r"^UV_VERSION=(\S+)$", bootstrap, re.MULTILINE)
    assert uv is not None
    assert f"uv=={uv.group(1)}" in text
    go = re.search(r"^go (\d+\.\d+)", (ROOT / "hack" / "kustomize" / "go.mod").read_text(), re.MULTILINE)
    assert go is not None
    assert f"ARG GO_VERSION={go.group(1)}" in text
    for ignore in (".containerignore", ".dockerignore"):
        assert ".venv" in (ROOT / ignore).read_text().split()


@pytest.mark.parametrize(("broken", "message"), [
    ("USER 0:0", "USER must be the numeric non-root"),
    ("USER stageset", "USER must be the numeric non-root"),
    ("ENTRYPOINT_GONE", "ENTRYPOINT"),
])
def test_a_containerfile_that_drifts_is_refused(broken: str, message: str) -> None:
    text = CONTAINERFILE.read_text()
    if broken == "ENTRYPOINT_GONE":
        text = re.sub(r"^ENTRYPOINT .*$", "", text, flags=re.MULTILINE)
    else:
        text = re.sub(r"^USER .*$", broken, text, flags=re.MULTILINE)
    with pytest.raises(ImageBuildError, match=message):
        containerfile_settings(text)
