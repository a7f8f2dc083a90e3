"""GitRepository verbs, in flux's shapes: ``get sources git``, ``reconcile source git NAME``,
``suspend source git NAME``, ``resume source git NAME``.

Identity: every request is the user's own (the kubeconfig's credentials, or ``--as``): a list or
get of ``gitrepositories.stages.metio.wtf``, and a merge patch of the one named.  ``reconcile``
sets ``reconcile.fluxcd.io/requestedAt`` (the controller fetches at once and records the value
in ``status.lastHandledReconcileAt``); ``suspend``/``resume`` set ``spec.suspend`` (``resume``
also requests a fetch, in the same patch).  The controller does the fetching; ``--wait`` only
reads status.  Credentials are never shown: a GitRepository names its Secret, nothing more.
"""

from __future__ import annotations

from typing import Any

import click

from stageset.api.vocabulary import ConditionType
from stageset.cli.completion import complete_gitrepositories
from stageset.cli.params import DURATION
from stageset.cli.session import (
    CliError,
    Session,
    StagesetGroup,
    age,
    cluster_options,
    dump_objects,
    echo,
    table,
)
from stageset.cli.steer import outcome as ready_line
from stageset.cli.steer import patch, request_stamp, wait_handled
from stageset.controller.conditions import find_condition
from stageset.controller.kinds import GITREPOSITORIES
from stageset.controller.status import REQUESTED_AT
from stageset.kube.client import ApiError
from stageset.kube.types import KubeObject


def ref_text(spec: dict[str, Any]) -> str:
    """``branch/main``, ``tag/v1``, ``semver/>=1``, ``commit/abc…`` (as ``flux get sources git``)."""
    ref = spec.get("ref") or {}
    for key in ("commit", "name", "semver", "tag", "branch"):
        if ref.get(key):
            return f"{key}/{ref[key]}"
    return "-"


