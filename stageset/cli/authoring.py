"""``create stageset``, ``create source git``, ``delete stageset``, ``delete source git``: writing a
StageSet or a GitRepository from flags, in ``flux create``'s and ``flux delete``'s shapes.

Identity: every request is the user's own (the kubeconfig's credentials, or ``--as``): a
server-side apply with field manager ``stageset`` (``create``; applying again updates what the
flags own), or one ``DELETE`` (``delete``).  The controller takes no part until the object exists;
a StageSet's stages are applied as ``--service-account`` (``spec.serviceAccountName``), never as
the user.  With ``--export`` no cluster is contacted: the YAML is printed (the same flags always
give the same bytes), for the platform's own Git.

``delete`` asks before deleting, as ``flux delete`` does, unless ``-s``/``--silent``.  Deleting a
StageSet lets the controller tear down what its stages applied (its ``deletionPolicy`` decides);
deleting a GitRepository leaves the StageSets that use it waiting for a source.
"""

from __future__ import annotations

from typing import Any

import click

from stageset.cli.completion import complete_gitrepositories, complete_nothing, complete_stagesets
from stageset.cli.params import parse_duration_option
from stageset.cli.session import (
    DNS_LABEL,
    CliError,
    Session,
    StagesetGroup,
    cluster_options,
    confirmed,
    echo,
    yes_option,
)
from stageset.cli.tenant import FIELD_MANAGER, create, delete, export_yaml
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.kube.client import ApiError
from stageset.kube.mapping import Resource

OUR_SOURCE_KIND = "GitRepository"


def parse_stage(text: str) -> dict[str, Any]:
    """``name=path[,dependsOn=a][,dependsOn=b]`` as a stage (``path`` relative to the source root).
    Raises :class:`click.BadParameter`."""
    head, *rest = text.split(",")
    name, sep, path = head.partition("=")
    if not sep or not name or not path:
        raise click.BadParameter(f"{text!r}: expected NAME=PATH[,dependsOn=STAGE]", param_hint="--stage")
    DNS_LABEL.convert(name, None, None)
    stage: dict[str, Any] = {"name": name, "path": path}
    for item in rest:
        key, sep, value = item.partition("=")
        if key != "dependsOn" or not sep or not value:
            raise click.BadParameter(f"{text!r}: unknown {item!r} (only dependsOn=STAGE)",
                                     param_hint="--stage")
        stage.setdefault("dependsOn", []).append(value)
    return stage


def parse_source(text: str) -> dict[str, str]:
    """``KIND/NAME`` (``GitRepository/app``: ours; a Flux kind: ``OCIRepository/app``) or ``NAME``
    (our GitRepository) as a ``sourceRef``."""
    kind, sep, name = text.rpartition("/")
    if not name or (sep and not kind):
        raise click.BadParameter(f"{text!r}: expected KIND/NAME, e.g. GitRepository/app",
                                 param_hint="--source")
    return {"kind": kind or OUR_SOURCE_KIND, "name": name}


