"""The pure parts of ``check``/``version``: the flags a Deployment runs with, a controller's version."""

from __future__ import annotations

import pytest

from stageset.cli.check import Controller, parse_flags


def test_flags_as_the_controller_parses_them() -> None:
    assert parse_flags(["--workers=4", "--leader-elect", "--watch-namespaces=a,b", "positional",
                        "--workers=8"]) == {"workers": "8", "leader-elect": "true", "watch-namespaces": "a,b"}


@pytest.mark.parametrize(("image", "version"), [
    ("ghcr.io/stageset/stageset:0.3.1", "0.3.1"),
    ("localhost:5000/platform/stageset:1.2.0", "1.2.0"),
    ("localhost:5000/platform/stageset", "0.3.0"),  # no tag: the chart's appVersion
    ("ghcr.io/stageset/stageset@sha256:" + "a" * 64, "0.3.0"),  # pinned by digest
])
def test_a_controller_s_version_is_its_image_tag_else_the_chart_s(image: str, version: str) -> None:
    controller = Controller(namespace="ns", name="stageset", release="stageset", chart="stageset-0.3.0",
                            image=image, service_account="stageset", flags={}, replicas=1, ready=1,
                            app_version="0.3.0")
    assert controller.version == version
