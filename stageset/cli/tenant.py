"""``create tenant`` and ``delete tenant``: a tenant's namespaces, deployer, rights, network
isolation, quota and limits in one step, and their removal.

Identity: every request is the user's own (the kubeconfig's credentials, server-side apply with
field manager ``stageset``), as ``flux create tenant`` does; the controller takes no part.  With
``--export`` no cluster is contacted at all: the YAML is printed (the same flags always give the
same bytes) for the platform's own Git.  What the objects are, and that nothing cluster-wide is
granted, is :mod:`stageset.cli.tenantobjects`' to say.

``delete tenant`` is the inverse and a dry run unless ``--yes``: it lists the tenant's StageSets
and namespaces (those labelled ``stages.metio.wtf/tenant=NAME``); with ``--yes`` it deletes the
StageSets first and waits until the controller tore them down (as each StageSet's own
ServiceAccount, while that account's RoleBindings still exist), then the namespaces.
"""

from __future__ import annotations

from typing import Any

import click
import yaml

from stageset.api.tenancy import TENANT_LABEL
from stageset.cli import cleanup
from stageset.cli.completion import complete_nothing
from stageset.cli.params import DURATION
from stageset.cli.session import DNS_LABEL, CliError, Session, StagesetGroup, confirmed, echo, yes_option
from stageset.cli.tenantobjects import (
    DEFAULT_CLUSTER_ROLE,
    DEFAULT_SERVICE_ACCOUNT,
    NAMESPACES,
    TenantSpec,
    limit_range_limits,
    namespace_label,
    object_path,
    parse_pairs,
    quota_hard,
    tenant_objects,
)
from stageset.kube.client import ApiError

FIELD_MANAGER = "stageset"


class _PlainDumper(yaml.SafeDumper):
    """No anchors and aliases: every document stands alone, as a reviewer reads it.  A list of plain
    values is one line (``verbs: [get, list, watch]``), so a role's rules read as a table."""

    def ignore_aliases(self, data: Any) -> bool:
        del data
        return True


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flat = all(isinstance(item, (str, int, float, bool)) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat and bool(data))


_PlainDumper.add_representer(list, _represent_list)


