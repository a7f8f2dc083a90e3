"""``build`` and ``diff``: what a StageSet renders, and what applying it would change.

Identity: see :mod:`stageset.cli.render` — sources and ``substituteFrom`` are read, and every
object is read and server-side dry-run, as the **stage's ServiceAccount** (impersonated), the
identity the controller applies with; a StageSet without one is handled as the user.  The
dry-run goes through the apply engine's own preview step
(:meth:`stageset.apply.engine.StageApplier.preview`): the same labels, field manager, forced
ownership and phase binding as a real apply, writing nothing.  Prune candidates are read as
the identity their inventory records.  On a remote cluster (``spec.kubeConfig``) the
kubeconfig Secret is read as the StageSet's ServiceAccount, and the remote is asked as the
controller would ask it.

Secret values (and values decrypted from SOPS files) never reach the output of ``diff``;
``build`` shows them only with ``--show-secrets``.
"""

from __future__ import annotations

import difflib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml

from stageset.api import StageInventory, StageSet, StageSetStatus
from stageset.apply.changeset import WRITES, Action
from stageset.apply.conflicts import ConflictResolver
from stageset.apply.engine import StageApplier
from stageset.apply.errors import StageError
from stageset.apply.inventory import (
    by_stage,
    describe,
    entry,
    entry_id,
    manifest_hash,
    split_by_target,
    stage_inventory,
)
from stageset.apply.ownership import StageOwner
from stageset.apply.prune import Owner, candidates, deletable, entry_path, unpruned_stages
from stageset.apply.record import parse as parse_record
from stageset.apply.settings import ApplySettings
from stageset.build.kustomize import cache_root
from stageset.cli.inspect import read_stageset
from stageset.cli.render import (
    POLICY,
    RenderedStage,
    Renderer,
    SessionClients,
    SourceDirs,
    mask_secret,
    parse_stageset,
    redact_strings,
    stageset_from_file,
)
from stageset.cli.session import CliError, ExitCode, Session, cluster_options, dump, echo
from stageset.controller.sourcekinds import DefaultSourceKind
from stageset.controller.stageset import actionplan
from stageset.controller.stageset.pruning import released_stages
from stageset.controller.stageset.rendering import identify
from stageset.controller.targets.clusters import Target, Targets, named
from stageset.controller.targets.credentials import KubeconfigSecret, KubeConfigSources, Unavailable
from stageset.kube.client import LOCAL, ApiError, Identity, KubeClient
from stageset.kube.mapping import RestMapper
from stageset.kube.types import KubeObject


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def cli_cache_dir() -> Path:
    """Where the CLI keeps its Git mirrors and artifacts: beside the project's other caches (kept
    between runs)."""
    try:
        return cache_root()
    except OSError:
        return Path(tempfile.gettempdir()) / "stageset-cli"


def _load(session: Session, name: str | None, file: str | None) -> tuple[StageSet, KubeObject | None]:
    """The StageSet to preview, and the live one (for its inventory) when there is one."""
    if file is not None:
        namespace = session.namespace_flag or "default"
        stageset = stageset_from_file(Path(file), name=name, namespace=namespace)
        return stageset, None
    if name is None:
        raise click.UsageError("give NAME (a StageSet in the cluster) or -f FILE")
    raw = read_stageset(session, name)
    return parse_stageset(raw, where=f"StageSet {session.namespace}/{name}"), raw


def _source_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option("--default-source-kind", type=click.Choice([k.value for k in DefaultSourceKind]),
                           default=DefaultSourceKind.GIT_REPOSITORY.value, show_default=True,
                           envvar="STAGESET_DEFAULT_SOURCE_KIND",
                           help="What an omitted sourceRef.kind means: set it as the controller's "
                           "--default-source-kind is set.")(command)
    command = click.option("--sops-age-key-file", "age_key_file", default=None,
                           type=click.Path(exists=True, dir_okay=False, path_type=Path),
                           help="Decrypt SOPS-encrypted files with this age identity file instead of "
                           "the StageSet's spec.decryption Secret.")(command)
    command = click.option("--source-dir", "source_dirs", multiple=True, metavar="[SOURCE=]DIR",
                           help="Read the sources from a local checkout instead of Git or an artifact: DIR "
                           "for every source, or SOURCE=DIR per source name (repeatable); the way out "
                           "when an artifact URL is reachable only inside the cluster.")(command)
    return click.option("-f", "--file", type=click.Path(exists=True, dir_okay=False), default=None,
                        help="Take the StageSet from this file instead of the cluster.")(command)


