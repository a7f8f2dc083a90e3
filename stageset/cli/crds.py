"""``crds``: print the CustomResourceDefinitions, or (``--apply``) take them over and upgrade them.

Every path this project ships that writes the CRDs to a cluster ends in :func:`apply_crds`, with
one field manager (:data:`FIELD_MANAGER`) and forced ownership: the chart's pre-install /
pre-upgrade hook Job, ``stageset crds --apply`` run by hand, and ``make run --kubeconfig``.  Forced,
because whoever applied them before (``kubectl apply --server-side`` as ``kubectl``, a client-side
``kubectl apply -f crds/``, ``kubectl create``, Helm's own manager of an older chart that rendered
them as templates) owns ``.spec.versions`` and would make a plain apply of a newer schema fail with
a conflict (docs/upgrading.md#the-crds).  A CRD that carries a newer project version
(:data:`VERSION_ANNOTATION`) than this one is left alone: two releases of different versions on
one cluster never downgrade each other's schema.

With ``--tenant-roles`` it also applies the two shared ClusterRoles that ``stageset create tenant``
binds (``stageset-tenant-deployer``, ``stageset-tenant-admin``:
:func:`stageset.api.rbac.tenant_cluster_roles`), with the same field manager and forced, as the
chart's hook does when ``rbac.tenantRoles`` is on: like the CRDs they are the cluster's, not a
release's, so any number of releases apply them.

Identity: the caller's own credentials (the kubeconfig; in the chart's hook Job, a ServiceAccount
that may only get, create and patch our CRDs — and with ``rbac.tenantRoles`` get, create, patch
and escalate the two tenant ClusterRoles, by name — and exists only while the hook runs).
"""

from __future__ import annotations

import json
import re
import time

import click

from stageset.api.crd import KINDS, VERSION_ANNOTATION, Kind, custom_resource_definition, render
from stageset.api.rbac import tenant_cluster_roles
from stageset.cli.check import client_version
from stageset.cli.session import CliError, Session, echo
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject

FIELD_MANAGER = "stageset"
"""The one field manager of the CRDs on every path we ship (the hook, ``--apply``, ``make run``)."""
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CLUSTER_ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"


def _release(version: str) -> tuple[int, ...] | None:
    """``0.3.0`` -> (0, 3, 0); a version with anything past its numbers (``0.3.0rc1``, ``0.3.0.dev4``)
    or none at all compares as unknown (None): such a CRD is replaced, never guarded."""
    match = re.fullmatch(r"v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def newer(live: str, ours: str) -> bool:
    """Whether a CRD applied by version ``live`` must be kept over ``ours`` (both known and live later)."""
    left, right = _release(live), _release(ours)
    return left is not None and right is not None and left > right


def _get(client: KubeClient, name: str) -> KubeObject | None:
    try:
        return client.get(f"{CRDS}/{name}")
    except ApiError as error:
        if error.not_found:
            return None
        raise


def _established(obj: KubeObject | None) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def apply_crds(client: KubeClient, *, version: str, timeout: float = 60.0,
               kinds: tuple[Kind, ...] = KINDS) -> list[str]:
    """Server-side apply the CRDs of ``kinds`` as :data:`FIELD_MANAGER`, forcing ownership of every
    field, unless the cluster holds a newer version's; wait until each is Established.  One line
    per CRD saying what happened."""
    said: list[str] = []
    for kind in kinds:
        live = _get(client, kind.crd_name)
        live_version = ((live or {}).get("metadata", {}).get("annotations") or {}).get(VERSION_ANNOTATION, "")
        if live is not None and newer(live_version, version):
            said.append(f"kept {kind.crd_name}: its schema is of stageset {live_version}, "
                        f"newer than {version}")
            continue
        crd = custom_resource_definition(kind)
        crd["metadata"]["annotations"] = {VERSION_ANNOTATION: version}
        try:
            client.apply(f"{CRDS}/{kind.crd_name}", crd, field_manager=FIELD_MANAGER, force=True)
        except ApiError as error:
            if error.forbidden:
                raise CliError(f"you may not apply the CustomResourceDefinition {kind.crd_name} "
                               f"({error.message}): applying the CRDs needs a cluster admin") from None
            raise
        verb = "created" if live is None else "upgraded" if live_version != version else "applied"
        said.append(f"{verb} {kind.crd_name} (stageset {version})")
    deadline = time.monotonic() + timeout
    for kind in kinds:
        while not _established(_get(client, kind.crd_name)):
            if time.monotonic() > deadline:
                raise CliError(f"{kind.crd_name} is not Established after {timeout:g}s")
            time.sleep(0.2)
    return said


def apply_tenant_roles(client: KubeClient) -> list[str]:
    """Server-side apply the tenants' shared ClusterRoles as :data:`FIELD_MANAGER`, forced."""
    said: list[str] = []
    for role in tenant_cluster_roles():
        name = role["metadata"]["name"]
        try:
            client.apply(f"{CLUSTER_ROLES}/{name}", role, field_manager=FIELD_MANAGER, force=True)
        except ApiError as error:
            if error.forbidden:
                raise CliError(f"you may not apply the ClusterRole {name} ({error.message}): it needs a "
                               "cluster admin, or escalate on that role") from None
            raise
        said.append(f"applied ClusterRole {name}")
    return said


@click.command("crds")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--apply", "apply_", is_flag=True, default=False,
              help="Apply them to the cluster instead (server-side, field manager 'stageset', taking over "
              "every field whoever applied it before; a newer version's CRDs are kept).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --apply: kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then "
              "in-cluster).")
@click.option("--context", default=None, help="With --apply: kubeconfig context (default: the current one).")
@click.option("--tenant-roles", is_flag=True, default=False,
              help="With --apply: also apply the ClusterRoles stageset-tenant-deployer and "
              "stageset-tenant-admin that `stageset create tenant` binds (docs/tenants.md).")
def crds(output: str, apply_: bool, kubeconfig: str | None, context: str | None, tenant_roles: bool) -> None:
    """Print the CustomResourceDefinitions, or apply them with --apply.

    What the chart's hook runs before every install and upgrade; by hand: `stageset crds --apply`
    (needs a cluster admin).  Printed, they may be applied with `kubectl apply --server-side -f -`;
    the chart takes them over from there (docs/upgrading.md#the-crds).
    """
    if not apply_:
        if kubeconfig or context or tenant_roles:
            raise click.UsageError("--kubeconfig, --context and --tenant-roles need --apply")
        if output == "json":
            items = [custom_resource_definition(kind) for kind in KINDS]
            echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2) + "\n")
            return
        echo("---\n".join(render(kind) for kind in KINDS))
        return
    session = Session(kubeconfig=kubeconfig, context=context)
    try:
        client = session.client()
        for line in apply_crds(client, version=client_version()):
            echo(line + "\n")
        if tenant_roles:
            for line in apply_tenant_roles(client):
                echo(line + "\n")
    finally:
        session.close()
