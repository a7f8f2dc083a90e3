"""The ``stageset`` command group, loading each command's module only when that command runs.

``stageset --version``, ``stageset --help`` and a TAB on the command's first word import this
module and ``click`` and nothing else: the table :data:`COMMANDS` names each command's module, its
short help and whether it is hidden, so the help page and the completion of command names are
written without importing a command.  ``stageset get ...`` imports what ``get`` needs (the
Kubernetes client, the API models) and not the controller; ``stageset controller`` imports the
controller.  ``tests/cli/test_startup.py`` keeps the table equal to the commands and checks what a
bare start imports; ``bench/cli_start.py`` measures its CPU beside kubectl's.

Identity: none (no command runs here; each command module states its own).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from click.shell_completion import CompletionItem


@dataclass(frozen=True)
class Lazy:
    """Where a command lives (``module:attribute``: a command, or a function returning one) and
    what ``--help`` and completion say of it before it is loaded."""

    target: str
    summary: str
    """The first paragraph of the command's help (its short help is made from it, as click does)."""
    hidden: bool = False

    def load(self) -> click.Command:
        module, _, attribute = self.target.partition(":")
        found: Any = getattr(importlib.import_module(module), attribute)
        command = found if isinstance(found, click.Command) else found()
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.target} is not a click command")
        return command


# The commands, in the order ``stageset --help`` lists them (alphabetical, as click does).
COMMANDS: dict[str, Lazy] = {
    "build": Lazy("stageset.cli.preview:build",
                  "Render every stage of a StageSet as the controller would: manifests with substitutions."),
    "check": Lazy("stageset.cli.check:check",
                  "Check the cluster (and with the controller installed, its health), as `flux check` does."),
    "cleanup": Lazy("stageset.cli.cleanup:cleanup",
                  "Delete every StageSet of the namespaces and wait until the controller tore them down."),
    "completion": Lazy("stageset.cli.completion:completion",
                  "Print the completion script for SHELL (bash, zsh, fish or powershell)."),
    "controller": Lazy("stageset.cli.main:controller",
                  "Run the controller against a cluster."),
    "crds": Lazy("stageset.cli.crds:crds",
                  "Print the CustomResourceDefinitions, or apply them with --apply."),
    "create": Lazy("stageset.cli.authoring:create_group",
                  "Create a tenant, a StageSet or a GitRepository (source git)."),
    "dashboard": Lazy("stageset.cli.dashboard.command:dashboard",
                  "Serve a live web view of StageSets: their stage graph, release history, objects (live YAML"
                  " and diff) and events."),
    "delete": Lazy("stageset.cli.authoring:delete_group",
                  "Delete a tenant, a StageSet or a GitRepository (source git)."),
    "diff": Lazy("stageset.cli.preview:diff",
                  "Show what applying a StageSet would change: a server-side dry-run as its ServiceAccount, "
                  "what prune would delete, as a unified diff (Secret values masked), and which of its "
                  "stages' pre and post actions would run (or be skipped: they ran for this revision)."),
    "events": Lazy("stageset.cli.inspect:events",
                  "Show the events of a StageSet (and of its sources), oldest first."),
    "export": Lazy("stageset.cli.export:export",
                  "Print StageSets or GitRepositories as YAML to apply again (no status, nothing the cluster "
                  "keeps)."),
    "get": Lazy("stageset.cli.verbcommands:get",
                  "Show StageSets: ready state, each stage's phase and revision."),
    "graph": Lazy("stageset.cli.inspect:graph",
                  "Show the stage graph (which stage runs after which) and what this one waits for: the "
                  "StageSets and objects of other kinds in spec.dependsOn, each with its state as you read "
                  "it."),
    "history": Lazy("stageset.cli.history:history",
                  "Show the releases each stage of a StageSet applied, newest first: when, which revision and"
                  " spec generation, the phase it reached, and what it wrote; and its failed attempts "
                  "(nothing applied) with their reason."),
    "logs": Lazy("stageset.cli.controllerlogs:logs",
                  "Print the controller's log lines about a StageSet, as flux logs does."),
    "promote": Lazy("stageset.cli.promote:promote",
                  "Promote STAGE of StageSet NAME past its promotion gate (a soak, requireManualPromotion)."),
    "reconcile": Lazy("stageset.cli.verbcommands:reconcile",
                  "Ask the controller to reconcile a StageSet now (reconcile.fluxcd.io/requestedAt)."),
    "resume": Lazy("stageset.cli.verbcommands:resume",
                  "Resume a suspended StageSet (spec.suspend=false) and reconcile it now."),
    "run": Lazy("stageset.cli.main:run",
                  "The main job: reconcile the example on a local control plane (or run against "
                  "--kubeconfig).", hidden=True),
    "suspend": Lazy("stageset.cli.verbcommands:suspend",
                  "Stop reconciling a StageSet (spec.suspend=true); its objects stay as they are."),
    "trace": Lazy("stageset.cli.trace:trace",
                  "Show which StageSet, stage, revision and source own an object (KIND NAME or KIND/NAME)."),
    "tree": Lazy("stageset.cli.inspect:tree",
                  "Show a StageSet's stages and the objects each one applied, with their readiness."),
    "uninstall": Lazy("stageset.cli.uninstall:uninstall",
                  "Uninstall a release of the chart without leaving a StageSet stuck with its finalizer."),
    "version": Lazy("stageset.cli.check:version",
                  "Print the versions of this CLI, the apiserver and every installed controller."),
}