def export_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML, keys in the order built (deterministic)."""
    return "".join("---\n" + yaml.dump(obj, Dumper=_PlainDumper, sort_keys=False, width=1_000_000)
                   for obj in objects)


def _kubeconfig_options(command: Any) -> Any:
    command = click.option("--context", default=None, help="Kubeconfig context (default: the current one).")(
        command)
    return click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
                        help="Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")(command)


@click.group("create", cls=StagesetGroup)
def create() -> None:
    """Create a tenant, a StageSet or a GitRepository (source git)."""


@click.group("delete", cls=StagesetGroup)
def delete() -> None:
    """Delete a tenant, a StageSet or a GitRepository (source git)."""


@create.command("tenant")
@click.argument("name", type=DNS_LABEL, shell_complete=complete_nothing)
@click.option("--with-namespace", "namespaces", multiple=True, type=DNS_LABEL, required=True,
              help="A workload namespace of the tenant (repeatable; created if missing).")
@click.option("--control-plane-namespace", type=DNS_LABEL, default=None,
              help="The namespace that holds the tenant's StageSets and sources; its deployer is bound "
              "in every workload namespace.")
@click.option("--service-account", type=DNS_LABEL, default=DEFAULT_SERVICE_ACCOUNT, show_default=True,
              help="The deployer ServiceAccount made in each namespace.")
@click.option("--cluster-role", default=DEFAULT_CLUSTER_ROLE, show_default=True,
              help="The ClusterRole bound (per namespace, by a RoleBinding) to the deployers. The default "
              "may not write NetworkPolicies, ResourceQuotas, LimitRanges, Roles or RoleBindings; 'edit' "
              "may write NetworkPolicies, so a tenant's Git could loosen its own isolation "
              "(docs/tenants.md).")
@click.option("--admin-user", "admin_users", multiple=True, metavar="USER",
              help="A person bound to stageset-tenant-admin (admin minus the guardrails) in each namespace "
              "(repeatable).")
@click.option("--admin-group", "admin_groups", multiple=True, metavar="GROUP",
              help="A group bound to stageset-tenant-admin in each namespace (repeatable).")
@click.option("--allow-from-namespace-label", "allow_from", multiple=True, metavar="KEY=VALUE",
              help="Allow ingress from pods in namespaces with this label (an ingress controller, "
              "monitoring; repeatable).")
@click.option("--allow-to-namespace-label", "allow_to", multiple=True, metavar="KEY=VALUE",
              help="Allow egress to pods in namespaces with this label (shared platform services; "
              "repeatable).")
@click.option("--quota", default="", metavar="K=V,...",
              help="A ResourceQuota's hard limits in each namespace, e.g. "
              "requests.cpu=4,requests.memory=8Gi,stagesets=2 (stagesets: count/stagesets.stages.metio.wtf).")
@click.option("--limit-range", default="", metavar="K=V,...",
              help="A Container LimitRange in each namespace: default-cpu, default-memory (default limits), "
              "request-cpu, request-memory (default requests).")
@click.option("--export", "export_only", is_flag=True, default=False,
              help="Print the YAML (deterministic) instead of applying it; contacts no cluster.")
@_kubeconfig_options
def create_tenant(name: str, namespaces: tuple[str, ...], control_plane_namespace: str | None,
                  service_account: str, cluster_role: str, admin_users: tuple[str, ...],
                  admin_groups: tuple[str, ...], allow_from: tuple[str, ...], allow_to: tuple[str, ...],
                  quota: str, limit_range: str, export_only: bool, kubeconfig: str | None,
                  context: str | None) -> None:
    """Create a tenant: namespaces, a deployer in each, its rights there, network isolation, quota, limits.

    Every namespace is labelled stages.metio.wtf/tenant=NAME and gets a deployer ServiceAccount, a
    RoleBinding of --cluster-role to it (in workload namespaces also to the control-plane
    namespace's deployer), the admins' RoleBinding, a default-deny NetworkPolicy with exceptions
    for the tenant's own namespaces, DNS and the labelled shared namespaces, and the ResourceQuota
    and LimitRange asked for. The default roles (stageset-tenant-deployer, stageset-tenant-admin,
    applied too) may not write those policies, quotas, limits or bindings. Nothing cluster-wide is
    granted. Applied server-side as you (field manager stageset); --export prints it instead.
    """
    if control_plane_namespace and control_plane_namespace in namespaces:
        raise click.BadParameter("the control-plane namespace cannot also be a workload namespace",
                                 param_hint="--control-plane-namespace")
    try:
        spec = TenantSpec(
            name=name, namespaces=namespaces, control_plane_namespace=control_plane_namespace,
            service_account=service_account, cluster_role=cluster_role,
            admin_users=admin_users, admin_groups=admin_groups,
            allow_from=tuple(namespace_label(pair, what="--allow-from-namespace-label")
                             for pair in allow_from),
            allow_to=tuple(namespace_label(pair, what="--allow-to-namespace-label") for pair in allow_to),
            quota=quota_hard(parse_pairs(quota, what="--quota")) or None,
            limit_range=limit_range_limits(parse_pairs(limit_range, what="--limit-range")) or None)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    objects = tenant_objects(spec)
    if export_only:
        echo(export_yaml(objects))
        return
    session = Session(kubeconfig=kubeconfig, context=context)
    try:
        client = session.client()
        for obj in objects:
            where = "/".join(filter(None, (obj["metadata"].get("namespace"), obj["metadata"]["name"])))
            try:
                client.apply(object_path(obj), obj, field_manager=FIELD_MANAGER)
            except ApiError as error:
                if error.forbidden:
                    raise CliError(f"you may not apply {obj['kind']} {where}: {error.message}") from None
                raise
            echo(f"applied {obj['kind']} {where}\n")
    finally:
        session.close()
    echo(f"tenant {name} is ready: StageSets in "
         f"{control_plane_namespace or ', '.join(sorted(set(namespaces)))} name "
         f"serviceAccountName: {service_account}\n")


@delete.command("tenant")
@click.argument("name", type=DNS_LABEL, shell_complete=complete_nothing)
@yes_option()
@click.option("--timeout", type=DURATION, default="10m", show_default=True,
              help="How long to wait for the controller to tear the tenant's StageSets down.")
@_kubeconfig_options
def delete_tenant(name: str, yes: bool, timeout: float, kubeconfig: str | None, context: str | None) -> None:
    """Delete a tenant: its StageSets first (the controller tears them down), then its namespaces.

    The tenant's namespaces are those labelled stages.metio.wtf/tenant=NAME; deleting them deletes
    everything in them. It lists what it would delete, in order, then asks, unless -y/--yes; with
    no answer to read, a dry run.
    """
    session = Session(kubeconfig=kubeconfig, context=context)
    try:
        client = session.client()
        try:
            found = client.request("GET", NAMESPACES.collection_path(),
                                   query={"labelSelector": f"{TENANT_LABEL}={name}"}).get("items", [])
        except ApiError as error:
            if error.forbidden:
                raise CliError(f"you may not list namespaces: {error.message}") from None
            raise
        namespaces = tuple(sorted(str(ns["metadata"]["name"]) for ns in found))
        if not namespaces:
            raise CliError(f"no namespace is labelled {TENANT_LABEL}={name}")
        stagesets = cleanup.listed(client, namespaces)
        echo(f"{'deleting' if yes else 'would delete'} tenant {name}, in this order:\n")
        for obj in stagesets:
            echo(f"  StageSet {obj['metadata']['namespace']}/{obj['metadata']['name']}\n")
        for namespace in namespaces:
            echo(f"  Namespace {namespace}\n")
        if not confirmed(f"Delete tenant {name}?", yes=yes):
            echo("dry run: nothing deleted (pass --yes to delete)\n")
            return
        cleanup.delete_and_wait(client, scope=namespaces, selector=None, timeout=timeout,
                                where=", ".join(namespaces))
        for namespace in namespaces:
            try:
                client.delete(NAMESPACES.object_path(name=namespace))
            except ApiError as error:
                if error.not_found:
                    continue
                if error.forbidden:
                    raise CliError(f"you may not delete namespace {namespace}: {error.message}") from None
                raise
            echo(f"  deleted Namespace {namespace}\n")
    finally:
        session.close()
