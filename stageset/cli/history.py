"""``stageset history NAME``: each stage's last applied releases, from ``status.history``.

Identity: the user's (``--as`` when given): one ``GET`` of the StageSet, nothing else.  The
history is what the controller recorded in status (:mod:`stageset.controller.stageset.history`),
so it survives restarts of the controller and outlives the apiserver's Events; it is bounded
(:mod:`stageset.api.history`: the newest ten releases per stage, fewer with many stages).
"""

from __future__ import annotations

from collections.abc import Iterable

import click

from stageset.cli.inspect import read_stageset
from stageset.cli.releases import HistoryRow, history_rows
from stageset.cli.session import Session, age, cluster_options, dump, echo, short_revision, table


def render_history(rows: Iterable[HistoryRow]) -> str:
    return table(["APPLIED", "STAGE", "REVISION", "GEN", "PHASE", "CHANGED"],
                 [[f"{age(r.applied_at)} ago" if r.applied_at else "-", r.stage, short_revision(r.revision),
                   str(r.generation) if r.generation is not None else "-", r.phase, r.changed()]
                  for r in rows])


@click.command("history")
@click.argument("name")
@click.option("--stage", "stage", multiple=True, metavar="STAGE", help="Only this stage (repeatable).")
@cluster_options()
def history(session: Session, name: str, stage: tuple[str, ...]) -> None:
    """Show the releases each stage of a StageSet applied, newest first: when, which revision and
    spec generation, the phase it reached, and what it wrote; and its failed attempts (nothing
    applied) with their reason.

    The controller keeps the newest ten per stage in the StageSet's status (fewer when it has many
    stages), so this outlives restarts and the cluster's Events.
    """
    rows = [r for r in history_rows(read_stageset(session, name)) if not stage or r.stage in stage]
    if session.output != "table":
        echo(dump([{"stage": r.stage, "revision": r.revision, "generation": r.generation,
                    "appliedAt": r.applied_at, "phase": r.phase, "created": r.created,
                    "configured": r.configured, "deleted": r.deleted, "objects": list(r.objects),
                    **({"reason": r.reason} if r.reason else {}), **({"attempt": True} if r.attempt else {})}
                   for r in rows], session.output))
        return
    if not rows:
        echo(f"no releases recorded for StageSet {session.namespace}/{name} yet\n")
        return
    echo(render_history(rows))
