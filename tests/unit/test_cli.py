"""Command-line parsing."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner
from pytest_mock import MockerFixture

from sources import Limits
from stageset.cli.main import parse_size
from stageset.controller.settings import ControllerSettings


def test_sizes_parse_like_kubernetes_quantities() -> None:
    assert parse_size("2Gi") == 2 * 2**30
    assert parse_size("500M") == 500 * 10**6
    assert parse_size("1048576") == 1048576
    with pytest.raises(click.BadParameter):
        parse_size("lots")


def test_source_flags_reach_the_settings(mocker: MockerFixture) -> None:
    """--allow-insecure-sources allows http only; local sources and limits have their own flags."""
    cli = importlib.import_module("stageset.cli.main")
    seen: dict[str, ControllerSettings] = {}

    class FakeManager:
        def __init__(self, *, clients: object, settings: ControllerSettings) -> None:
            del clients
            seen["settings"] = settings

    mocker.patch.object(cli, "Manager", FakeManager)
    mocker.patch.object(cli, "run_controller", return_value=None)
    mocker.patch.object(cli.ClientPool, "from_kubeconfig", return_value=mocker.Mock())
    result = CliRunner().invoke(cli.main, [
        "controller", "--allow-insecure-sources", "--git-max-file-size", "1Mi",
        "--git-max-read-size", "20Mi", "--git-max-files", "50", "--git-max-fetch-size", "64Mi"])
    assert result.exit_code == 0, result.output
    settings = seen["settings"]
    assert settings.allow_insecure_sources
    assert not settings.allow_local_sources
    assert settings.source_limits == Limits(max_file_bytes=2**20, max_total_bytes=20 * 2**20,
                                            max_files=50, max_fetch_bytes=64 * 2**20)
    result = CliRunner().invoke(cli.main, ["controller", "--allow-local-sources"])
    assert result.exit_code == 0, result.output
    assert seen["settings"].allow_local_sources
    assert not seen["settings"].allow_insecure_sources
    assert seen["settings"].source_limits == Limits()
