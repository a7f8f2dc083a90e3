"""``uninstall``: remove a release of the chart so that no StageSet is left with a finalizer nobody removes.

A StageSet carries the finalizer ``stages.metio.wtf/teardown``, which only a running controller
removes (after deleting what the StageSet applied).  Removing the controller first strands every
StageSet deleted later in ``Terminating``.  So, in this order:

1. the StageSets the release's controllers watch (read from the release's own Deployments: their
   ``--watch-namespaces`` and ``--watch-label-selector``; or ``--namespaces`` / ``-A``) are either
   - **kept with their objects** (``--keep-objects``): each is suspended (so a controller still
     running touches it no more), then its finalizer is dropped; they and everything they applied
     stay, and a StageSet deleted later goes at once; or
   - **torn down** (``--teardown``): each is deleted and the still-running controller deletes what
     it applied (as the StageSet's ServiceAccount), with progress until none is left, at most
     ``--timeout`` (then nothing more is removed: the controller keeps running, so re-run it, or
     use ``--keep-objects`` for what is left);
2. then the release's objects (the manifest of its latest Helm revision; ``helm.sh/resource-policy:
   keep`` honoured), the controllers' Leases, and the release's Helm records, so Helm forgets it.

Without ``--yes`` it changes nothing and prints what it would do (a dry run).  The CRDs are never
deleted (no release owns them: docs/upgrading.md#the-crds).

Identity: every request is the caller's own (the kubeconfig's credentials: a cluster admin, as for
``helm uninstall``).  Nothing is deleted but the StageSets in scope (with ``--teardown``), the
objects the release's manifest names, its Leases and its Helm release Secrets.
"""

from __future__ import annotations

import base64
import gzip
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import click
import yaml

from stageset.apply.ownership import FINALIZER
from stageset.cli.params import DURATION, NAMESPACES
from stageset.cli.session import CliError, Session, echo
from stageset.controller.kinds import STAGESETS
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import RestMapper, UnknownKindError
from stageset.kube.types import KubeObject

POLL = 2.0
KEEP_POLICY = "helm.sh/resource-policy"
CONTROLLER_LABELS = {"app.kubernetes.io/part-of": "stageset", "app.kubernetes.io/component": "controller"}
# Deleted first (the controllers stop), then everything else of the manifest.
FIRST = ("Deployment",)


def key(obj: KubeObject) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


# -- the StageSets ------------------------------------------------------------------------------

def suspend(client: KubeClient, obj: KubeObject) -> None:
    """``spec.suspend: true`` (a running controller then neither applies nor re-adds the finalizer)."""
    meta = obj["metadata"]
    client.request("PATCH", STAGESETS.object_path(name=meta["name"], namespace=meta["namespace"]),
                   content_type="application/merge-patch+json", body={"spec": {"suspend": True}})


