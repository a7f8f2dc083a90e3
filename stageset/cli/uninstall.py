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
2. then ``helm uninstall`` (``--no-hooks``: step 1 did what the chart's cleanup hook would; with
   ``HELM_DRIVER`` set to where the release's records are, Secrets or ConfigMaps), which deletes the
   objects of its latest revision (``helm.sh/resource-policy: keep`` honoured) and its records;
   then what Helm leaves behind: the controllers' Leases and any hook object still there (the CRD
   hook Job of a failed or interrupted install, its ServiceAccount and rights).

The plan (and the dry run) names only objects that exist: a failed install's manifest may name
objects never created.

It prints what it would do, then asks, unless ``--yes``; with no answer to read it is a dry run
that changes nothing (the convention of every command that deletes:
:func:`~stageset.cli.session.confirmed`).  The CRDs are never deleted (no release owns them:
docs/upgrading.md#the-crds).

Identity: every request is the caller's own (the kubeconfig's credentials: a cluster admin, as for
``helm uninstall``), and so is ``helm uninstall``'s (the same kubeconfig and context).  Nothing is
deleted but the StageSets in scope (with ``--teardown``), what ``helm uninstall`` deletes, the
release's Leases and the hook objects its records declare.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import click
import yaml

from stageset.apply.ownership import FINALIZER
from stageset.cli import helmstore
from stageset.cli.params import DURATION, NAMESPACES
from stageset.cli.session import CliError, Session, confirmed, echo, yes_option
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
    records: list[helmstore.Record] = field(default_factory=list)
    """Helm's records of the release (one per revision, oldest first), in either storage driver."""
    objects: list[KubeObject] = field(default_factory=list)
    """The latest revision's manifest (hooks are not part of it)."""
    hooks: list[KubeObject] = field(default_factory=list)
    """Every hook object any revision declared (Helm never deletes a hook that failed or was
    interrupted, nor hooks of events other than the uninstall's)."""

    @property
    def deployments(self) -> list[KubeObject]:
        return [o for o in self.objects if o.get("kind") == "Deployment"
                and CONTROLLER_LABELS.items() <= ((o.get("metadata") or {}).get("labels") or {}).items()]

    @property
    def driver(self) -> str:
        return self.records[-1].driver if self.records else "secret"


def decode_release(secret: KubeObject) -> dict[str, Any]:
    """Helm's storage format in a Secret: base64 of Helm's own base64 of gzipped JSON."""
    return helmstore.decode(secret, driver="secret")


def _documents(text: str) -> list[KubeObject]:
    return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict) and doc.get("kind")]


def load_release(client: KubeClient, *, name: str, namespace: str) -> Release | None:
    try:
        records = helmstore.releases(client, namespace, name=name, chart=None)
    except ApiError as error:
        if error.forbidden:
            raise CliError(f"you may not read Helm's records of release {namespace}/{name}: "
                           f"{error.message}") from None
        raise
    if not records:
        return None
    hooks: dict[tuple[str, str, str], KubeObject] = {}
    for record in records:
        for hook in record.hooks:
            for obj in _documents(str(hook.get("manifest", ""))):
                meta = obj.get("metadata") or {}
                hooks[(obj["kind"], str(meta.get("namespace") or namespace), str(meta.get("name")))] = obj
    return Release(name=name, namespace=namespace, records=records, objects=_documents(records[-1].manifest),
                   hooks=list(hooks.values()))


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


def existing(client: KubeClient, objects: Iterable[KubeObject], *, namespace: str) -> list[KubeObject]:
    """Those of ``objects`` that exist (a failed install's manifest names objects never created:
    they are neither planned nor reported)."""
    mapper = RestMapper(client)
    found = []
    for obj in objects:
        try:
            client.get(mapper.object_path(obj, default_namespace=namespace))
        except UnknownKindError:  # e.g. a ServiceMonitor whose CRD is gone
            continue
        except ApiError as error:
            if error.not_found:
                continue
            raise
        found.append(obj if obj["metadata"].get("namespace") or obj["kind"] in _CLUSTER_KINDS
                     else {**obj, "metadata": {**obj["metadata"], "namespace": namespace}})
    return found