def source_view(obj: KubeObject) -> dict[str, Any]:
    """What ``get sources git`` shows of one GitRepository (also its -o yaml/json form)."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    ready = find_condition(status.get("conditions"), ConditionType.READY)
    artifact = status.get("artifact") or {}
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "url": spec.get("url"),
            "ref": ref_text(spec), "revision": artifact.get("revision"),
            "lastUpdate": artifact.get("lastUpdateTime"), "suspended": bool(spec.get("suspend")),
            "ready": ready.get("status", "Unknown"), "reason": ready.get("reason"),
            "message": ready.get("message", "")}


def source_table(views: list[dict[str, Any]], *, every: bool) -> str:
    headers = ["NAME", "URL", "REF", "REVISION", "SUSPENDED", "READY", "MESSAGE"]
    rows = [[v["name"], v["url"] or "-", v["ref"], v["revision"] or "-", str(v["suspended"]).lower(),
             str(v["ready"]), (v["message"] or "").splitlines()[0] if v["message"] else ""] for v in views]
    if every:
        headers = ["NAMESPACE", *headers]
        rows = [[v["namespace"], *row] for v, row in zip(views, rows, strict=True)]
    return table(headers, rows)


def _read(session: Session, name: str) -> KubeObject:
    namespace = session.namespace
    try:
        return session.client().get(GITREPOSITORIES.object_path(name=name, namespace=namespace))
    except ApiError as error:
        if error.not_found:
            raise CliError(f"GitRepository {namespace}/{name} not found") from None
        if error.forbidden:
            raise CliError(f"you may not read GitRepository {namespace}/{name}: {error.message}") from None
        raise


NAME = click.argument("name", shell_complete=complete_gitrepositories)


@click.command("git")
@click.argument("name", required=False, shell_complete=complete_gitrepositories)
@cluster_options(all_namespaces=True)
def get_git(session: Session, name: str | None) -> None:
    """Show GitRepositories: URL, reference, fetched revision, ready state.

    Without NAME, every GitRepository of the namespace (-A: of every namespace).
    """
    if name is not None and session.all_namespaces:
        raise click.UsageError("NAME and --all-namespaces cannot be combined")
    if name is not None:
        listed = [_read(session, name)]
    else:
        namespace = None if session.all_namespaces else session.namespace
        try:
            listed = session.client().get(GITREPOSITORIES.collection_path(namespace)).get("items", [])
        except ApiError as error:
            if error.forbidden:
                where = f"namespace {namespace}" if namespace else "every namespace"
                raise CliError(f"you may not list GitRepositories in {where}: {error.message}") from None
            raise
    listed = sorted(listed, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
    views = [source_view(obj) for obj in listed]
    if session.output != "table":
        # The objects themselves, as kubectl prints them (a List without NAME).
        echo(dump_objects(listed, session.output, one=name is not None))
        return
    if not views:
        where = "any namespace" if session.all_namespaces else f"namespace {session.namespace}"
        click.echo(f"No GitRepositories found in {where}.", err=True)
        return
    echo(source_table(views, every=session.all_namespaces))
    if name is not None and views[0]["lastUpdate"]:
        echo(f"revision changed {age(views[0]['lastUpdate'])} ago\n")


@click.command("git")
@NAME
@click.option("--wait", is_flag=True, default=False, help="Wait until the controller fetched it.")
@click.option("--timeout", type=DURATION, default="5m", show_default=True, help="How long --wait waits.")
@cluster_options(outputs=("table",))
def reconcile_git(session: Session, name: str, wait: bool, timeout: float) -> None:
    """Ask the controller to fetch a GitRepository now (reconcile.fluxcd.io/requestedAt)."""
    namespace = session.namespace
    obj = _read(session, name)
    if (obj.get("spec") or {}).get("suspend"):
        raise CliError(f"GitRepository {namespace}/{name} is suspended: "
                       f"`stageset resume source git {name} -n {namespace}` resumes and fetches it")
    stamp = request_stamp()
    patch(session.client(), GITREPOSITORIES, namespace, name,
          {"metadata": {"annotations": {REQUESTED_AT: stamp}}})
    if not wait:
        echo(f"requested a fetch of GitRepository {namespace}/{name} ({REQUESTED_AT}={stamp})\n")
        return
    echo(f"waiting for GitRepository {namespace}/{name} to fetch\n")
    done = wait_handled(session.client(), GITREPOSITORIES, namespace, name, stamp=stamp, timeout=timeout,
                        settled=False)
    echo(ready_line("GitRepository", done)[1] + "\n")


@click.command("git")
@NAME
@cluster_options(outputs=("table",))
def suspend_git(session: Session, name: str) -> None:
    """Stop fetching a GitRepository (spec.suspend=true); StageSets keep its last revision."""
    patch(session.client(), GITREPOSITORIES, session.namespace, name, {"spec": {"suspend": True}})
    echo(f"suspended GitRepository {session.namespace}/{name}\n")


@click.command("git")
@NAME
@cluster_options(outputs=("table",))
def resume_git(session: Session, name: str) -> None:
    """Resume a suspended GitRepository (spec.suspend=false) and fetch it now."""
    patch(session.client(), GITREPOSITORIES, session.namespace, name,
          {"metadata": {"annotations": {REQUESTED_AT: request_stamp()}}, "spec": {"suspend": False}})
    echo(f"resumed GitRepository {session.namespace}/{name}\n")


def kind_group(word: str, git: click.Command, *, verb: str) -> click.Group:
    """``WORD git``: the Git source form of a verb (``sources`` for ``get``, ``source`` otherwise)."""
    group = StagesetGroup(word, help=f"{verb} sources (GitRepository: `git`).")
    group.add_command(git)
    return group


get_sources = kind_group("sources", get_git, verb="Show")
reconcile_source = kind_group("source", reconcile_git, verb="Fetch")
suspend_source = kind_group("source", suspend_git, verb="Suspend")
resume_source = kind_group("source", resume_git, verb="Resume")
