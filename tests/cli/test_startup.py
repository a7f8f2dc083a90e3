"""A bare start of the CLI imports almost nothing: ``stageset --version``, ``--help`` and a TAB on
the first word load ``click`` and the root group, never the Kubernetes client, the API models or
the controller (their CPU is measured beside kubectl's by ``bench/cli_start.py``).  And the
root group's table (each command's module, short help and hidden flag, read without importing the
command) says what the commands themselves say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import click
import pytest

from stageset.cli.root import COMMANDS, main

# What may be imported by a bare start besides the standard library and click.
OURS = {"stageset", "stageset.cli", "stageset.cli.root"}
HEAVY = ("kubernetes", "pydantic", "yaml", "dulwich", "pycurl", "urllib3", "networkx", "starlette", "jinja2",
         "cryptography", "stageset.kube", "stageset.api", "stageset.controller", "sources")

_DRIVER = """
import atexit, json, os, sys
atexit.register(lambda: open(os.environ["MODULES_OUT"], "w").write(json.dumps(sorted(sys.modules))))
from stageset.cli.root import main
main(prog_name="stageset")
"""


def modules_of(*args: str, env: dict[str, str] | None = None) -> tuple[set[str], str]:
    """The modules a start of ``stageset ARGS`` had imported when it exited, and what it printed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "modules.json")
        result = subprocess.run([sys.executable, "-c", _DRIVER, *args], capture_output=True, text=True,
                                env={**os.environ, "KUBECONFIG": "/nonexistent", "MODULES_OUT": out,
                                     **(env or {})}, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        with open(out) as listed:
            return set(json.load(listed)), result.stdout


@pytest.mark.parametrize(("args", "env", "printed"), [
    (("--version",), {}, "stageset, version "),
    (("--help",), {}, "Commands:"),
    ((), {"_STAGESET_COMPLETE": "bash_complete", "COMP_WORDS": "stageset g", "COMP_CWORD": "1"}, "plain,get"),
], ids=["version", "help", "completion"])
def test_a_bare_start_imports_no_command(args: tuple[str, ...], env: dict[str, str], printed: str) -> None:
    modules, out = modules_of(*args, env=env)
    assert printed in out
    ours = {m for m in modules if m == "stageset" or m.startswith(("stageset.", "sources"))}
    assert ours <= OURS, sorted(ours - OURS)
    heavy = sorted(m for m in modules if m.startswith(HEAVY))
    assert not heavy, heavy


def test_a_command_loads_what_it_needs_and_not_the_controller() -> None:
    modules, _ = modules_of("get", "--help")
    assert "stageset.cli.inspect" in modules
    assert "stageset.controller.manager" not in modules


def test_the_table_says_what_each_command_says() -> None:
    for name, entry in COMMANDS.items():
        command = entry.load()
        assert command.name in (name, None) or name in ("get", "reconcile", "suspend", "resume"), name
        assert command.hidden == entry.hidden, name
        for limit in (30, 45, 80, 200):
            stand_in = click.Command(name, help=entry.summary).get_short_help_str(limit)
            assert stand_in == command.get_short_help_str(limit), (name, limit)
    # Every command is in the table: nothing is registered elsewhere.
    assert set(main.list_commands(click.Context(main))) == set(COMMANDS)


def test_help_lists_what_an_eager_group_would() -> None:
    """The help page and the completion of a command name, written from the table, are the ones click
    writes from the loaded commands."""
    eager = click.Group("stageset", commands={name: entry.load() for name, entry in COMMANDS.items()})
    context = click.Context(main, info_name="stageset")
    lazy_help = main.get_help(context)
    eager_help = eager.get_help(click.Context(eager, info_name="stageset"))
    assert lazy_help.split("Commands:")[1] == eager_help.split("Commands:")[1]
    offered = [item.value for item in main.shell_complete(context, "re")]
    assert offered == ["reconcile", "resume"]  # `run` is hidden