# -- build ----------------------------------------------------------------------------------------

def _stage_header(rendered: RenderedStage) -> str:
    who = rendered.identity.user or "you"
    return (f"# stage {rendered.stage.name}: path {rendered.stage.path} at {rendered.revision or '-'}, "
            f"applied as {who}\n")


@click.command("build")
@click.argument("name", required=False)
@_source_options
@click.option("--show-secrets", is_flag=True, default=False,
              help="Print Secret values, values substituted from Secrets and values decrypted from SOPS "
              "files (masked by default).")
@cluster_options(outputs=("yaml", "json"))
def build(session: Session, name: str | None, file: str | None, source_dirs: tuple[str, ...],
          default_source_kind: str, age_key_file: Path | None, show_secrets: bool) -> None:
    """Render every stage of a StageSet as the controller would: manifests with substitutions.

    \b
    stageset build shop -n shop                     # the cluster's StageSet and sources
    stageset build shop -n shop --source-dir .      # the cluster's StageSet, your checkout
    stageset build -f stageset.yaml --source-dir .  # no cluster at all
    """
    sources = SourceDirs.parse(source_dirs)
    local = file is not None and bool(sources)
    stageset, _ = _load(session, name, file)
    renderer = Renderer(clients=None if local else SessionClients(session), sources=sources,
                        cache_dir=cli_cache_dir(), warn=_warn,
                        default_source_kind=DefaultSourceKind(default_source_kind), age_key_file=age_key_file)
    stages = renderer.render(stageset)

    def shown(obj: KubeObject) -> KubeObject:
        return obj if show_secrets else mask_secret(redact_strings(obj, renderer.redactor))

    failed = False
    documents: list[dict[str, Any]] = []
    for rendered in stages:
        if rendered.error is not None:
            failed = True
            click.echo(f"error: stage {rendered.stage.name}: {rendered.error}", err=True)
            continue
        documents.append({"stage": rendered.stage.name, "path": rendered.stage.path,
                          "revision": rendered.revision, "identity": rendered.identity.user,
                          "objects": [shown(o) for o in rendered.objects]})
    if session.output == "json":
        echo(dump(documents, "json"))
    else:
        for rendered, document in zip([r for r in stages if r.error is None], documents, strict=True):
            echo(_stage_header(rendered))
            for obj in document["objects"]:
                echo("---\n" + yaml.safe_dump(obj, sort_keys=False, allow_unicode=True, width=1_000_000))
    if failed:
        raise click.exceptions.Exit(ExitCode.ERROR)


# -- diff -----------------------------------------------------------------------------------------

_VOLATILE = ("managedFields", "resourceVersion", "generation", "uid", "creationTimestamp")


def _clean(obj: KubeObject | None) -> KubeObject | None:
    """Without what changes on every write and means nothing to a reader."""
    if obj is None:
        return None
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _VOLATILE}
    return {**obj, "metadata": metadata}


def _yaml_lines(obj: KubeObject | None) -> list[str]:
    if obj is None:
        return []
    return yaml.safe_dump(obj, sort_keys=True, allow_unicode=True, width=1_000_000).splitlines(keepends=True)


@dataclass
class ObjectDiff:
    object: str
    action: str
    diff: str
    note: str = ""


@dataclass
class StageDiff:
    name: str
    identity: str | None
    revision: str
    objects: list[ObjectDiff] = field(default_factory=list)
    error: str | None = None
    actions: list[dict[str, Any]] = field(default_factory=list)
    """What the stage's ``pre`` and ``post`` actions would do: run, or be skipped (ran for this revision)."""

    @property
    def changed(self) -> list[ObjectDiff]:
        return [o for o in self.objects if o.action != Action.UNCHANGED.value]


