"""``export stageset NAME|--all`` and ``export gitrepository NAME|--all``: the objects as YAML
one can apply again (into Git, into another cluster), as ``flux export`` prints them.

Identity: the user's own (the kubeconfig's credentials, or ``--as``): one ``GET`` of the object,
or one list of the namespace; nothing is written.

Invariant: what is printed is what a person wrote -- ``apiVersion``, ``kind``, name, namespace,
labels, annotations and ``spec`` -- and nothing the cluster or the controller keeps for itself:
no ``status``, ``managedFields``, ``uid``, ``resourceVersion``, ``creationTimestamp``,
``generation``, ``finalizers`` (the controller's teardown finalizer), owner references, the durable
inventory record annotation (it describes *this* cluster's objects), ``kubectl``'s
last-applied annotation, nor the one-shot requests (``reconcile.fluxcd.io/requestedAt``,
``stages.metio.wtf/update-now``, ``stages.metio.wtf/promote``: applied again elsewhere they would
ask again).  Applying the output (server-side or ``kubectl apply``) re-creates the object.
"""

from __future__ import annotations

from typing import Any

import click

from stageset.api.release import ANNOTATION_PROMOTE, ANNOTATION_UPDATE_NOW
from stageset.apply.record import ANNOTATION as RECORD_ANNOTATION
from stageset.cli.completion import complete_gitrepositories, complete_stagesets
from stageset.cli.session import CliError, Session, StagesetGroup, cluster_options, echo
from stageset.cli.tenant import export_yaml
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.status import REQUESTED_AT
from stageset.kube.client import ApiError
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

KEPT_METADATA = ("name", "namespace", "labels", "annotations")
"""The metadata a person writes; everything else in metadata is the cluster's."""
DROPPED_ANNOTATIONS = frozenset({
    RECORD_ANNOTATION, REQUESTED_AT, ANNOTATION_UPDATE_NOW, ANNOTATION_PROMOTE,
    "kubectl.kubernetes.io/last-applied-configuration",
})


def exported(obj: KubeObject) -> dict[str, Any]:
    """``obj`` as one would write it (see the module's invariant).  Pure."""
    meta = obj.get("metadata") or {}
    kept: dict[str, Any] = {}
    for key in KEPT_METADATA:
        value = meta.get(key)
        if key == "annotations" and value:
            value = {k: v for k, v in value.items() if k not in DROPPED_ANNOTATIONS}
        if value:
            kept[key] = value
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept,
            "spec": obj.get("spec") or {}}


def _objects(session: Session, resource: Resource, name: str | None, every: bool) -> list[KubeObject]:
    if (name is None) == (not every):
        raise click.UsageError(f"name one {resource.kind}, or pass --all for every one of the namespace")
    namespace = session.namespace
    client = session.client()
    try:
        if name is not None:
            return [client.get(resource.object_path(name=name, namespace=namespace))]
        listed = client.get(resource.collection_path(namespace)).get("items", [])
    except ApiError as error:
        if error.not_found:
            raise CliError(f"{resource.kind} {namespace}/{name} not found") from None
        if error.forbidden:
            raise CliError(f"you may not read {resource.kind}s in namespace {namespace}: {error.message}"
                           ) from None
        raise
    # A list's items carry no apiVersion and kind of their own.
    items = [{"apiVersion": resource.api_version, "kind": resource.kind, **item} for item in listed]
    return sorted(items, key=lambda o: str(o["metadata"]["name"]))


def _export(session: Session, resource: Resource, name: str | None, every: bool) -> None:
    objects = [exported(obj) for obj in _objects(session, resource, name, every)]
    if not objects:
        click.echo(f"No {resource.kind}s found in namespace {session.namespace}.", err=True)
        return
    echo(export_yaml(objects))


@click.group("export", cls=StagesetGroup)
def export() -> None:
    """Print StageSets or GitRepositories as YAML to apply again (no status, nothing the cluster keeps)."""


ALL = click.option("--all", "every", is_flag=True, default=False,
                   help="Every one of the namespace (instead of NAME).")


@export.command("stageset")
@click.argument("name", required=False, shell_complete=complete_stagesets)
@ALL
@cluster_options(outputs=("yaml",))
def export_stageset(session: Session, name: str | None, every: bool) -> None:
    """Print a StageSet (or with --all every StageSet of the namespace) as YAML to apply again.

    Left out: status, managedFields, uid, resourceVersion, creationTimestamp, generation,
    finalizers, the inventory-record annotation and one-shot requests (requestedAt,
    update-now, promote).
    """
    _export(session, STAGESETS, name, every)


@export.command("gitrepository")
@click.argument("name", required=False, shell_complete=complete_gitrepositories)
@ALL
@cluster_options(outputs=("yaml",))
def export_gitrepository(session: Session, name: str | None, every: bool) -> None:
    """Print a GitRepository (or with --all every one of the namespace) as YAML to apply again.

    Its credentials Secret is named (spec.secretRef), never read.
    """
    _export(session, GITREPOSITORIES, name, every)


# Flux's shape, as the other verbs have it (`get sources git`, `create source git`): `export source git`.
_source = StagesetGroup("source", help="Export a source (GitRepository: `git`), as `flux export source git`.")
_source.add_command(export_gitrepository, "git")
export.add_command(_source)