def stageset_object(*, name: str, namespace: str, source: dict[str, str], stages: list[dict[str, Any]],
                    service_account: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"stages": [{"name": s["name"], "sourceRef": source, **{k: v for k, v in s.items()
                                                                                   if k != "name"}}
                                       for s in stages]}
    if service_account:
        spec["serviceAccountName"] = service_account
    return {"apiVersion": STAGESETS.api_version, "kind": STAGESETS.kind,
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def gitrepository_object(*, name: str, namespace: str, url: str, ref: dict[str, str], interval: str | None,
                         secret: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"url": url, "ref": ref}
    if interval:
        spec["interval"] = interval
    if secret:
        spec["secretRef"] = {"name": secret}
    return {"apiVersion": GITREPOSITORIES.api_version, "kind": GITREPOSITORIES.kind,
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def _apply(session: Session, resource: Resource, obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    where = f"{resource.kind} {meta['namespace']}/{meta['name']}"
    try:
        session.client().apply(resource.object_path(name=meta["name"], namespace=meta["namespace"]), obj,
                               field_manager=FIELD_MANAGER)
    except ApiError as error:
        if error.forbidden:
            raise CliError(f"you may not apply {where}: {error.message}") from None
        if error.invalid:
            raise CliError(f"the cluster refused {where}: {error.message}") from None
        raise
    echo(f"applied {where}\n")


def _delete(session: Session, resource: Resource, name: str, yes: bool) -> None:
    namespace = session.namespace
    where = f"{resource.kind} {namespace}/{name}"
    if not confirmed(f"Are you sure you want to delete {where}?", yes=yes):
        echo(f"dry run: {where} not deleted (pass --yes to delete)\n")
        return
    try:
        session.client().delete(resource.object_path(name=name, namespace=namespace))
    except ApiError as error:
        if error.not_found:
            raise CliError(f"{where} not found") from None
        if error.forbidden:
            raise CliError(f"you may not delete {where}: {error.message}") from None
        raise
    echo(f"deleted {where}\n")


EXPORT = click.option("--export", "export_only", is_flag=True, default=False,
                      help="Print the YAML (deterministic) instead of applying it; contacts no cluster.")
SILENT = yes_option(silent=True)


@click.command("stageset")
@click.argument("name", type=DNS_LABEL, shell_complete=complete_nothing)
@click.option("--source", "source", required=True, metavar="KIND/NAME",
              help="The source every stage reads: GitRepository/NAME (ours), or a Flux source kind/NAME.")
@click.option("--stage", "stages", multiple=True, required=True, metavar="NAME=PATH[,dependsOn=STAGE]",
              help="A stage, in order (repeatable): its name, its path in the source, and the stages it "
              "waits for (dependsOn, repeatable inside the value).")
@click.option("--service-account", default=None, metavar="NAME",
              help="The ServiceAccount (of the namespace) the stages are applied as "
              "(spec.serviceAccountName).")
@EXPORT
@cluster_options(outputs=("table",))
def create_stageset(session: Session, name: str, source: str, stages: tuple[str, ...],
                    service_account: str | None, export_only: bool) -> None:
    """Create (or update) a StageSet: its stages, in order, from one source.

    \b
    stageset create stageset shop -n shop --source GitRepository/shop \\
      --stage config=./config --stage app=./app,dependsOn=config --service-account deployer

    Applied server-side as you (field manager stageset); --export prints it instead.
    """
    parsed = [parse_stage(text) for text in stages]
    namespace = session.namespace_flag or ("default" if export_only else session.namespace)
    obj = stageset_object(name=name, namespace=namespace, source=parse_source(source), stages=parsed,
                          service_account=service_account)
    if export_only:
        echo(export_yaml([obj]))
        return
    _apply(session, STAGESETS, obj)


def _duration_text(value: str | None) -> str | None:
    """A duration flag kept as written (``5m``): the spec holds the text; refused when not one."""
    if value is not None:
        parse_duration_option(value)
    return value


def _git_ref(branch: str | None, tag: str | None, semver: str | None) -> dict[str, str]:
    chosen = {key: value for key, value in (("branch", branch), ("tag", tag), ("semver", semver)) if value}
    if len(chosen) != 1:
        raise click.UsageError("pass exactly one of --branch, --tag and --semver")
    return chosen


@click.command("git")
@click.argument("name", type=DNS_LABEL, shell_complete=complete_nothing)
@click.option("--url", required=True,
              help="Repository URL: https://, http://, ssh://, file:// or git@host:path.")
@click.option("--branch", default=None, help="Follow this branch.")
@click.option("--tag", default=None, help="Check out this tag.")
@click.option("--semver", default=None, metavar="RANGE", help="The newest tag in this semver range.")
@click.option("--interval", callback=lambda _c, _p, v: _duration_text(v), default=None, metavar="DURATION",
              help="How often to fetch (default: 1m).")
@click.option("--secret-ref", default=None, metavar="NAME",
              help="The Secret (of the namespace) with the credentials: named, never read by this command.")
@EXPORT
@cluster_options(outputs=("table",))
def create_git(session: Session, name: str, url: str, branch: str | None, tag: str | None, semver: str | None,
               interval: str | None, secret_ref: str | None, export_only: bool) -> None:
    """Create (or update) a GitRepository: the repository and the reference to follow.

    \b
    stageset create source git shop -n shop --url https://git.example/shop.git --branch main

    Applied server-side as you (field manager stageset); --export prints it instead.
    """
    ref = _git_ref(branch, tag, semver)
    namespace = session.namespace_flag or ("default" if export_only else session.namespace)
    obj = gitrepository_object(name=name, namespace=namespace, url=url, ref=ref, interval=interval,
                               secret=secret_ref)
    if export_only:
        echo(export_yaml([obj]))
        return
    _apply(session, GITREPOSITORIES, obj)


@click.command("stageset")
@click.argument("name", shell_complete=complete_stagesets)
@SILENT
@cluster_options(outputs=("table",))
def delete_stageset(session: Session, name: str, yes: bool) -> None:
    """Delete a StageSet; the controller tears down what its stages applied (spec.deletionPolicy).

    Asks first, unless -y/--yes (or Flux's -s/--silent); with no answer to read, a dry run.
    """
    _delete(session, STAGESETS, name, yes)


@click.command("git")
@click.argument("name", shell_complete=complete_gitrepositories)
@SILENT
@cluster_options(outputs=("table",))
def delete_git(session: Session, name: str, yes: bool) -> None:
    """Delete a GitRepository; StageSets that use it wait for a source.  Asks first, unless -y/--yes."""
    _delete(session, GITREPOSITORIES, name, yes)


def create_group() -> click.Group:
    """``create`` with every form (``tenant``, ``stageset``, ``source git``)."""
    register()
    return create


def delete_group() -> click.Group:
    """``delete`` with every form (``tenant``, ``stageset``, ``source git``)."""
    register()
    return delete


def register() -> None:
    """Add the StageSet and Git source forms to ``create`` and ``delete`` (beside ``tenant``); once."""
    if "stageset" in create.commands:
        return
    create.add_command(create_stageset)
    delete.add_command(delete_stageset)
    for group, git in ((create, create_git), (delete, delete_git)):
        source = StagesetGroup("source", help=f"{group.name.capitalize() if group.name else ''} a source "
                               "(GitRepository: `git`).")
        source.add_command(git)
        group.add_command(source)