def unified(name: str, before: KubeObject | None, after: KubeObject | None, *,
            redact: Callable[[str], str]) -> str:
    """A unified diff of two objects as YAML, Secret values masked (and Secret-substituted values)."""
    live = _clean(redact_strings(before, redact)) if before is not None else None
    new = _clean(redact_strings(after, redact)) if after is not None else None
    if new is not None:
        new = mask_secret(new, before=live)
    if live is not None:
        live = mask_secret(live)
    return "".join(difflib.unified_diff(_yaml_lines(live), _yaml_lines(new),
                                        fromfile=f"live/{name}" if live is not None else "/dev/null",
                                        tofile=f"after/{name}" if new is not None else "/dev/null"))


class Differ:
    def __init__(self, *, session: Session, renderer: Renderer, stageset: StageSet):
        self._session = session
        self._renderer = renderer
        self._stageset = stageset
        self._namespace = str(stageset.metadata["namespace"])

    def target(self) -> Target:
        """This cluster (discovery as the user), or the StageSet's ``spec.kubeConfig`` cluster."""
        local = StageApplier(mapper=RestMapper(self._session.client()), settings=ApplySettings())
        if self._stageset.spec.kube_config is None:
            return Target(LOCAL, local)
        # A workload-identity cluster is reached by the controller's tokens only: refused here by name.
        sources = KubeConfigSources(secrets=KubeconfigSecret(), config_maps=Unavailable(
            "spec.kubeConfig.configMapRef: this command does not reach a workload-identity cluster (the "
            "controller requests its tokens); compare on the remote cluster with --kubeconfig instead"))
        targets = Targets(clients=self._session.pool, settings=ApplySettings(), local=local,
                          credentials=sources)
        identity = POLICY.for_stageset(self._stageset, what="reading spec.kubeConfig")
        return targets.resolve(self._renderer.client(identity), self._stageset)

    def _client(self, target: Target, identity: Identity) -> KubeClient:
        if not target.remote:
            return self._renderer.client(identity)  # checks the user may impersonate it
        return self._session.pool.client(identity, target.cluster)

    def stage(self, rendered: RenderedStage, target: Target) -> tuple[StageDiff, StageInventory | None]:
        stage = rendered.stage
        result = StageDiff(name=stage.name, identity=rendered.identity.user, revision=rendered.revision)
        if rendered.error is not None:
            result.error = str(rendered.error)
            return result, None
        owner = StageOwner(self._namespace, str(self._stageset.metadata["name"]), stage.name)
        try:
            client = self._client(target, rendered.identity)
            preview = target.applier.preview(client=client, owner=owner, objects=rendered.objects,
                                             default_namespace=self._namespace,
                                             conflicts=ConflictResolver.of(stage))
        except (StageError, CliError) as error:
            result.error = f"{error.reason.value}: {error.message}" if isinstance(error, StageError) \
                else str(error)
            return result, None
        redact = self._renderer.redactor
        for item in preview.objects:
            name = describe(item.manifest).replace(" ", "/")
            after = item.dry_run if item.dry_run is not None else item.manifest
            text = "" if item.action is Action.UNCHANGED else unified(name, item.live, after, redact=redact)
            note = ""
            if item.action is Action.CONFIGURED and not text:
                note = "field ownership only (the values are already as wanted)"
            if item.action is Action.RECREATED:
                note = "an immutable field changed: deleted and created again (force: true)"
            result.objects.append(ObjectDiff(object=name, action=item.action.value, diff=text, note=note))
        for manifest in preview.pending:
            name = describe(manifest).replace(" ", "/")
            result.objects.append(ObjectDiff(
                object=name, action=Action.CREATED.value, diff=unified(name, None, manifest, redact=redact),
                note="its CRD or Namespace is created by this stage first: not dry-run"))
        account = POLICY.stage_account(self._stageset, stage)
        entries = [o.entry() for o in preview.objects] + [
            entry(identify(m, self._namespace, target), version=str(m.get("apiVersion")),
                  digest=manifest_hash(m)) for m in preview.pending]
        return result, stage_inventory(stage.name, account, entries)

    def prune(self, target: Target, live: KubeObject | None, fresh: dict[str, StageInventory]
              ) -> list[ObjectDiff]:
        """What the prune after this pass would delete: in the inventory, rendered by no stage,
        still carrying this StageSet's labels and not opted out."""
        if live is None:
            return []
        here, _ = _split(live, target)
        owner = Owner(self._namespace, str(self._stageset.metadata["name"]))
        found: list[ObjectDiff] = []
        for candidate in candidates(old=here, new=fresh, stageset=self._stageset):
            oid = candidate.id
            path = entry_path(target.applier, candidate.entry, self._namespace)
            if path is None:
                continue
            identity = POLICY.for_inventory(candidate.service_account, self._namespace)
            assert identity is not None  # the CLI's policy always has one (the user's own)
            client = self._client(target, identity)
            try:
                obj = client.get(path)
            except ApiError as error:
                if error.not_found:
                    continue
                raise
            if not deletable(obj, owner):
                continue
            name = oid.describe().replace(" ", "/")
            found.append(ObjectDiff(object=name, action=Action.DELETED.value,
                                    diff=unified(name, obj, None, redact=self._renderer.redactor),
                                    note=f"pruned: stage {candidate.stage} no longer renders it"))
        return found