def release_finalizer(client: KubeClient, obj: KubeObject, *, attempts: int = 5) -> bool:
    """Drop our finalizer from the StageSet (others' stay), tested against its resourceVersion and
    read again on a conflict; whether it was there."""
    meta = obj["metadata"]
    path = STAGESETS.object_path(name=meta["name"], namespace=meta["namespace"])
    for _ in range(attempts):
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER not in finalizers:
            return False
        try:
            client.request("PATCH", path, content_type="application/json-patch+json", body=[
                {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                {"op": "replace", "path": "/metadata/finalizers",
                 "value": [f for f in finalizers if f != FINALIZER]}])
            return True
        except ApiError as error:
            if error.not_found:
                return False
            if not (error.conflict or error.invalid):  # a failed test op is 422 (invalid)
                raise
        try:
            meta = client.get(path)["metadata"]
        except ApiError as error:
            if error.not_found:
                return False
            raise
    raise CliError(f"StageSet {key(obj)} kept changing; its finalizer is still there: run again")


@dataclass(frozen=True)
class Scope:
    """Where one controller looks: namespaces (None: every one) and a label selector ('' : none)."""

    namespaces: tuple[str, ...] | None
    selector: str = ""

    def describe(self) -> str:
        where = "every namespace" if self.namespaces is None else ", ".join(self.namespaces)
        return where + (f" with labels {self.selector}" if self.selector else "")


def scope_of(deployment: KubeObject) -> Scope:
    """The StageSets a controller Deployment of the chart watches, from its flags."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    args = next((c.get("args") or [] for c in containers if c.get("name") == "controller"), [])
    namespaces: tuple[str, ...] | None = None
    selector = ""
    for arg in args:
        flag, _, value = str(arg).partition("=")
        if flag == "--watch-namespaces" and value:
            namespaces = tuple(n for n in value.split(",") if n)
        elif flag == "--watch-label-selector":
            selector = value
    return Scope(namespaces=namespaces, selector=selector)


def list_stagesets(client: KubeClient, scopes: Iterable[Scope]) -> list[KubeObject]:
    """The StageSets of every scope, each once (by uid); a namespace without the CRD contributes none."""
    found: dict[str, KubeObject] = {}
    for scope in scopes:
        query = {"labelSelector": scope.selector} if scope.selector else None
        for namespace in scope.namespaces or (None,):
            try:
                listed = client.request("GET", STAGESETS.collection_path(namespace), query=query)
            except ApiError as error:
                if error.not_found:
                    continue
                if error.forbidden:
                    where = f"in namespace {namespace}" if namespace else "in every namespace"
                    raise CliError(f"you may not list StageSets {where}: {error.message}") from None
                raise
            for item in listed.get("items", []):
                found[item["metadata"]["uid"]] = item
    return sorted(found.values(), key=key)


def wait_for_teardown(client: KubeClient, scopes: list[Scope], *, timeout: float,
                      poll: float = POLL) -> list[KubeObject]:
    """Wait until no StageSet of ``scopes`` is left, printing each change; those left at ``timeout``."""
    deadline = time.monotonic() + timeout
    reported: list[str] | None = None
    while True:
        remaining = list_stagesets(client, scopes)
        names = [key(obj) for obj in remaining]
        if names != reported:
            if names:
                echo(f"  waiting for the controller to tear down {len(names)} StageSet(s): "
                     f"{', '.join(names)}\n")
            reported = names
        if not remaining or time.monotonic() >= deadline:
            return remaining
        time.sleep(poll)


def delete_stageset(client: KubeClient, obj: KubeObject) -> None:
    meta = obj["metadata"]
    if meta.get("deletionTimestamp"):
        return
    try:
        client.request("DELETE", STAGESETS.object_path(name=meta["name"], namespace=meta["namespace"]),
                       body={"kind": "DeleteOptions", "apiVersion": "v1",
                             "preconditions": {"uid": meta["uid"]}})
    except ApiError as error:
        if not (error.not_found or error.conflict):
            raise


# -- the release --------------------------------------------------------------------------------

@dataclass
class Release:
    name: str
    namespace: str
    records: list[KubeObject] = field(default_factory=list)
    """Helm's release Secrets (one per revision)."""
    objects: list[KubeObject] = field(default_factory=list)
    """The latest revision's manifest (hooks are not part of it)."""

    @property
    def deployments(self) -> list[KubeObject]:
        return [o for o in self.objects if o.get("kind") == "Deployment"
                and CONTROLLER_LABELS.items() <= ((o.get("metadata") or {}).get("labels") or {}).items()]


def decode_release(secret: KubeObject) -> dict[str, Any]:
    """Helm's storage format: the Secret's data is base64 of Helm's own base64 of gzipped JSON."""
    raw = base64.b64decode(base64.b64decode(secret["data"]["release"]))
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    decoded: dict[str, Any] = json.loads(raw)
    return decoded


def load_release(client: KubeClient, *, name: str, namespace: str) -> Release | None:
    try:
        records = client.request("GET", f"/api/v1/namespaces/{namespace}/secrets",
                                 query={"labelSelector": f"owner=helm,name={name}"}).get("items", [])
    except ApiError as error:
        if error.forbidden:
            raise CliError(f"you may not read Helm's records of release {namespace}/{name} (Secrets): "
                           f"{error.message}") from None
        raise
    if not records:
        return None
    latest = max(records, key=lambda s: int((s["metadata"].get("labels") or {}).get("version", "0")))
    manifest = decode_release(latest).get("manifest", "")
    objects = [doc for doc in yaml.safe_load_all(manifest) if isinstance(doc, dict) and doc.get("kind")]
    return Release(name=name, namespace=namespace, records=records, objects=objects)


def describe(obj: KubeObject) -> str:
    meta = obj["metadata"]
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj['kind']} {where}{meta['name']}"


