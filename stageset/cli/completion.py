"""``completion``: the shell completion script of ``stageset`` (click's own completion).

``source <(stageset completion bash)``, ``stageset completion zsh > "${fpath[1]}/_stageset"``,
``stageset completion fish > ~/.config/fish/completions/stageset.fish``.  The script calls
``stageset`` back with ``_STAGESET_COMPLETE`` set; click answers with the commands, options and
choices of the command line typed so far (hidden commands such as ``run`` are not offered).

Identity: none (prints text; completing talks to no cluster).
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from stageset.cli.session import echo

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_STAGESET_COMPLETE"


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish).

    bash: `source <(stageset completion bash)` (or save it under /etc/bash_completion.d/);
    zsh: `stageset completion zsh > "${fpath[1]}/_stageset"`;
    fish: `stageset completion fish > ~/.config/fish/completions/stageset.fish`.
    """
    root = ctx.find_root().command
    complete = get_completion_class(shell)
    assert complete is not None  # every name in SHELLS is one of click's
    echo(complete(root, {}, "stageset", COMPLETE_VAR).source())