def _split(live: KubeObject, target: Target) -> tuple[dict[str, StageInventory], list[StageInventory]]:
    """The live inventories on ``target``, and what a move (pending, or this diff's) leaves on
    other clusters — as the controller splits them before a pass."""
    status = StageSetStatus.model_validate(live.get("status") or {})
    inventories = by_stage(status.inventory)
    if parse_record(live).targetless and status.previous_targets is None:
        return inventories, []  # written before targets were recorded: taken to be where it points
    here, left = split_by_target(inventories, status.previous_targets, target=target.id, now="")
    return here, list(left.inventory) if left is not None else []


def moving(stageset: StageSet, target: Target, live: KubeObject | None) -> list[ObjectDiff]:
    """What a move leaves on the clusters the stages were applied on before: deleted there (a
    ``prune: false`` stage's objects released, every stage's under ``deletionPolicy: Orphan``: the
    controller's own rule, :func:`~stageset.controller.stageset.pruning.released_stages`) once every
    stage is Ready on ``target``.  Not read there: the controller reaches the previous cluster only
    to clean it up."""
    if live is None:
        return []
    left = _split(live, target)[1]
    releasing = released_stages([inv.name for inv in left], unpruned=unpruned_stages(stageset),
                                policy=stageset.spec.deletion_policy)
    found: list[ObjectDiff] = []
    for inv in left:
        released = inv.name in releasing
        for item in inv.entries:
            found.append(ObjectDiff(
                object=entry_id(item).describe().replace(" ", "/"),
                action="Released" if released else Action.DELETED.value, diff="",
                note=f"moved: {'released' if released else 'deleted'} on {named(inv.target)} "
                     f"(stage {inv.name}) once every stage is Ready on {target.named}"))
    return found


def planned_actions(stages: list[StageDiff], rendered: list[RenderedStage], live: KubeObject | None, *,
                    target: str) -> None:
    """Fill in what each stage's actions would do, against the ledger in the live StageSet's status."""
    ledgers = {s.name: s.actions for s in StageSetStatus.model_validate(
        (live or {}).get("status") or {}).stages if s.actions is not None}
    for diffed, item in zip(stages, rendered, strict=True):
        if item.error is not None or not item.stage.actions:
            continue
        diffed.actions = [
            {"hook": p.hook.value, "name": p.name, "verb": p.verb, "runs": p.runs, "why": p.why}
            for p in actionplan.preview(item.stage.actions, ledgers.get(item.stage.name),
                                        revision=item.revision, inputs=item.inputs, target=target)]