_CLUSTER_KINDS = {"ClusterRole", "ClusterRoleBinding", "Namespace", "CustomResourceDefinition",
                  "PriorityClass", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}


def delete_objects(client: KubeClient, objects: Iterable[KubeObject], *, namespace: str, what: str) -> None:
    """Delete each object (its pods with it: background propagation); only actual deletes are reported."""
    mapper = RestMapper(client)
    for obj in objects:
        try:
            path = mapper.object_path(obj, default_namespace=namespace)
            client.request("DELETE", path, body={"kind": "DeleteOptions", "apiVersion": "v1",
                                                 "propagationPolicy": "Background"})
        except UnknownKindError:
            continue
        except ApiError as error:
            if error.not_found:
                continue
            raise
        echo(f"  deleted {what}{describe(obj)}\n")


def helm_uninstall(release: Release, *, helm: str, kubeconfig: str | None, context: str | None) -> None:
    """``helm uninstall`` of the release, with the storage driver its records are in.

    ``--no-hooks``: the StageSets were handled already (what the chart's pre-delete cleanup hook
    would do), so its Job would only find nothing to do."""
    binary = shutil.which(helm)
    if binary is None:
        raise CliError(f"helm is needed to uninstall the release ({helm!r} not found): install helm, or "
                       "pass --helm-binary")
    args = [binary, "uninstall", release.name, "--namespace", release.namespace, "--no-hooks", "--wait",
            "--timeout", "5m"]
    if kubeconfig:
        args += ["--kubeconfig", kubeconfig]
    if context:
        args += ["--kube-context", context]
    env = {**os.environ, "HELM_DRIVER": release.driver}
    result = subprocess.run(args, env=env, capture_output=True, text=True, check=False, timeout=600)
    for line in (result.stdout + result.stderr).splitlines():
        if line.strip():
            echo(f"  helm: {line.strip()}\n")
    if result.returncode != 0:
        raise CliError(f"helm uninstall {release.name} failed (exit code {result.returncode}); the StageSets "
                       "are already released: run it again")


def remove_release(client: KubeClient, release: Release, *, helm: str, kubeconfig: str | None,
                   context: str | None) -> None:
    """``helm uninstall`` (the manifest's objects, ``helm.sh/resource-policy: keep`` honoured, and
    Helm's records, whichever driver), then what Helm leaves: the controllers' Leases and any hook
    object still there (a hook Job of a failed or interrupted install, its ServiceAccount and rights)."""
    kept = [o for o in release.objects if (o["metadata"].get("annotations") or {}).get(KEEP_POLICY) == "keep"]
    hooks = existing(client, release.hooks, namespace=release.namespace)
    helm_uninstall(release, helm=helm, kubeconfig=kubeconfig, context=context)
    for obj in kept:
        echo(f"  kept {describe(obj)} ({KEEP_POLICY}: keep)\n")
    delete_objects(client, leases(release), namespace=release.namespace, what="")
    delete_objects(client, hooks, namespace=release.namespace, what="leftover hook ")
    echo(f"  Helm forgot release {release.namespace}/{release.name} ({len(release.records)} record(s), "
         f"driver {release.driver})\n")


# -- the command --------------------------------------------------------------------------------

@click.command("uninstall")
@click.option("--release", "release_name", default="stageset", show_default=True, help="The Helm release.")
@click.option("-n", "--namespace", default="stageset-system", show_default=True,
              help="The release's namespace.")
@click.option("--keep-objects", is_flag=True, default=False,
              help="Keep every StageSet and what it applied: suspend each, then drop its finalizer.")
@click.option("--teardown", is_flag=True, default=False,
              help="Delete every StageSet and wait until the controller deleted what each applied.")
@yes_option()
@click.option("--timeout", type=DURATION, default="10m", show_default=True,
              help="With --teardown: how long to wait for the controller.")
