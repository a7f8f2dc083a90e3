"""Verbs that act on StageSets by default and on other kinds when named: ``get`` and ``get sources
git``, ``reconcile NAME`` and ``reconcile source git NAME`` (flux's shapes).

Identity: none; this module only routes a command line to the command that serves it.

Invariant: the bare verb is exactly the StageSet command it always was (``stageset get shop -n
shop``, ``stageset get -A``, ``stageset get --help``): a line whose first word is not one of the
verb's kind words (``source``, ``sources``, ``stagesets``) is handed to the StageSet command
whole.  A StageSet that is itself named like a kind word is reached as ``stageset get stagesets
sources``.
"""

from __future__ import annotations

import click

from stageset.cli.session import StagesetGroup

STAGESETS_WORD = "stagesets"
"""The StageSet command's own name under the verb (``stageset get stagesets``): an explicit form."""


class VerbGroup(StagesetGroup):
    """A verb whose default command (its StageSet form) runs unless a kind word comes first."""

    def __init__(self, default: click.Command) -> None:
        super().__init__(name=default.name, help=default.help, short_help=default.short_help)
        self.default = default
        self.add_command(default, STAGESETS_WORD)

    def _routed(self, args: list[str]) -> list[str]:
        if args and args[0] in self.commands:
            return args
        return [STAGESETS_WORD, *args]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._routed(args))

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        return super().resolve_command(ctx, self._routed(args))

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The kind words only: the default is the verb itself (documented as such)."""
        return [name for name in super().list_commands(ctx) if name != STAGESETS_WORD]


def verb(default: click.Command, *kinds: click.Command) -> VerbGroup:
    """``default`` (the StageSet command) as a verb with the kind subcommands ``kinds``."""
    group = VerbGroup(default)
    for kind in kinds:
        group.add_command(kind)
        # `stageset get --help` is the StageSet command's help: it names the other forms.
        forms = ", ".join(f"`stageset {group.name} {kind.name} {sub}`"
                          for sub in (kind.commands if isinstance(kind, click.Group) else {}))
        default.epilog = f"{default.epilog}\n\n" if default.epilog else ""
        default.epilog += f"Other kinds: {forms}."
    return group