def _summarize(stages: list[StageDiff], *, pruned: list[ObjectDiff], left: list[ObjectDiff], complete: bool
               ) -> None:
    """Per stage, what applying it would do, then prune and a pending move (on stderr)."""
    for s in stages:
        if s.error is not None:
            click.echo(f"stage {s.name}: error: {s.error}", err=True)
            continue
        counts: dict[str, int] = {}
        for o in s.objects:
            counts[o.action.lower()] = counts.get(o.action.lower(), 0) + 1
        summary = ", ".join(f"{n} {a}" for a, n in sorted(counts.items())) or "no objects"
        click.echo(f"stage {s.name} (as {s.identity or 'you'}) at {s.revision}: {summary}", err=True)
        for planned in s.actions:
            what = "would run" if planned["runs"] else "skipped"
            click.echo(f"  {planned['hook']} action {planned['name']} ({planned['verb']}): {what}, "
                       f"{planned['why']}", err=True)
    if not complete:
        click.echo("prune: not previewed (a stage failed; the controller prunes only after every stage "
                   "succeeded)", err=True)
    else:
        click.echo(f"prune: {len(pruned)} object(s) would be deleted", err=True)
    if left:
        click.echo(f"move: {len(left)} object(s) on the previous cluster would be deleted or released "
                   "once every stage is Ready", err=True)


@click.command("diff")
@click.argument("name", required=False)
@_source_options
@cluster_options(outputs=("diff", "yaml", "json"))
def diff(session: Session, name: str | None, file: str | None, source_dirs: tuple[str, ...],
         default_source_kind: str, age_key_file: Path | None) -> None:
    """Show what applying a StageSet would change: a server-side dry-run as its ServiceAccount,
    what prune would delete, as a unified diff (Secret values masked), and which of its stages'
    pre and post actions would run (or be skipped: they ran for this revision).

    Exit code 1 when there are differences (or actions that would run), 0 when there are none, 3 on
    errors.

    \b
    stageset diff shop -n shop                       # the cluster's StageSet and sources
    stageset diff shop -n shop --source-dir .        # your checkout, before you push it
    stageset diff -f stageset.yaml -n shop           # a changed StageSet, before you apply it
    """
    sources = SourceDirs.parse(source_dirs)
    stageset, live = _load(session, name, file)
    if file is not None and live is None:
        # The live StageSet of the file's namespace (its inventory is what prune would act on).
        session.namespace_flag = str(stageset.metadata["namespace"])
        try:
            live = read_stageset(session, str(stageset.metadata["name"]))
        except CliError:
            live = None  # a new StageSet: nothing to prune
    renderer = Renderer(clients=SessionClients(session), sources=sources, cache_dir=cli_cache_dir(),
                        warn=_warn, default_source_kind=DefaultSourceKind(default_source_kind),
                        age_key_file=age_key_file)
    differ = Differ(session=session, renderer=renderer, stageset=stageset)
    rendered = renderer.render(stageset)
    target = differ.target()
    stages: list[StageDiff] = []
    fresh: dict[str, StageInventory] = {}
    for item in rendered:
        stage_diff, inventory = differ.stage(item, target)
        stages.append(stage_diff)
        if inventory is not None:
            fresh[item.stage.name] = inventory
    planned_actions(stages, rendered, live, target=target.id)
    complete = all(s.error is None for s in stages)
    pruned = differ.prune(target, live, fresh) if complete else []
    left = moving(stageset, target, live)
    changed = [o for s in stages for o in s.changed] + pruned + left
    if session.output != "diff":
        echo(dump({"stages": [{"name": s.name, "identity": s.identity, "revision": s.revision,
                               "error": s.error, "objects": [o.__dict__ for o in s.objects],
                               "actions": s.actions} for s in stages],
                   "prune": [o.__dict__ for o in pruned], "move": [o.__dict__ for o in left],
                   "complete": complete}, session.output))
    else:
        for change in changed:
            if change.note:
                echo(f"# {change.object}: {change.action.lower()}, {change.note}\n")
            if change.diff:
                echo(change.diff)
    _summarize(stages, pruned=pruned, left=left, complete=complete)
    if not complete:
        raise click.exceptions.Exit(ExitCode.ERROR)
    if left or any(o.action in {a.value for a in WRITES} for o in changed) or any(
            planned["runs"] for s in stages for planned in s.actions):
        raise click.exceptions.Exit(ExitCode.DIFFERENCES)
