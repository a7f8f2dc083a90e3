"""``completion``: the shell completion script of ``stageset`` (click's own completion, and ours
for PowerShell), and the names it completes from the cluster.

``source <(stageset completion bash)``, ``stageset completion zsh > "${fpath[1]}/_stageset"``,
``stageset completion fish > ~/.config/fish/completions/stageset.fish``,
``stageset completion powershell | Out-String | Invoke-Expression``.  The script calls
``stageset`` back with ``_STAGESET_COMPLETE`` set; click answers with the commands, options and
choices of the command line typed so far (hidden commands such as ``run`` are not offered), and
-- dynamically -- the StageSets (a command's ``NAME``), their stages (``--stage``), the
GitRepositories (the ``source git`` verbs' ``NAME``) and the namespaces (``-n``) the cluster has.

Identity: printing a script talks to no cluster.  Completing a name reads as the user, with the
kubeconfig, context, namespace and ``--as`` typed so far on the command line (a list of
StageSets or namespaces, a get of one StageSet), each with a short timeout; any failure (no
kubeconfig, no right to list, an unreachable cluster) completes nothing and prints nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click
from click.shell_completion import (
    CompletionItem,
    ShellComplete,
    add_completion_class,
    get_completion_class,
    split_arg_string,
)

from stageset.cli.session import Session, echo
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS

SHELLS = ("bash", "zsh", "fish", "powershell")
COMPLETE_VAR = "_STAGESET_COMPLETE"
TIMEOUT = 3.0  # seconds one completion request may take: a shell waits for it

_POWERSHELL = r"""
Register-ArgumentCompleter -Native -CommandName %(prog_name)s -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)
    $line = $commandAst.ToString()
    $typed = $line.Substring(0, [Math]::Min($line.Length, $cursorPosition - $commandAst.Extent.StartOffset))
    $env:%(complete_var)s = "powershell_complete"
    $env:COMP_WORDS = $typed
    $env:COMP_CWORD = $wordToComplete
    try {
        %(prog_name)s | ForEach-Object {
            $kind, $value, $help = $_ -split "`t", 3
            if (-not $help) { $help = $value }
            [System.Management.Automation.CompletionResult]::new($value, $value, 'ParameterValue', $help)
        }
    } finally {
        Remove-Item Env:%(complete_var)s, Env:COMP_WORDS, Env:COMP_CWORD -ErrorAction SilentlyContinue
    }
}
"""


class PowerShellComplete(ShellComplete):
    """PowerShell (Windows PowerShell 5.1 and pwsh 7): a native argument completer that sends the
    line typed up to the cursor (``COMP_WORDS``) and the word under it (``COMP_CWORD``); answers
    one ``type<TAB>value<TAB>help`` line per completion."""

    name = "powershell"
    source_template = _POWERSHELL

    def get_completion_args(self) -> tuple[list[str], str]:
        words = split_arg_string(os.environ.get("COMP_WORDS", ""))
        incomplete = os.environ.get("COMP_CWORD", "")
        args = words[1:]
        if incomplete and args and args[-1] == incomplete:
            args.pop()
        return args, incomplete

    def format_completion(self, item: CompletionItem[str]) -> str:
        help_ = (item.help or "").replace("\n", " ").replace("\t", " ")
        return f"{item.type}\t{item.value}\t{help_}"


add_completion_class(PowerShellComplete)


# -- names from the cluster -------------------------------------------------------------------------

def _session(ctx: click.Context) -> Session:
    """The session the command line typed so far names (the root context has no cluster flags)."""
    params: dict[str, Any] = {}
    for found in reversed(list(_lineage(ctx))):
        params.update({k: v for k, v in found.params.items() if v is not None})
    return Session(kubeconfig=params.get("kubeconfig"), context=params.get("context"),
                   namespace_flag=params.get("namespace"), as_user=params.get("as_user"),
                   as_groups=tuple(params.get("as_groups") or ()))


def _lineage(ctx: click.Context) -> list[click.Context]:
    found: list[click.Context] = []
    current: click.Context | None = ctx
    while current is not None:
        found.append(current)
        current = current.parent
    return found


def _names(ctx: click.Context, incomplete: str, read: Callable[[Session], list[str]]) -> list[str]:
    session = _session(ctx)
    try:
        names = read(session)
    except Exception:  # completing must never print an error into the user's shell
        return []
    finally:
        session.close()
    return sorted(n for n in names if n.startswith(incomplete))


def _item_names(listed: dict[str, Any]) -> list[str]:
    return [str((item.get("metadata") or {}).get("name", "")) for item in listed.get("items") or []]


def complete_stagesets(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """The StageSets of the namespace typed so far (else the context's)."""
    return _names(ctx, incomplete, lambda s: _item_names(s.client().request(
        "GET", STAGESETS.collection_path(s.namespace), timeout=TIMEOUT)))


def complete_gitrepositories(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """The GitRepositories of the namespace typed so far (else the context's)."""
    return _names(ctx, incomplete, lambda s: _item_names(s.client().request(
        "GET", GITREPOSITORIES.collection_path(s.namespace), timeout=TIMEOUT)))


def complete_nothing(_ctx: click.Context, _param: click.Parameter, _incomplete: str) -> list[str]:
    """A name that is new (``create stageset NAME``) or not a StageSet's: nothing to offer."""
    return []


def complete_namespaces(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """The namespaces you may list (none when you may not list namespaces)."""
    return _names(ctx, incomplete, lambda s: _item_names(s.client().request(
        "GET", "/api/v1/namespaces", timeout=TIMEOUT)))


def complete_stages(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """The stages of the StageSet named so far on the command line (its ``NAME``)."""
    # Completing an option's value, click's resilient parsing leaves the positional NAME unparsed
    # (in ``ctx.args``) when the option comes after it.
    name = ctx.params.get("name") or (ctx.args[0] if ctx.args else None)
    if not name:
        return []
    return _names(ctx, incomplete, lambda s: [str(stage.get("name")) for stage in (s.client().request(
        "GET", STAGESETS.object_path(name=str(name), namespace=s.namespace), timeout=TIMEOUT
    ).get("spec") or {}).get("stages") or []])


def attach(command: click.Command) -> None:
    """Complete the command's StageSet ``NAME`` argument, ``--stage`` and ``-n``/``--namespace``
    options from the cluster (those without a completion of their own): one place, so a new command
    gets it -- also under a verb's or a group's subcommands (``get``'s StageSet form, ``delete
    stageset``).  The root group calls it for each command as it loads it (:mod:`stageset.cli.root`).
    The session's options (:mod:`stageset.cli.session`) name no completion: this module reads the
    cluster through a session, never the other way round."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            attach(sub)
        return
    for param in command.params:
        if param._custom_shell_complete is not None:
            continue
        if isinstance(param, click.Argument) and param.name == "name":
            param._custom_shell_complete = complete_stagesets
        elif isinstance(param, click.Option) and param.name == "stage":
            param._custom_shell_complete = complete_stages
        elif isinstance(param, click.Option) and param.name == "namespace":
            param._custom_shell_complete = complete_namespaces


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh, fish or powershell).

    bash: `source <(stageset completion bash)` (or save it under /etc/bash_completion.d/);
    zsh: `stageset completion zsh > "${fpath[1]}/_stageset"`;
    fish: `stageset completion fish > ~/.config/fish/completions/stageset.fish`;
    powershell: `stageset completion powershell | Out-String | Invoke-Expression` (add it to
    your $PROFILE to keep it).  Besides commands and flags, it completes StageSet names,
    stage names (--stage) and namespaces (-n) from the cluster, read as you.
    """
    root = ctx.find_root().command
    complete = get_completion_class(shell)
    assert complete is not None  # every name in SHELLS is registered
    echo(complete(root, {}, "stageset", COMPLETE_VAR).source())