class _Commands(dict[str, click.Command]):
    """The group's commands: one not loaded yet is loaded when asked for by name."""

    def __init__(self, group: LazyGroup) -> None:
        super().__init__()
        self._group = group

    def __missing__(self, name: str) -> click.Command:
        command = self._group.load(name)
        if command is None:
            raise KeyError(name)
        return command

    def loaded(self, name: str) -> click.Command | None:
        """The command if it is loaded already (never loads it)."""
        return super().get(name)


def _translate(error: Exception) -> click.ClickException | None:
    """The one-line error (exit code 3) for the errors every command can meet, or None."""
    from stageset.cli.session import translated

    return translated(error)


class LazyGroup(click.Group):
    """A group whose commands come from :data:`COMMANDS`, each imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, Lazy] | None = None,
                 on_load: Callable[[click.Command], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})
        self.on_load = on_load
        self._loaded = _Commands(self)
        self._loaded.update(self.commands)
        self.commands = self._loaded

    def load(self, name: str) -> click.Command | None:
        if (command := self._loaded.loaded(name)) is not None:
            return command
        entry = self.lazy.get(name)
        if entry is None:
            return None
        command = entry.load()
        from stageset.cli.completion import attach  # every command's NAME, --stage and -n complete

        attach(command)
        self._loaded[name] = command
        return command

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        del ctx
        return self.load(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        del ctx
        return sorted({*self._loaded.keys(), *self.lazy})

    def _summary(self, name: str, limit: int) -> tuple[str, bool] | None:
        """(short help, hidden) of ``name`` without loading it when it is not loaded yet."""
        if (command := self._loaded.loaded(name)) is not None:
            return command.get_short_help_str(limit), command.hidden
        entry = self.lazy.get(name)
        if entry is None:
            return None
        # Click's own short help, of a stand-in carrying the summary (no import of the command).
        return click.Command(name, help=entry.summary).get_short_help_str(limit), entry.hidden

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = [n for n in self.list_commands(ctx) if (found := self._summary(n, 45)) and not found[1]]
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, self._summary(n, limit)[0]) for n in names]  # type: ignore[index]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem[str]]:
        items = []
        for name in self.list_commands(ctx):
            found = self._summary(name, 45)
            if name.startswith(incomplete) and found is not None and not found[1]:
                items.append(CompletionItem(name, help=found[0]))
        # The group's own options (click.Command's completion), after the command names.
        items.extend(click.Command.shell_complete(self, ctx, incomplete))
        return items

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except Exception as error:
            translated = _translate(error)
            if translated is None:
                raise
            raise translated from None


@click.group(cls=LazyGroup, lazy=COMMANDS)
@click.version_option(package_name="stageset", prog_name="stageset")
def main() -> None:
    """stageset: staged GitOps for Kubernetes, applied as the tenant.

    Exit codes: 0 ok, 1 differences found (diff), 2 usage error, 3 runtime error.
    """
    import logging

    # Library chatter (dulwich's protocol notes) is not for the user of a command.
    logging.getLogger("dulwich").setLevel(logging.ERROR)


def kubectl_plugin() -> None:
    """``kubectl stageset ...``: kubectl runs the ``kubectl-stageset`` executable it finds on PATH."""
    main(prog_name="kubectl stageset")