def leases(release: Release) -> list[KubeObject]:
    """The Leases the release's controllers hold (named by --leader-election-id; not in the manifest)."""
    found = []
    for deployment in release.deployments:
        containers = deployment["spec"]["template"]["spec"]["containers"]
        args = next((c.get("args") or [] for c in containers if c.get("name") == "controller"), [])
        values = dict(str(a).partition("=")[::2] for a in args)
        if "--leader-elect" in args and values.get("--leader-election-id"):
            found.append({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {
                "name": values["--leader-election-id"],
                "namespace": values.get("--leader-election-namespace") or release.namespace}})
    return found


def remove_release(client: KubeClient, release: Release) -> None:
    """Delete the manifest's objects (Deployments first; ``helm.sh/resource-policy: keep`` kept), the
    Leases and Helm's records."""
    mapper = RestMapper(client)
    ordered = sorted(release.objects, key=lambda o: o["kind"] not in FIRST)
    for obj in [*ordered, *leases(release)]:
        if ((obj["metadata"].get("annotations") or {}).get(KEEP_POLICY)) == "keep":
            echo(f"  kept {describe(obj)} ({KEEP_POLICY}: keep)\n")
            continue
        try:
            path = mapper.object_path(obj, default_namespace=release.namespace)
            client.request("DELETE", path, body={"kind": "DeleteOptions", "apiVersion": "v1",
                                                 "propagationPolicy": "Background"})
        except UnknownKindError:  # e.g. a ServiceMonitor whose CRD is gone
            continue
        except ApiError as error:
            if error.not_found:
                continue
            raise
        echo(f"  deleted {describe(obj)}\n")
    for record in release.records:
        try:
            client.request("DELETE", f"/api/v1/namespaces/{release.namespace}/secrets/"
                                     f"{record['metadata']['name']}")
        except ApiError as error:
            if not error.not_found:
                raise
    echo(f"  deleted Helm's records of release {release.namespace}/{release.name} ({len(release.records)})\n")


# -- the command --------------------------------------------------------------------------------

@click.command("uninstall")
@click.option("--release", "release_name", default="stageset", show_default=True, help="The Helm release.")
@click.option("-n", "--namespace", default="stageset-system", show_default=True,
              help="The release's namespace.")
@click.option("--keep-objects", is_flag=True, default=False,
              help="Keep every StageSet and what it applied: suspend each, then drop its finalizer.")
@click.option("--teardown", is_flag=True, default=False,
              help="Delete every StageSet and wait until the controller deleted what each applied.")
@click.option("--yes", is_flag=True, default=False, help="Do it (without: print what would be done).")
@click.option("--timeout", type=DURATION, default="10m", show_default=True,
              help="With --teardown: how long to wait for the controller.")
@click.option("--namespaces", type=NAMESPACES, default=None,
              help="The StageSets' namespaces (default: what the release's controllers watch).")
@click.option("-A", "--all-namespaces", is_flag=True, default=False,
              help="StageSets of every namespace (default: what the release's controllers watch).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")
