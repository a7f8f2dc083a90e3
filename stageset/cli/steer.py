"""``reconcile``, ``suspend``, ``resume``: steering a StageSet as Flux's CLI steers a Kustomization.

Identity: every request is the user's own (the kubeconfig's credentials).  ``reconcile`` sets
the ``reconcile.fluxcd.io/requestedAt`` annotation (``patch`` on stagesets, and on
gitrepositories with ``--with-source``), and with ``--update-now`` the reference's
``stages.metio.wtf/update-now`` annotation, which ships revisions the update windows hold (once
per value; the controller records it in an event and ``status.lastHandledUpdateOverride``);
``suspend``/``resume`` set ``spec.suspend``.  ``--all`` does the same to every StageSet of the
namespace (listed as the user).  The controller does the work; ``--wait`` only watches its status.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import click

from stageset.api.release import ANNOTATION_UPDATE_NOW
from stageset.api.vocabulary import ConditionStatus, ConditionType
from stageset.cli.inspect import read_stageset, sources_of, summary
from stageset.cli.params import DURATION
from stageset.cli.session import CliError, Session, cluster_options, echo
from stageset.controller.conditions import find_condition
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.status import REQUESTED_AT
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

POLL = 0.5


def request_stamp() -> str:
    """A fresh ``requestedAt`` value (RFC 3339 with sub-seconds, as Flux writes it)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def patch(client: KubeClient, resource: Resource, namespace: str, name: str, body: dict[str, Any]
           ) -> KubeObject:
    try:
        return client.request("PATCH", resource.object_path(name=name, namespace=namespace), body=body,
                              content_type="application/merge-patch+json")
    except ApiError as error:
        if error.forbidden:
            raise CliError(f"you may not patch {resource.kind} {namespace}/{name}: {error.message}") from None
        if error.not_found:
            raise CliError(f"{resource.kind} {namespace}/{name} not found") from None
        raise


def request_reconcile(client: KubeClient, resource: Resource, namespace: str, name: str, stamp: str, *,
                      update_now: bool = False) -> None:
    annotations = {REQUESTED_AT: stamp, **({ANNOTATION_UPDATE_NOW: stamp} if update_now else {})}
    patch(client, resource, namespace, name, {"metadata": {"annotations": annotations}})


def suspend_one(client: KubeClient, namespace: str, name: str) -> None:
    """``spec.suspend=true``, as ``client`` (the user's)."""
    patch(client, STAGESETS, namespace, name, {"spec": {"suspend": True}})


def resume_one(client: KubeClient, namespace: str, name: str, stamp: str) -> None:
    """``spec.suspend=false``, and a reconcile requested with ``stamp``, in one patch as ``client``."""
    patch(client, STAGESETS, namespace, name,
          {"metadata": {"annotations": {REQUESTED_AT: stamp}}, "spec": {"suspend": False}})


def request_sources(client: KubeClient, obj: KubeObject, stamp: str) -> list[tuple[str, str]]:
    """Ask for a fetch of every GitRepository ``obj``'s stages use (``--with-source``), as
    ``client``; returns them (namespace, name) -- the caller waits for them, or not."""
    found = sources_of(obj)
    for source_ns, source in found:
        request_reconcile(client, GITREPOSITORIES, source_ns, source, stamp)
    return found


def _ready(obj: KubeObject) -> dict[str, Any]:
    return dict(find_condition((obj.get("status") or {}).get("conditions"), ConditionType.READY))


def wait_handled(client: KubeClient, resource: Resource, namespace: str, name: str, *, stamp: str,
                 timeout: float, settled: bool) -> KubeObject:
    """Until the controller handled ``stamp`` (and, with ``settled``, Ready is True or False for
    the current generation); raises :class:`CliError` on timeout."""
    deadline = time.monotonic() + timeout
    path = resource.object_path(name=name, namespace=namespace)
    while True:
        obj = client.get(path)
        status = obj.get("status") or {}
        ready = _ready(obj)
        handled = status.get("lastHandledReconcileAt") == stamp
        current = ready.get("observedGeneration", status.get("observedGeneration")) == \
            obj["metadata"].get("generation")
        if handled and (not settled or (current and ready.get("status") in (ConditionStatus.TRUE,
                                                                              ConditionStatus.FALSE))):
            return obj
        if time.monotonic() >= deadline:
            what = "handle the request" if not handled else "finish (Ready is still Unknown)"
            raise CliError(f"timed out after {timeout:g}s waiting for {resource.kind} {namespace}/{name} to "
                           f"{what}; is the controller running?")
        time.sleep(POLL)


def outcome(kind: str, obj: KubeObject) -> tuple[bool, str]:
    ready = _ready(obj)
    meta = obj["metadata"]
    line = f"{kind} {meta['namespace']}/{meta['name']}: Ready={ready.get('status', 'Unknown')}"
    if ready.get("reason"):
        line += f" ({ready['reason']})"
    if ready.get("message"):
        line += f" {ready['message']}"
    return ready.get("status") == ConditionStatus.TRUE, line


def _finish(session: Session, name: str, *, stamp: str, wait: bool, timeout: float) -> bool:
    """Report (and with ``wait``, wait for) the reconcile; whether it ended Ready (or was not waited)."""
    namespace = session.namespace
    if not wait:
        echo(f"requested a reconcile of StageSet {namespace}/{name} ({REQUESTED_AT}={stamp})\n")
        return True
    echo(f"waiting for StageSet {namespace}/{name} to reconcile\n")
    obj = wait_handled(session.client(), STAGESETS, namespace, name, stamp=stamp, timeout=timeout,
                       settled=True)
    ok, line = outcome("StageSet", obj)
    echo(line + "\n")
    return ok


