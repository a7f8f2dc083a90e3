"""``reconcile``, ``suspend``, ``resume``: steering a StageSet as Flux's CLI steers a Kustomization.

Identity: every request is the user's own (the kubeconfig's credentials).  ``reconcile`` sets
the ``reconcile.fluxcd.io/requestedAt`` annotation (``patch`` on stagesets, and on
gitrepositories with ``--with-source``), and with ``--update-now`` the reference's
``stages.metio.wtf/update-now`` annotation, which ships revisions the update windows hold (once
per value; the controller records it in an event and ``status.lastHandledUpdateOverride``);
``suspend``/``resume`` set ``spec.suspend``.  The
controller does the work; ``--wait`` only watches its status.
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


def _outcome(kind: str, obj: KubeObject) -> tuple[bool, str]:
    ready = _ready(obj)
    meta = obj["metadata"]
    line = f"{kind} {meta['namespace']}/{meta['name']}: Ready={ready.get('status', 'Unknown')}"
    if ready.get("reason"):
        line += f" ({ready['reason']})"
    if ready.get("message"):
        line += f" {ready['message']}"
    return ready.get("status") == ConditionStatus.TRUE, line


def _finish(session: Session, name: str, *, stamp: str, wait: bool, timeout: float) -> None:
    namespace = session.namespace
    if not wait:
        echo(f"requested a reconcile of StageSet {namespace}/{name} ({REQUESTED_AT}={stamp})\n")
        return
    echo(f"waiting for StageSet {namespace}/{name} to reconcile\n")
    obj = wait_handled(session.client(), STAGESETS, namespace, name, stamp=stamp, timeout=timeout,
                       settled=True)
    ok, line = _outcome("StageSet", obj)
    echo(line + "\n")
    if not ok:
        raise CliError(f"StageSet {namespace}/{name} is not Ready")


@click.command("reconcile")
@click.argument("name")
@click.option("--with-source", is_flag=True, default=False,
              help="First fetch the GitRepositories its stages use, and wait for them.")
@click.option("--wait", is_flag=True, default=False, help="Wait until the StageSet is Ready (or fails).")
@click.option("--timeout", type=DURATION, default="5m", show_default=True, help="How long --wait waits.")
@click.option("--update-now", is_flag=True, default=False,
              help="Ship the revisions its update windows hold back, at once (stages.metio.wtf/update-now).")
@cluster_options(outputs=("table",))
def reconcile(session: Session, name: str, with_source: bool, wait: bool, timeout: float,
              update_now: bool) -> None:
    """Ask the controller to reconcile a StageSet now (reconcile.fluxcd.io/requestedAt).

    With --update-now, revisions its update windows hold back roll out now, despite the windows
    (recorded in an UpdateOverridden event).  Exit code 3 when --wait ends with the StageSet not
    Ready.
    """
    obj = read_stageset(session, name)
    namespace = session.namespace
    if summary(obj)["suspended"]:
        raise CliError(f"StageSet {namespace}/{name} is suspended: `stageset resume {name} -n {namespace}` "
                       "resumes and reconciles it")
    client = session.client()
    stamp = request_stamp()
    if with_source:
        for source_ns, source in sources_of(obj):
            request_reconcile(client, GITREPOSITORIES, source_ns, source, stamp)
            echo(f"fetching GitRepository {source_ns}/{source}\n")
            fetched = wait_handled(client, GITREPOSITORIES, source_ns, source, stamp=stamp, timeout=timeout,
                                   settled=False)
            echo(_outcome("GitRepository", fetched)[1] + "\n")
    request_reconcile(client, STAGESETS, namespace, name, stamp, update_now=update_now)
    if update_now:
        echo(f"asked to ship held revisions of StageSet {namespace}/{name} now "
             f"({ANNOTATION_UPDATE_NOW}={stamp})\n")
    _finish(session, name, stamp=stamp, wait=wait, timeout=timeout)


@click.command("suspend")
@click.argument("name")
@cluster_options(outputs=("table",))
def suspend(session: Session, name: str) -> None:
    """Stop reconciling a StageSet (spec.suspend=true); its objects stay as they are."""
    obj = read_stageset(session, name)
    namespace = session.namespace
    if summary(obj)["suspended"]:
        echo(f"StageSet {namespace}/{name} is already suspended\n")
        return
    patch(session.client(), STAGESETS, namespace, name, {"spec": {"suspend": True}})
    echo(f"suspended StageSet {namespace}/{name}\n")


@click.command("resume")
@click.argument("name")
@click.option("--wait", is_flag=True, default=False, help="Wait until the StageSet is Ready (or fails).")
@click.option("--timeout", type=DURATION, default="5m", show_default=True, help="How long --wait waits.")
@cluster_options(outputs=("table",))
def resume(session: Session, name: str, wait: bool, timeout: float) -> None:
    """Resume a suspended StageSet (spec.suspend=false) and reconcile it now."""
    read_stageset(session, name)
    namespace = session.namespace
    stamp = request_stamp()
    patch(session.client(), STAGESETS, namespace, name,
           {"metadata": {"annotations": {REQUESTED_AT: stamp}}, "spec": {"suspend": False}})
    echo(f"resumed StageSet {namespace}/{name}\n")
    _finish(session, name, stamp=stamp, wait=wait, timeout=timeout)