@click.option("--namespaces", type=NAMESPACES, default=None,
              help="The StageSets' namespaces (default: what the release's controllers watch).")
@click.option("-A", "--all-namespaces", is_flag=True, default=False,
              help="StageSets of every namespace (default: what the release's controllers watch).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")
@click.option("--context", default=None, help="Kubeconfig context (default: the current one).")
@click.option("--helm-binary", default="helm", show_default=True, envvar="STAGESET_HELM",
              help="The helm that uninstalls the release ($STAGESET_HELM; default: helm on PATH).")
def uninstall(release_name: str, namespace: str, keep_objects: bool, teardown: bool, yes: bool,
              timeout: float, namespaces: tuple[str, ...] | None, all_namespaces: bool,
              kubeconfig: str | None, context: str | None, helm_binary: str) -> None:
    """Uninstall a release of the chart without leaving a StageSet stuck with its finalizer.

    Either keep the StageSets and their objects (--keep-objects: suspended, finalizer dropped) or
    tear them down first (--teardown: deleted, waited for, with progress), then delete the release's
    objects and Helm's records of it.  Asks first unless -y/--yes; with no answer to read, a dry
    run.  The CRDs stay.
    """
    if keep_objects and teardown:
        raise click.UsageError("choose one of --keep-objects and --teardown")
    if namespaces and all_namespaces:
        raise click.UsageError("--namespaces and --all-namespaces cannot be combined")
    session = Session(kubeconfig=kubeconfig, context=context)
    try:
        _uninstall(session.client(), release_name=release_name, namespace=namespace,
                   keep_objects=keep_objects, teardown=teardown, yes=yes, timeout=timeout,
                   helm=Helm(binary=helm_binary, kubeconfig=kubeconfig, context=context),
                   override=Scope(namespaces=None) if all_namespaces else
                   Scope(namespaces=namespaces) if namespaces else None)
    finally:
        session.close()


@dataclass(frozen=True)
class Helm:
    binary: str
    kubeconfig: str | None
    context: str | None


def _uninstall(client: KubeClient, *, release_name: str, namespace: str, keep_objects: bool, teardown: bool,
               yes: bool, timeout: float, helm: Helm, override: Scope | None) -> None:
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
    _plan(client, release, stagesets, keep_objects=keep_objects, prefix="" if yes else "would ")
    what = f"release {namespace}/{release_name}" if release is not None else "the StageSets"
    if not confirmed(f"Uninstall {what}?", yes=yes):
        echo("dry run: nothing changed; pass --yes to uninstall\n")
        return
    if keep_objects:
        _keep(client, stagesets, scopes)
    elif teardown and stagesets:
        _tear_down(client, stagesets, scopes, timeout=timeout)
    if release is not None:
        remove_release(client, release, helm=helm.binary, kubeconfig=helm.kubeconfig, context=helm.context)
    echo("uninstalled\n" if release is not None else "done\n")


def _plan(client: KubeClient, release: Release | None, stagesets: list[KubeObject], *, keep_objects: bool,
          prefix: str) -> None:
    for obj in stagesets:
        action = "suspend, then drop the finalizer of" if keep_objects else "delete (teardown)"
        echo(f"  {prefix}{action} StageSet {key(obj)}\n")
    if release is None:
        return
    echo(f"  {prefix}run helm uninstall {release.name} --namespace {release.namespace} (driver "
         f"{release.driver}): it deletes\n")
    for obj in existing(client, release.objects, namespace=release.namespace):
        if (obj["metadata"].get("annotations") or {}).get(KEEP_POLICY) == "keep":
            echo(f"  {prefix}keep {describe(obj)} ({KEEP_POLICY}: keep)\n")
        else:
            echo(f"  {prefix}delete {describe(obj)}\n")
    for obj in existing(client, leases(release), namespace=release.namespace):
        echo(f"  {prefix}delete {describe(obj)}\n")
    for obj in existing(client, release.hooks, namespace=release.namespace):
        echo(f"  {prefix}delete leftover hook {describe(obj)}\n")
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