def targets(session: Session, name: str | None, every: bool) -> list[KubeObject]:
    """The StageSet NAME, or with ``--all`` every StageSet of the namespace (by name)."""
    if (name is None) == (not every):
        raise click.UsageError("name one StageSet, or pass --all for every StageSet of the namespace")
    if name is not None:
        return [read_stageset(session, name)]
    namespace = session.namespace
    try:
        listed = session.client().get(STAGESETS.collection_path(namespace)).get("items", [])
    except ApiError as error:
        if error.forbidden:
            raise CliError(f"you may not list StageSets in namespace {namespace}: {error.message}") from None
        raise
    if not listed:
        echo(f"no StageSets in namespace {namespace}\n")
    return sorted(listed, key=lambda o: str(o["metadata"]["name"]))


def _not_ready(failed: list[str], namespace: str) -> None:
    if len(failed) == 1:
        raise CliError(f"StageSet {namespace}/{failed[0]} is not Ready")
    if failed:
        raise CliError(f"{len(failed)} StageSets are not Ready in namespace {namespace}: {', '.join(failed)}")


ALL = click.option("--all", "every", is_flag=True, default=False,
                   help="Every StageSet of the namespace (instead of NAME).")


@click.command("reconcile")
@click.argument("name", required=False)
@ALL
@click.option("--with-source", is_flag=True, default=False,
              help="First fetch the GitRepositories its stages use, and wait for them.")
@click.option("--wait", is_flag=True, default=False, help="Wait until the StageSet is Ready (or fails).")
@click.option("--timeout", type=DURATION, default="5m", show_default=True, help="How long --wait waits.")
@click.option("--update-now", is_flag=True, default=False,
              help="Ship the revisions its update windows hold back, at once (stages.metio.wtf/update-now).")
@cluster_options(outputs=("table",))
def reconcile(session: Session, name: str | None, every: bool, with_source: bool, wait: bool, timeout: float,
              update_now: bool) -> None:
    """Ask the controller to reconcile a StageSet now (reconcile.fluxcd.io/requestedAt).

    With --update-now, revisions its update windows hold back roll out now, despite the windows
    (recorded in an UpdateOverridden event).  With --all, every StageSet of the namespace (a
    suspended one is left out and said so).  Exit code 3 when --wait ends with a StageSet not
    Ready.
    """
    chosen = targets(session, name, every)
    namespace = session.namespace
    client = session.client()
    stamp = request_stamp()
    fetched: set[tuple[str, str]] = set()
    failed: list[str] = []
    for obj in chosen:
        current = str(obj["metadata"]["name"])
        if summary(obj)["suspended"]:
            hint = f"`stageset resume {current} -n {namespace}` resumes and reconciles it"
            if not every:
                raise CliError(f"StageSet {namespace}/{current} is suspended: {hint}")
            echo(f"skipped StageSet {namespace}/{current}: suspended ({hint})\n")
            continue
        if with_source:
            for source_ns, source in sources_of(obj):
                if (source_ns, source) in fetched:
                    continue  # --all: a source several StageSets share is fetched once
                fetched.add((source_ns, source))
                request_reconcile(client, GITREPOSITORIES, source_ns, source, stamp)
                echo(f"fetching GitRepository {source_ns}/{source}\n")
                done = wait_handled(client, GITREPOSITORIES, source_ns, source, stamp=stamp, timeout=timeout,
                                    settled=False)
                echo(outcome("GitRepository", done)[1] + "\n")
        request_reconcile(client, STAGESETS, namespace, current, stamp, update_now=update_now)
        if update_now:
            echo(f"asked to ship held revisions of StageSet {namespace}/{current} now "
                 f"({ANNOTATION_UPDATE_NOW}={stamp})\n")
        if not _finish(session, current, stamp=stamp, wait=wait, timeout=timeout):
            failed.append(current)
    _not_ready(failed, namespace)


@click.command("suspend")
@click.argument("name", required=False)
@ALL
@cluster_options(outputs=("table",))
def suspend(session: Session, name: str | None, every: bool) -> None:
    """Stop reconciling a StageSet (spec.suspend=true); its objects stay as they are.

    With --all, every StageSet of the namespace.
    """
    chosen = targets(session, name, every)
    namespace = session.namespace
    for obj in chosen:
        current = str(obj["metadata"]["name"])
        if summary(obj)["suspended"]:
            echo(f"StageSet {namespace}/{current} is already suspended\n")
            continue
        suspend_one(session.client(), namespace, current)
        echo(f"suspended StageSet {namespace}/{current}\n")


@click.command("resume")
@click.argument("name", required=False)
@ALL
@click.option("--wait", is_flag=True, default=False, help="Wait until the StageSet is Ready (or fails).")
@click.option("--timeout", type=DURATION, default="5m", show_default=True, help="How long --wait waits.")
@cluster_options(outputs=("table",))
def resume(session: Session, name: str | None, every: bool, wait: bool, timeout: float) -> None:
    """Resume a suspended StageSet (spec.suspend=false) and reconcile it now.

    With --all, every suspended StageSet of the namespace (the others are left alone).
    """
    chosen = targets(session, name, every)
    namespace = session.namespace
    stamp = request_stamp()
    resumed: list[str] = []
    for obj in chosen:
        current = str(obj["metadata"]["name"])
        if every and not summary(obj)["suspended"]:
            continue
        resume_one(session.client(), namespace, current, stamp)
        echo(f"resumed StageSet {namespace}/{current}\n")
        resumed.append(current)
    if every and not resumed:
        echo(f"no suspended StageSets in namespace {namespace}\n")
    failed = [current for current in resumed
              if not _finish(session, current, stamp=stamp, wait=wait, timeout=timeout)]
    _not_ready(failed, namespace)
