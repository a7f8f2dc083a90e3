"""Command-line parsing."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner
from pytest_mock import MockerFixture

from sources import Limits
from stageset.cli.params import parse_duration_option, parse_size
from stageset.controller.settings import ControllerSettings


@pytest.mark.parametrize(("text", "size"), [
    ("2Gi", 2 * 2**30), ("500M", 500 * 10**6), ("500Mi", 500 * 2**20), ("1048576", 1048576),
    ("1k", 1000), ("1Ki", 1024), ("1.5Ki", 1536),
])
def test_sizes_parse_as_kubernetes_quantities(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "500m", "1.5", "-1", "2gi", ""])
def test_sizes_that_are_not_whole_bytes_are_refused(text: str) -> None:
    # 500m is 0.5 (milli): it must never mean 500 megabytes.
    with pytest.raises(click.BadParameter):
        parse_size(text)


def test_duration_flags() -> None:
    assert parse_duration_option("3s") == 3.0
    assert parse_duration_option("5m") == 300.0
    with pytest.raises(click.BadParameter):
        parse_duration_option("5 minutes")


def test_source_flags_reach_the_settings(mocker: MockerFixture) -> None:
    """--allow-insecure-sources allows http only; local sources and limits have their own flags."""
    cli = importlib.import_module("stageset.cli.main")
    seen: dict[str, ControllerSettings] = {}

    class FakeManager:
        def __init__(self, *, clients: object, settings: ControllerSettings, **_: object) -> None:
            del clients
            seen["settings"] = settings

    mocker.patch.object(cli, "Manager", FakeManager)
    mocker.patch.object(cli, "run_controller", return_value=None)
    mocker.patch.object(cli.process, "exit_stopped", return_value=None)  # the real one ends the process
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


def test_get_and_tree_show_each_stages_gate_and_what_holds_the_release() -> None:
    from stageset.cli.inspect import gate_text, render_tree, steering_lines, summary

    obj = {"metadata": {"namespace": "shop", "name": "shop"},
           "spec": {"stages": [{"name": "staging"}, {"name": "prod"}]},
           "status": {"stages": [{"name": "staging", "phase": "Ready", "revision": "main@sha1:" + "a" * 40,
                                  "promotionState": {"phase": "Soaking",
                                                     "soakUntil": "2030-01-01T00:10:00Z"}}],
                      "pendingUpdate": {"revisions": {"shop/app": "main@sha1:" + "b" * 40},
                                        "nextWindowOpens": "2030-01-06T07:00:00Z"}}}
    view = summary(obj)
    assert gate_text(view["stages"][0]["promotionState"]) == "Soaking until 2030-01-01T00:10:00Z"
    assert gate_text(None) == "-"
    assert gate_text({"phase": "AwaitingManual"}) == "AwaitingManual (stageset promote)"
    [held] = steering_lines(view)
    assert held.startswith("held by update windows until 2030-01-06T07:00:00Z: shop/app: main@sha1:")
    tree = render_tree({**view, "stages": [{**s, "objects": []} for s in view["stages"]]})
    assert "stage staging  Ready  main@sha1:aaaaaaaaaaaa  [Soaking until 2030-01-01T00:10:00Z]" in tree
    assert "held by update windows" in tree
    assert view["target"] is None


def test_get_and_tree_name_the_target_cluster() -> None:
    from stageset.cli.inspect import list_table, render_tree, summary

    obj = {"metadata": {"namespace": "shop", "name": "shop"},
           "spec": {"stages": [{"name": "app"}], "targetRef": {"name": "prod-eu", "namespace": "platform"}}}
    view = summary(obj)
    assert view["target"] == "StageTarget platform/prod-eu"
    assert "on StageTarget platform/prod-eu" in render_tree({**view, "stages": []})
    headers, rows = list_table([view], every=False, wide=True)
    assert rows[0][headers.index("TARGET")] == "StageTarget platform/prod-eu"
    remote = summary({**obj, "spec": {"stages": [], "kubeConfig": {"secretRef": {"name": "prod-kc"}}}})
    assert remote["target"] == "kubeConfig Secret prod-kc"


def test_get_and_tree_show_what_a_warn_stageset_left_drifted() -> None:
    from stageset.cli.inspect import list_table, render_tree, steering_lines, summary

    message = "1 object differs from what was applied and was left as found: ConfigMap shop/a (data.k)"
    obj = {"metadata": {"namespace": "shop", "name": "shop"},
           "spec": {"stages": [{"name": "app"}], "driftDetection": {"mode": "Warn"}},
           "status": {"conditions": [{"type": "Drifted", "status": "True", "reason": "DriftDetected",
                                      "message": message}],
                      "drifted": [{"stage": "app", "id": "shop_a__ConfigMap", "fields": ["data.k"]},
                                  {"stage": "app", "id": "shop_b__ConfigMap", "deleted": True}]}}
    view = summary(obj)
    assert steering_lines(view) == [f"drifted: {message}"]
    headers, rows = list_table([view], every=False, wide=False)
    assert rows[0][headers.index("DRIFTED")] == "2"
    # A list without Warn and without drift has no such column.
    plain = summary({**obj, "spec": {"stages": [{"name": "app"}]}, "status": {}})
    assert "DRIFTED" not in list_table([plain], every=False, wide=False)[0]
    objects = [{"kind": "ConfigMap", "namespace": "shop", "name": n, "status": "Current", "message": "",
                **({"drifted": d} if d else {})}
               for n, d in (("a", {"fields": ["data.k"]}), ("b", {"deleted": True}), ("c", None))]
    tree = render_tree({**view, "stages": [{**view["stages"][0], "objects": objects}]})
    assert "ConfigMap/shop/a  Current  [drifted: data.k]" in tree
    assert "ConfigMap/shop/b  Current  [drifted: deleted]" in tree
    assert "ConfigMap/shop/c  Current\n" in tree


def test_every_sessions_namespace_option_completes_namespaces_from_the_cluster() -> None:
    """The session's ``-n`` names no completion (no import of the completion module from the session);
    ``completion.attach`` gives it one on every command, as it does ``NAME`` and ``--stage``."""
    from stageset.cli.completion import complete_namespaces
    from stageset.cli.root import main

    def commands(group: click.Group) -> list[click.Command]:
        found: list[click.Command] = []
        with click.Context(group) as ctx:
            for name in group.list_commands(ctx):
                command = group.get_command(ctx, name)  # loaded as a run would load it
                assert command is not None
                found.extend(commands(command) if isinstance(command, click.Group) else [command])
        return found

    options = [p for c in commands(main) for p in c.params
               if isinstance(p, click.Option) and p.name == "namespace"]
    assert len(options) > 10, "the session's commands"
    assert all(p._custom_shell_complete is complete_namespaces for p in options)