@click.option("--context", default=None, help="Kubeconfig context (default: the current one).")
def uninstall(release_name: str, namespace: str, keep_objects: bool, teardown: bool, yes: bool,
              timeout: float, namespaces: tuple[str, ...] | None, all_namespaces: bool,
              kubeconfig: str | None, context: str | None) -> None:
    """Uninstall a release of the chart without leaving a StageSet stuck with its finalizer.

    Either keep the StageSets and their objects (--keep-objects: suspended, finalizer dropped) or
    tear them down first (--teardown: deleted, waited for, with progress), then delete the release's
    objects and Helm's records of it.  A dry run unless --yes.  The CRDs stay.
    """
    if keep_objects and teardown:
        raise click.UsageError("choose one of --keep-objects and --teardown")
    if namespaces and all_namespaces:
        raise click.UsageError("--namespaces and --all-namespaces cannot be combined")
    session = Session(kubeconfig=kubeconfig, context=context)
    try:
        _uninstall(session.client(), release_name=release_name, namespace=namespace,
                   keep_objects=keep_objects,
                   teardown=teardown, yes=yes, timeout=timeout,
                   override=Scope(namespaces=None) if all_namespaces else
                   Scope(namespaces=namespaces) if namespaces else None)
    finally:
        session.close()


def _uninstall(client: KubeClient, *, release_name: str, namespace: str, keep_objects: bool, teardown: bool,
               yes: bool, timeout: float, override: Scope | None) -> None:
    release = load_release(client, name=release_name, namespace=namespace)
    if release is None and override is None:
        raise CliError(f"no Helm release {release_name} in namespace {namespace}; to release StageSets "
                       "without one, name their namespaces (--namespaces or -A)")
    scopes = [override] if override else [scope_of(d) for d in release.deployments] if release else []
    if release is not None and not scopes:
        raise CliError(f"release {namespace}/{release_name} has no controller Deployment to read the "
                       "watched namespaces from; name them (--namespaces or -A)")
    stagesets = list_stagesets(client, scopes)
    echo(f"StageSets in {'; '.join(s.describe() for s in scopes)}: {len(stagesets)}\n")
    if stagesets and not (keep_objects or teardown):
        raise CliError(f"{len(stagesets)} StageSet(s) would be left with a finalizer no controller removes: "
                       "choose --keep-objects (keep them and what they applied) or --teardown (delete "
                       "what they applied first)")
    _plan(release, stagesets, keep_objects=keep_objects, prefix="" if yes else "would ")
    if not yes:
        echo("dry run: nothing changed; pass --yes to uninstall\n")
        return
    if keep_objects:
        _keep(client, stagesets, scopes)
    elif teardown and stagesets:
        _tear_down(client, stagesets, scopes, timeout=timeout)
    if release is not None:
        remove_release(client, release)
    echo("uninstalled\n" if release is not None else "done\n")


def _plan(release: Release | None, stagesets: list[KubeObject], *, keep_objects: bool, prefix: str) -> None:
    for obj in stagesets:
        action = "suspend, then drop the finalizer of" if keep_objects else "delete (teardown)"
        echo(f"  {prefix}{action} StageSet {key(obj)}\n")
    if release is not None:
        for obj in [*release.objects, *leases(release)]:
            echo(f"  {prefix}delete {describe(obj)}\n")
        echo(f"  {prefix}delete Helm's records of release {release.namespace}/{release.name}\n")


def _keep(client: KubeClient, stagesets: list[KubeObject], scopes: list[Scope]) -> None:
    """Suspend each StageSet, then drop its finalizer (read again: suspending changed each)."""
    for obj in stagesets:
        if not obj["metadata"].get("deletionTimestamp"):
            suspend(client, obj)
    for obj in list_stagesets(client, scopes):
        if release_finalizer(client, obj):
            echo(f"  released StageSet {key(obj)} (suspended; what it applied stays)\n")


def _tear_down(client: KubeClient, stagesets: list[KubeObject], scopes: list[Scope], *,
               timeout: float) -> None:
    """Delete each StageSet and wait for the controller; raises :class:`CliError` (the release left
    in place) when some remain after ``timeout``."""
    for obj in stagesets:
        delete_stageset(client, obj)
        echo(f"  deleted StageSet {key(obj)}\n")
    left = wait_for_teardown(client, scopes, timeout=timeout)
    if left:
        raise CliError(f"timed out after {timeout:g}s: {len(left)} StageSet(s) still being torn down "
                       f"({', '.join(key(o) for o in left)}); the release is left in place so its "
                       "controller can finish: run again, or release them with --keep-objects")
    echo("  every StageSet is gone\n")
