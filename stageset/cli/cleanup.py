"""``cleanup``: delete the StageSets of some namespaces and wait until the controller tore them down.

What the chart's ``cleanupOnDelete`` pre-delete hook Job runs before ``helm uninstall`` removes the
controller, so no StageSet is left with a finalizer nobody removes; a platform engineer can run it
by hand before uninstalling a release without the hook.

Identity: every request is the caller's own (the kubeconfig's credentials; in the hook Job, a
ServiceAccount of its own that may only get, list, watch, delete and patch StageSets in the
release's namespaces -- patch to drop the finalizer of what is left at ``--release-remaining``).
It never touches what the StageSets applied: the controller tears that down, as each StageSet's
own ServiceAccount, when it sees the deletion.  Nothing is deleted outside the
namespaces named (or, with ``--all-namespaces``, outside what the caller may list), nor a StageSet
``--selector`` does not select (a release of label shards cleans up only its own: the apiserver
selects, as for the controller's watch).
"""

from __future__ import annotations

import time

import click

from stageset.api.vocabulary import ConditionType
from stageset.cli.params import DURATION, LABEL_SELECTOR, NAMESPACES
from stageset.cli.session import CliError, Session, cluster_options, echo
from stageset.cli.uninstall import release_finalizer
from stageset.controller.conditions import find_condition
from stageset.controller.kinds import STAGESETS
from stageset.controller.sharding import LabelSelector
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject

POLL = 2.0


def listed(client: KubeClient, namespaces: tuple[str, ...] | None, selector: LabelSelector | None = None
            ) -> list[KubeObject]:
    """The StageSets of ``namespaces`` (None: every namespace) that ``selector`` selects; a namespace
    without the CRD or without StageSets contributes none."""
    found: list[KubeObject] = []
    query = {"labelSelector": str(selector)} if selector else None
    for namespace in namespaces or (None,):
        try:
            found += client.request("GET", STAGESETS.collection_path(namespace), query=query).get("items", [])
        except ApiError as error:
            if error.not_found:  # the CRD is gone, or never was: nothing to clean up
                continue
            if error.forbidden:
                where = f"in namespace {namespace}" if namespace else "in every namespace"
                raise CliError(f"you may not list StageSets {where}: {error.message}") from None
            raise
    return found


def _key(obj: KubeObject) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _why(obj: KubeObject) -> str:
    ready = find_condition((obj.get("status") or {}).get("conditions"), ConditionType.READY)
    reason = ready.get("reason")
    return f" ({reason}: {ready.get('message', '')})" if reason else ""


@click.command("cleanup")
@click.option("--namespaces", type=NAMESPACES, default=None,
              help="Comma-separated namespaces whose StageSets are deleted (default: the -n namespace).")
@click.option("--timeout", type=DURATION, default="10m", show_default=True,
              help="How long to wait for the controller to tear the StageSets down.")
@click.option("--release-remaining", is_flag=True, default=False,
              help="At --timeout, drop the finalizer of each StageSet still there (what it applied stays, "
              "orphaned) and succeed: what the chart's hook does, so `helm uninstall` never stops half-way.")
@click.option("-l", "--selector", type=LABEL_SELECTOR, default="",
              help="Only StageSets with these labels (the release's --watch-label-selector), e.g. "
              "sharding.fluxcd.io/key=shard1.")
@cluster_options(all_namespaces=True, outputs=("table",))
def cleanup(session: Session, namespaces: tuple[str, ...] | None, timeout: float, release_remaining: bool,
            selector: LabelSelector | None) -> None:
    """Delete every StageSet of the namespaces and wait until the controller tore them down.

    The controller must be running: it deletes what each StageSet applied (as the StageSet's
    ServiceAccount; `prune: false` objects stay) and then removes the finalizer.  Exit code 3 when
    StageSets remain after --timeout (they are listed with why).  What the chart's
    cleanupOnDelete hook runs before `helm uninstall`.
    """
    if session.all_namespaces and namespaces:
        raise click.UsageError("--namespaces and --all-namespaces cannot be combined")
    scope: tuple[str, ...] | None = None if session.all_namespaces else (namespaces or (session.namespace,))
    where = ("every namespace" if scope is None else ", ".join(scope)) + \
        (f" with labels {selector}" if selector else "")
    delete_and_wait(session.client(), scope=scope, selector=selector, timeout=timeout, where=where,
                    release_remaining=release_remaining)


def _give_up(client: KubeClient, remaining: list[KubeObject], *, timeout: float, where: str,
             release_remaining: bool) -> None:
    """At the timeout: drop the finalizers of what is left (``release_remaining``: what each applied
    stays), or raise :class:`CliError` naming each with why."""
    if not release_remaining:
        lines = "\n".join(f"  {_key(obj)}{_why(obj)}" for obj in remaining)
        raise CliError(f"timed out after {timeout:g}s: {len(remaining)} StageSet(s) still being torn "
                       f"down (is the controller running?):\n{lines}")
    for obj in remaining:
        if release_finalizer(client, obj):
            echo(f"released StageSet {_key(obj)} after {timeout:g}s: what it applied stays{_why(obj)}\n")
    echo(f"every StageSet in {where} is gone or released\n")


def delete_and_wait(client: KubeClient, *, scope: tuple[str, ...] | None, selector: LabelSelector | None,
                    timeout: float, where: str, release_remaining: bool = False) -> None:
    """Delete the StageSets of ``scope`` and wait until the controller tore them down (``cleanup``,
    and ``delete tenant`` before it deletes the tenant's namespaces); raises :class:`CliError`
    when some remain after ``timeout`` -- unless ``release_remaining``: then their finalizers are
    dropped (what they applied stays) and it returns."""
    doomed = listed(client, scope, selector)
    echo(f"deleting {len(doomed)} StageSet(s) in {where}\n")
    for obj in doomed:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        try:
            client.request("DELETE", STAGESETS.object_path(name=meta["name"], namespace=meta["namespace"]),
                           body={"kind": "DeleteOptions", "apiVersion": "v1",
                                 "preconditions": {"uid": meta["uid"]}})
        except ApiError as error:
            if error.not_found or error.status == 409:  # gone, or replaced meanwhile (listed again below)
                continue
            if error.forbidden:
                raise CliError(f"you may not delete StageSet {_key(obj)}: {error.message}") from None
            raise
        echo(f"  deleted StageSet {_key(obj)}\n")
    deadline = time.monotonic() + timeout
    reported = -1
    while True:
        remaining = listed(client, scope, selector)
        if not remaining:
            echo(f"every StageSet in {where} is gone\n")
            return
        if len(remaining) != reported:
            echo(f"waiting for the controller to tear down {len(remaining)} StageSet(s)\n")
            reported = len(remaining)
        if time.monotonic() >= deadline:
            _give_up(client, remaining, timeout=timeout, where=where, release_remaining=release_remaining)
            return
        for obj in remaining:  # created after the first pass, or its delete raced a replacement
            if not obj["metadata"].get("deletionTimestamp"):
                try:
                    client.request("DELETE", STAGESETS.object_path(name=obj["metadata"]["name"],
                                                                   namespace=obj["metadata"]["namespace"]))
                except ApiError as error:
                    if not error.not_found:
                        raise
        time.sleep(POLL)
