"""The StageSet reconciler: render every stage, apply them in dependency order as the tenant, prune.

Identity, per request:
- reading the GitRepository a stage names, and its objects' dry-run, apply,
  readiness reads, prune and teardown: the stage's identity (tenant);
- reading the StageSets named in ``spec.dependsOn``: the StageSet's identity;
- discovery, status, finalizers and events: the controller's own identity.
The stage's identity is ``stage.serviceAccountName``, else ``spec.serviceAccountName``,
else — only in single-tenant (cluster-admin) mode — the controller itself.  In
multi-tenant mode a StageSet with no ServiceAccount fails closed with RBACDenied.

One pass: (1) render every stage; two stages rendering one object stops here;
(2) apply stages as the graph allows, recording old+new inventory after each;
(3) only when every stage is Ready, prune what no stage renders any more.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from pydantic import ValidationError

from sources import MirrorStore, RefNotFoundError, SourceError, parse_revision
from stageset.api import API_VERSION, Stage, StageSet, parse_duration
from stageset.apply import inventory
from stageset.apply.engine import AppliedObject, StageApplier, StageError, StageResult
from stageset.apply.inventory import ObjectId, StageInventory, object_id
from stageset.apply.ownership import LABEL_NAME, LABEL_NAMESPACE, StageOwner
from stageset.apply.readiness import Status
from stageset.build import (
    BuildError,
    KustomizeNotFoundError,
    VariableSource,
    build_stage,
    merge_variables,
)
from stageset.controller.conditions import READY as READY_CONDITION
from stageset.controller.conditions import now, ready_at_generation
from stageset.controller.dependencies import DependencyIndex, describe
from stageset.controller.events import WARNING, EventRecorder
from stageset.controller.gitrepository import artifact_consumer
from stageset.controller.ordering import OrderingError, StageNode, ready_to_start, stage_graph
from stageset.controller.rendercache import RenderCache, render_key
from stageset.controller.settings import ControllerSettings
from stageset.controller.status import StatusReport, validation_message, write_status
from stageset.kube.client import LOCAL, ApiError, ClientPool, ClusterKey, Identity, KubeClient
from stageset.kube.mapping import Resource, RestMapper
from stageset.kube.remote import KubeconfigError, parse_remote_kubeconfig
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

FINALIZER = "stages.metio.wtf/teardown"
PRUNE_OPT_OUT = "stages.metio.wtf/prune"
READY, FAILED, PROGRESSING, PENDING, APPLYING, WAITING = (
    "Ready", "Failed", "Progressing", "Pending", "Applying", "Waiting")
GONE, DELETING = "Gone", "Deleting"  # outcomes of deleting one object (with FAILED)
# Which failure wins the StageSet's Ready reason when several stages fail.
_REASON_PRIORITY = ["RBACDenied", "InvalidSpec", "StageFailed", "DependencyNotReady", "SourceNotReady",
                    "ArtifactNotFound", "StageProgressing"]


@dataclass
class StageOutcome:
    name: str
    phase: str
    reason: str = ""
    message: str = ""
    revision: str | None = None
    objects: int | None = None
    applied_at: str | None = None
    waiting_since: str | None = None

    def as_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"name": self.name, "phase": self.phase}
        for key, value in (("revision", self.revision), ("message", self.message or None),
                           ("objects", self.objects), ("lastAppliedTime", self.applied_at),
                           ("waitingSince", self.waiting_since)):
            if value is not None:
                status[key] = value
        return status


@dataclass(frozen=True)
class Target:
    """The cluster a StageSet applies to, and the apply engine bound to its discovery."""

    cluster: ClusterKey
    applier: StageApplier


@dataclass
class Rendered:
    """One stage, rendered and ready to apply."""

    stage: Stage
    identity: Identity
    revision: str
    objects: list[KubeObject]
    target: Target
    ids: set[ObjectId] = field(default_factory=set)


def read_optional(client: KubeClient, path: str, *, what: str) -> KubeObject | None:
    """Read an object a StageSet names, with ``client``'s (the tenant's) identity; ``None`` if absent.

    403 is ``RBACDenied`` naming the identity and ``what`` — only names the user wrote
    appear in messages, never anything read from another namespace.
    """
    try:
        return client.get(path)
    except ApiError as error:
        if error.forbidden:
            raise StageError("RBACDenied", f"{client.identity.describe()} may not read {what}") from error
        if error.not_found:
            return None
        raise


def read_named(client: KubeClient, path: str, *, what: str, missing_reason: str,
               missing_message: str = "") -> KubeObject:
    """As :func:`read_optional`, but a missing object is a :class:`StageError` with ``missing_reason``."""
    found = read_optional(client, path, what=what)
    if found is None:
        raise StageError(missing_reason, missing_message or f"{what} not found")
    return found


def _parse_time(value: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _format_time(value: datetime.datetime) -> str:
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owned_by(obj: KubeObject, *, namespace: str, name: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return labels.get(LABEL_NAME) == name and labels.get(LABEL_NAMESPACE) == namespace


def _stage_nodes(stageset: StageSet) -> list[StageNode]:
    return [StageNode(s.name, None if s.depends_on is None else tuple(s.depends_on))
            for s in stageset.spec.stages]


def _prune_disabled(obj: KubeObject) -> bool:
    metadata = obj.get("metadata", {})
    return (metadata.get("annotations") or {}).get(PRUNE_OPT_OUT) == "disabled" or \
        (metadata.get("labels") or {}).get(PRUNE_OPT_OUT) == "disabled"


class StageSetReconciler:
    def __init__(self, *, clients: ClientPool, store: MirrorStore, applier: StageApplier,
                 resource: Resource, source_resource: Resource, settings: ControllerSettings,
                 events: EventRecorder, index: DependencyIndex, stop: threading.Event):
        self._clients = clients
        self._store = store
        self._local = Target(LOCAL, applier)
        self._remotes: dict[ClusterKey, Target] = {}
        self._remotes_lock = threading.Lock()
        self._resource = resource
        self._sources = source_resource
        self._settings = settings
        self._events = events
        self._index = index
        self._stop = stop
        self._renders = RenderCache()

    # -- identity -------------------------------------------------------------

    def _account_identity(self, account: str | None, namespace: str, *, what: str) -> Identity:
        if account:
            return Identity.service_account(namespace=namespace, name=account)
        if self._settings.cluster_admin:
            return Identity()
        raise StageError("RBACDenied", f"{what}: spec.serviceAccountName is required: the controller "
                         "runs in multi-tenant mode and never acts as itself for a tenant")

    def _stage_identity(self, stageset: StageSet, stage: Stage, namespace: str) -> Identity:
        return self._account_identity(stage.service_account_name or stageset.spec.service_account_name,
                                      namespace, what=f"stage {stage.name!r}")

    # -- rendering --------------------------------------------------------------

    def _source(self, client: KubeClient, stage: Stage, namespace: str
                ) -> tuple[str, str, str, str | None]:
        """The source's URL, revision, commit and ignore patterns, read as the stage's identity."""
        ref = stage.source_ref
        source_ns = ref.namespace or namespace
        if source_ns != namespace and self._settings.no_cross_namespace_refs:
            raise StageError("InvalidSpec", f"stage {stage.name!r}: sourceRef into another namespace "
                             "is not allowed on this controller (--no-cross-namespace-refs)")
        if ref.kind != "GitRepository" or (ref.api_version or API_VERSION) != API_VERSION:
            raise StageError("InvalidSpec", f"stage {stage.name!r}: unsupported source kind {ref.kind}")
        source = read_named(client, self._sources.object_path(name=ref.name, namespace=source_ns),
                            what=f"GitRepository {source_ns}/{ref.name} (stage {stage.name!r})",
                            missing_reason="SourceNotReady",
                            missing_message=f"stage {stage.name!r}: GitRepository {source_ns}/{ref.name} "
                            "not found")
        artifact = (source.get("status") or {}).get("artifact") or {}
        revision = artifact.get("revision")
        if not revision:
            raise StageError("SourceNotReady", f"stage {stage.name!r}: GitRepository "
                             f"{source_ns}/{ref.name} has no artifact yet")
        _, commit = parse_revision(revision)
        url = str(source["spec"]["url"])
        if not self._store.is_served(url, commit=commit, consumer=artifact_consumer(source["metadata"])):
            # Only what this GitRepository was served, never another commit of a shared mirror.
            raise StageError("ArtifactNotFound", f"stage {stage.name!r}: GitRepository "
                             f"{source_ns}/{ref.name}: revision {revision} has not been fetched for it (yet)")
        return url, revision, commit, source["spec"].get("ignore")

    def _render(self, stageset: StageSet, stage: Stage, namespace: str, target: Target) -> Rendered:
        identity = self._stage_identity(stageset, stage, namespace)
        client = self._clients.client(identity)
        url, revision, commit, ignore = self._source(client, stage, namespace)
        variables = self._variables(client, stage, namespace)
        try:
            key = render_key(url=url, tree=self._store.tree_hash(url, commit=commit, path=stage.path),
                             ignore=ignore, variables=variables)
            cached = self._renders.get(key)
            if cached is not None:
                return Rendered(stage=stage, identity=identity, revision=revision, objects=cached,
                                target=target, ids={self._identify(obj, namespace, target) for obj in cached})
            files = self._store.read_tree(url, commit=commit, path=stage.path, ignore=ignore)
        except RefNotFoundError as error:
            # Not in this controller's mirror (yet): the GitRepository will fetch it.
            raise StageError("ArtifactNotFound", f"stage {stage.name!r}: {error}") from error
        except SourceError as error:
            raise StageError("StageFailed", f"stage {stage.name!r}: {error}") from error
        try:
            objects = build_stage(files, path=stage.path, variables=variables)
        except KustomizeNotFoundError as error:
            raise StageError("StageFailed", f"stage {stage.name!r}: this controller cannot build "
                             f"kustomizations: {error}") from error
        except BuildError as error:
            raise StageError("StageFailed", f"stage {stage.name!r}: {error}") from error
        self._renders.put(key, objects)
        ids = {self._identify(obj, namespace, target) for obj in objects}
        return Rendered(stage=stage, identity=identity, revision=revision, objects=objects, target=target,
                        ids=ids)

    def _variables(self, client: KubeClient, stage: Stage, namespace: str) -> dict[str, str] | None:
        """``postBuild`` variables; ``substituteFrom`` ConfigMaps/Secrets are read as the stage's identity."""
        if stage.post_build is None:
            return None
        sources: list[VariableSource] = []
        for ref in stage.post_build.substitute_from:
            plural = "configmaps" if ref.kind == "ConfigMap" else "secrets"
            # Only "not found" is tolerated (and only when optional): a denied read fails the stage.
            obj = read_optional(client, f"/api/v1/namespaces/{namespace}/{plural}/{ref.name}",
                                what=f"{ref.kind} {namespace}/{ref.name} (stage {stage.name!r})")
            data: dict[str, str] | None = None if obj is None else (obj.get("data") or {})
            sources.append(VariableSource(ref.kind, ref.name, data, ref.optional))
        try:
            return merge_variables(stage.post_build.substitute, sources)
        except BuildError as error:
            raise StageError("StageFailed", f"stage {stage.name!r}: {error}") from error

    def _identify(self, obj: KubeObject, namespace: str, target: Target) -> ObjectId:
        """The object's identity after namespace defaulting (a kind not served yet — its CRD is
        in the same stage — is taken as namespaced, the common case for custom resources)."""
        manifest, resource = target.applier.resolve(obj, namespace)
        if resource is None and not manifest["metadata"].get("namespace"):
            manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
        return object_id(manifest)

    # -- applying one stage -------------------------------------------------------

    def _apply_stage(self, *, stageset: StageSet, rendered: Rendered, namespace: str,
                     previous: StageInventory | None, last_applied: str | None,
                     waiting_since: str | None, recheck_only: bool = False
                     ) -> tuple[StageOutcome, StageResult | None]:
        stage = rendered.stage
        client = self._clients.client(rendered.identity, rendered.target.cluster)
        applier = rendered.target.applier
        owner = StageOwner(namespace, stageset.metadata["name"], stage.name)
        try:
            # A stage already applied at this revision and waiting for readiness is only
            # re-checked: no dry-runs, no writes, one read per object.
            result = applier.bind(owner=owner, objects=rendered.objects,
                                  default_namespace=namespace) if recheck_only else None
            if result is None:
                result = applier.apply(
                    client=client, owner=owner, objects=rendered.objects, default_namespace=namespace,
                    force=stage.force, previous=previous.entries if previous else None)
        except StageError as error:
            return StageOutcome(stage.name, FAILED, error.reason, error.message), None
        except ApiError as error:
            message = f"stage {stage.name!r}: apiserver error {error.status}: {error.message}"
            return StageOutcome(stage.name, FAILED, "StageFailed", message), None
        # The time the stage last changed the cluster: a pass that wrote nothing keeps it.
        applied_at = now() if result.writes or last_applied is None else last_applied
        wants_wait = stage.ready_checks is None or stage.ready_checks.wait
        timeout = parse_duration(stage.timeout or stageset.spec.timeout).total_seconds()
        try:
            extra = self._extra_checks(stage, namespace, applier)
        except StageError as error:
            return StageOutcome(stage.name, FAILED, error.reason, error.message), result
        # Wait a short slice, then give the worker back and come again: the stage's timeout
        # counts from ``waitingSince`` across reconciles, so no worker blocks for minutes.
        started = _parse_time(waiting_since) if waiting_since and not result.writes else None
        started = started or datetime.datetime.now(datetime.UTC)
        waited = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
        slice_ = max(0.0, min(timeout - waited, self._settings.readiness_slice))
        verdict = applier.wait_ready(client=client, applied=[*result.objects, *extra],
                                     timeout=slice_, stop=self._stop) if wants_wait else None
        outcome = StageOutcome(stage.name, READY, "Succeeded", "", rendered.revision, len(result.objects),
                               applied_at)
        if verdict is not None and verdict.status is Status.FAILED:
            outcome.phase, outcome.reason, outcome.message = FAILED, "StageFailed", verdict.message
        elif verdict is not None and verdict.status is Status.IN_PROGRESS:
            outcome.waiting_since = _format_time(started)
            waited = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
            if waited < timeout:
                outcome.phase, outcome.reason, outcome.message = WAITING, "Progressing", verdict.message
            else:
                outcome.phase, outcome.reason = PROGRESSING, "StageProgressing"
                outcome.message = f"not ready after {timeout:.0f}s: {verdict.message}"
        return outcome, result

    def _extra_checks(self, stage: Stage, namespace: str, applier: StageApplier) -> list[AppliedObject]:
        """``readyChecks.objects``: more objects (not applied by the stage) to wait for."""
        if stage.ready_checks is None:
            return []
        extra: list[AppliedObject] = []
        for ref in stage.ready_checks.objects:
            stub = {"apiVersion": ref.api_version, "kind": ref.kind,
                    "metadata": {"name": ref.name, "namespace": ref.namespace or namespace}}
            manifest, resource = applier.resolve(stub, namespace)
            if resource is None:
                raise StageError("StageFailed", f"stage {stage.name!r}: readyChecks names {ref.kind} "
                                 f"{ref.name}, a kind the cluster does not serve")
            path = resource.object_path(name=ref.name, namespace=manifest["metadata"].get("namespace")
                                        if resource.namespaced else None)
            extra.append(AppliedObject(resource=resource, path=path, manifest=manifest,
                                       id=object_id(manifest), digest="", wrote=True))
        return extra

    # -- prune and teardown -------------------------------------------------------

    def _delete_owned(self, *, identity: Identity, entry: inventory.Entry, namespace: str, name: str,
                      target: Target) -> str:
        """Delete one inventoried object if it is still ours: GONE (or not ours), DELETING, FAILED."""
        client = self._clients.client(identity, target.cluster)
        oid = entry.id
        try:
            resource = target.applier.resolve({"apiVersion": entry.version, "kind": oid.kind,
                                              "metadata": {"name": oid.name, "namespace": oid.namespace}},
                                             namespace)[1]
        except ApiError:
            return FAILED
        if resource is None:
            return GONE  # the kind itself is gone, and with it the object
        path = resource.object_path(name=oid.name, namespace=oid.namespace or None)
        try:
            live = client.get(path)
        except ApiError as error:
            if error.not_found:
                return GONE
            log.warning("cannot read %s for deletion as %s: %s", oid.describe(), identity.describe(), error)
            return FAILED
        if not _owned_by(live, namespace=namespace, name=name) or _prune_disabled(live):
            return GONE  # adopted by someone else, or opted out: never delete, stop tracking
        if live["metadata"].get("deletionTimestamp"):
            return DELETING
        try:
            client.delete(path)
        except ApiError as error:
            if error.not_found:
                return GONE
            log.warning("cannot delete %s as %s: %s", oid.describe(), identity.describe(), error)
            return FAILED
        return DELETING

    def _identity_for_inventory(self, inv: StageInventory, namespace: str) -> Identity | None:
        if inv.service_account:
            return Identity.service_account(namespace=namespace, name=inv.service_account)
        return Identity() if self._settings.cluster_admin else None

    def _prune(self, *, old: dict[str, StageInventory], new: dict[str, StageInventory],
               disabled: list[str], namespace: str, name: str, target: Target) -> list[inventory.Stale]:
        """Delete what no stage renders any more; returns what could not be deleted (kept tracked)."""
        kept: list[inventory.Stale] = []
        for item in inventory.stale(old=old, new=new, prune_disabled=disabled):
            identity = self._identity_for_inventory(old[item.stage], namespace)
            if identity is None:
                log.warning("not pruning %s: it was applied as the controller, which is no longer allowed",
                            item.entry.id.describe())
                kept.append(item)
                continue
            if self._delete_owned(identity=identity, entry=item.entry, namespace=namespace,
                                  name=name, target=target) == FAILED:
                kept.append(item)
        return kept

    def _teardown(self, raw: dict[str, Any], stageset: StageSet | None, status: dict[str, Any]
                  ) -> float | None:
        """Delete every stage's objects, dependents first, each as its identity; then let go."""
        metadata = raw["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        admin = self._clients.client()
        inventories = inventory.load(status)
        order = self._teardown_order(stageset, inventories)
        try:
            target: Target | None = self._target(stageset, namespace) if stageset else self._local
        except StageError as error:
            log.warning("cannot reach the cluster of StageSet %s/%s for teardown: %s", namespace, name,
                        error.message)
            target = None
        deleted_at = datetime.datetime.fromisoformat(metadata["deletionTimestamp"].replace("Z", "+00:00"))
        waited = (datetime.datetime.now(datetime.UTC) - deleted_at).total_seconds()
        for stage_name in order:
            inv = inventories[stage_name]
            identity = self._identity_for_inventory(inv, namespace)
            remaining = {oid: entry for oid, entry in inv.entries.items()
                         if identity is None or target is None or self._delete_owned(
                             identity=identity, entry=entry, namespace=namespace, name=name,
                             target=target) != GONE}
            if remaining:
                inv.entries = remaining
                status["inventory"] = inventory.dump(inventories)
                write_status(admin, resource=self._resource, obj=raw, status=status)
                if waited < self._settings.max_teardown_wait:
                    return 1.0
                self._events.emit(raw, type_=WARNING, reason="TeardownForced",
                                  message=f"stage {stage_name!r} still has {len(remaining)} object(s) after "
                                  f"{self._settings.max_teardown_wait:.0f}s; releasing the StageSet anyway")
                break
            del inventories[stage_name]
            status["inventory"] = inventory.dump(inventories)
            write_status(admin, resource=self._resource, obj=raw, status=status)
        try:
            self._set_finalizer(raw, present=False)
        except StageError:
            return 1.0  # changed under us: read it again and retry
        return None

    def _target(self, stageset: StageSet, namespace: str) -> Target:
        """Where the StageSet's stages apply: this cluster, or the one its kubeConfig names.

        The kubeConfig Secret is read from this cluster as the StageSet's identity; requests to
        the remote cluster use the kubeconfig's credentials, impersonating the stage's
        ServiceAccount there exactly as here.
        """
        ref = stageset.spec.kube_config
        if ref is None:
            return self._local
        secret_name, key = ref.secret_ref.name, ref.secret_ref.key
        identity = self._account_identity(stageset.spec.service_account_name, namespace,
                                          what="reading spec.kubeConfig")
        secret = read_named(self._clients.client(identity),
                            f"/api/v1/namespaces/{namespace}/secrets/{secret_name}",
                            what=f"Secret {namespace}/{secret_name} (spec.kubeConfig)",
                            missing_reason="StageFailed",
                            missing_message=f"spec.kubeConfig: Secret {namespace}/{secret_name} not found")
        encoded = (secret.get("data") or {}).get(key)
        if not encoded:
            raise StageError("InvalidSpec", f"spec.kubeConfig: Secret {namespace}/{secret_name} has no "
                             f"key {key!r}")
        raw = base64.b64decode(encoded)
        cluster = ClusterKey(f"{namespace}/{secret_name}#{hashlib.sha256(raw).hexdigest()[:16]}")
        with self._remotes_lock:
            found = self._remotes.get(cluster)
            if found is not None:
                return found
            try:
                remote = parse_remote_kubeconfig(raw)
            except KubeconfigError as error:
                raise StageError("InvalidSpec", f"spec.kubeConfig: {error}") from error
            self._clients.register(cluster, remote.configuration)
            # Discovery on the remote cluster with the kubeconfig's own identity.
            discovery = self._clients.client(Identity(), cluster)
            target = Target(cluster, StageApplier(mapper=RestMapper(discovery)))
            self._remotes[cluster] = target
            return target

    def _teardown_order(self, stageset: StageSet | None, inventories: dict[str, StageInventory]
                        ) -> list[str]:
        """Stages with objects, dependents before their dependencies; removed stages first."""
        graph: nx.DiGraph = nx.DiGraph()
        if stageset is not None:
            try:
                graph = stage_graph(_stage_nodes(stageset))
            except OrderingError:
                graph = nx.DiGraph()
        in_spec = [n for n in reversed(list(nx.lexicographical_topological_sort(graph)))
                   if n in inventories]
        removed = sorted(n for n in inventories if n not in in_spec)
        return removed + in_spec

    def _set_finalizer(self, raw: dict[str, Any], *, present: bool) -> None:
        metadata = raw["metadata"]
        finalizers = list(metadata.get("finalizers") or [])
        if (FINALIZER in finalizers) == present:
            return
        finalizers = [*finalizers, FINALIZER] if present else [f for f in finalizers if f != FINALIZER]
        path = self._resource.object_path(name=metadata["name"], namespace=metadata["namespace"])
        try:
            written = self._clients.client().request(
                "PATCH", path, content_type="application/json-patch+json",
                body=[{"op": "test", "path": "/metadata/resourceVersion",
                       "value": metadata["resourceVersion"]},
                      {"op": "add" if "finalizers" not in metadata else "replace",
                       "path": "/metadata/finalizers", "value": finalizers}])
        except ApiError as error:
            if not (error.not_found or error.conflict or error.invalid):
                raise
            raise StageError("Progressing", "object changed while updating finalizers; retrying") from error
        metadata["finalizers"] = finalizers
        metadata["resourceVersion"] = written.get("metadata", {}).get("resourceVersion",
                                                                   metadata["resourceVersion"])

    # -- StageSet dependencies ----------------------------------------------------------

    def _check_dependencies(self, stageset: StageSet, namespace: str) -> None:
        key = (namespace, stageset.metadata["name"])
        refs = [(ref.namespace or namespace, ref.name) for ref in stageset.spec.depends_on]
        # The index is kept by the watch handler, from the same cached object we reconcile.
        cycle = self._index.cycle_through(key)
        if cycle:
            spelled = " -> ".join(describe(k) for k in [*cycle, cycle[0]])
            raise OrderingError(f"StageSets form a cycle: {spelled}", cycle=[describe(k) for k in cycle])
        if not refs:
            return
        identity = self._account_identity(stageset.spec.service_account_name, namespace,
                                          what="reading spec.dependsOn")
        client = self._clients.client(identity)
        for ref_ns, ref_name in refs:
            if ref_ns != namespace and self._settings.no_cross_namespace_refs:
                raise StageError("InvalidSpec", "dependsOn into another namespace is not allowed on this "
                                 "controller (--no-cross-namespace-refs)")
            other = read_named(client, self._resource.object_path(name=ref_name, namespace=ref_ns),
                               what=f"StageSet {ref_ns}/{ref_name}", missing_reason="DependencyNotReady")
            if not ready_at_generation(other):
                raise StageError("DependencyNotReady", f"StageSet {ref_ns}/{ref_name} is not Ready")

    # -- the whole StageSet ---------------------------------------------------------

    def reconcile(self, raw: dict[str, Any]) -> float | None:
        """Reconcile one StageSet; returns seconds until it should run again."""
        metadata = raw["metadata"]
        namespace = metadata["namespace"]
        report = StatusReport(client=self._clients.client(), resource=self._resource, obj=raw)

        def finish(*, ready: bool | None, reason: str, message: str, stalled: bool = False,
                   again: float | None = None) -> float | None:
            report.conclude(ready=ready, reason=reason, message=message, stalled=stalled)
            return again

        try:
            stageset = StageSet.model_validate(raw)
        except ValidationError as error:
            if metadata.get("deletionTimestamp"):
                return self._teardown(raw, None, report.status)
            return finish(ready=False, reason="InvalidSpec", message=validation_message(error), stalled=True)
        if metadata.get("deletionTimestamp"):
            return self._teardown(raw, stageset, report.status)
        spec = stageset.spec
        interval = parse_duration(spec.interval).total_seconds()
        retry = parse_duration(spec.retry_interval or spec.interval).total_seconds()
        if spec.suspend:
            return finish(ready=False, reason="Suspended", message="reconciliation is suspended")
        try:
            self._set_finalizer(raw, present=True)
            graph = stage_graph(_stage_nodes(stageset))
            self._check_dependencies(stageset, namespace)
            target = self._target(stageset, namespace)
        except OrderingError as error:
            return finish(ready=False, reason="InvalidSpec" if error.cycle is None else "Stalled",
                          message=str(error), stalled=True)
        except StageError as error:
            stalled = error.reason == "InvalidSpec"
            again = None if stalled else (1.0 if error.reason == "Progressing" else retry)
            return finish(ready=False, reason=error.reason, message=error.message, stalled=stalled,
                          again=again)
        return self._pass(raw, stageset, graph, target, report=report, finish=finish, interval=interval,
                          retry=retry)

    def _pass(self, raw: dict[str, Any], stageset: StageSet, graph: nx.DiGraph, target: Target, *,
              report: StatusReport, finish: Callable[..., float | None], interval: float, retry: float
              ) -> float | None:
        metadata = raw["metadata"]
        status = report.status
        namespace, name = metadata["namespace"], metadata["name"]
        spec = stageset.spec
        by_name = {s.name: s for s in spec.stages}
        old = inventory.load(status)
        current = {k: StageInventory(v.name, v.service_account, dict(v.entries)) for k, v in old.items()}
        outcomes: dict[str, StageOutcome] = {s.name: StageOutcome(s.name, PENDING) for s in spec.stages}
        previous = {s.get("name"): s for s in status.get("stages") or []}
        for stage_name, outcome in outcomes.items():
            before = previous.get(stage_name) or {}
            outcome.revision, outcome.applied_at = before.get("revision"), before.get("lastAppliedTime")
            outcome.objects = before.get("objects")
            outcome.waiting_since = before.get("waitingSince")

        ready_before = report.condition(READY_CONDITION)
        was_ready = ready_before.get("status") == "True" and \
            ready_before.get("observedGeneration") == metadata.get("generation")
        quiet = False

        def publish(reason: str, message: str) -> None:
            # A routine pass over a Ready StageSet at the same revisions shows no progress: Ready
            # must not flap to Unknown every interval (kubectl wait, dependents), and an unchanged
            # StageSet must cost no status writes.
            if quiet:
                return
            status["stages"] = [outcomes[s.name].as_status() for s in spec.stages]
            status["inventory"] = inventory.dump(current)
            finish(ready=None, reason=reason, message=message)

        # (1) render every stage
        rendered: dict[str, Rendered] = {}
        for stage in spec.stages:
            try:
                rendered[stage.name] = self._render(stageset, stage, namespace, target)
            except StageError as error:
                phase = PENDING if error.reason in ("SourceNotReady", "ArtifactNotFound") else FAILED
                outcomes[stage.name] = StageOutcome(stage.name, phase, error.reason, error.message,
                                                    outcomes[stage.name].revision)
        clashes = inventory.duplicates({n: r.ids for n, r in rendered.items()})
        if clashes:
            oid, stages = sorted(clashes.items())[0]
            message = (f"{oid.describe()} is rendered by more than one stage ({', '.join(stages)}); "
                       "each object must belong to exactly one stage")
            status["stages"] = [outcomes[s.name].as_status() for s in spec.stages]
            return finish(ready=False, reason="InvalidSpec", message=message, stalled=True)

        rechecks = {n: (previous.get(n) or {}).get("phase") == WAITING
                    and (previous.get(n) or {}).get("revision") == r.revision
                    and status.get("observedGeneration") == metadata.get("generation")
                    for n, r in rendered.items()}

        # (2) apply as the graph allows
        quiet = was_ready and len(rendered) == len(spec.stages) and all(
            r.revision == (previous.get(n) or {}).get("revision") for n, r in rendered.items())
        # Status writes are the costliest requests a pass makes: announce the pass only when
        # it is not visibly in progress already (a re-check of a waiting stage says nothing new).
        in_progress = ready_before.get("status") == "Unknown" and \
            ready_before.get("observedGeneration") == metadata.get("generation")
        if not in_progress:
            publish("Progressing", "applying stages")
        done: set[str] = set()
        blocked = {n for n in outcomes if n not in rendered}
        started: set[str] = set(blocked)
        fresh: dict[str, StageInventory] = {}  # what each stage applied in this pass
        futures: dict[Future[tuple[StageOutcome, StageResult | None]], str] = {}
        with ThreadPoolExecutor(max_workers=self._settings.stage_parallelism,
                                thread_name_prefix=f"stages-{name}") as pool:
            while True:
                for stage_name in ready_to_start(graph, done=done, started=started):
                    started.add(stage_name)
                    outcomes[stage_name].phase = APPLYING
                    futures[pool.submit(self._apply_stage, stageset=stageset, rendered=rendered[stage_name],
                                        namespace=namespace, previous=old.get(stage_name),
                                        last_applied=outcomes[stage_name].applied_at,
                                        waiting_since=outcomes[stage_name].waiting_since,
                                        recheck_only=rechecks.get(stage_name, False))] = stage_name
                if not futures:
                    break
                finished, _ = wait(list(futures), return_when=FIRST_COMPLETED)
                for future in finished:
                    stage_name = futures.pop(future)
                    outcome, result = future.result()
                    outcomes[stage_name] = outcome
                    if result is not None:
                        fresh[stage_name] = StageInventory(
                            stage_name, by_name[stage_name].service_account_name or spec.service_account_name,
                            {o.id: o.entry() for o in result.objects})
                        current[stage_name] = inventory.merged(old.get(stage_name), fresh[stage_name])
                        self._report_drift(raw, stage_name, result)
                    if outcome.phase == READY:
                        done.add(stage_name)
                if futures or ready_to_start(graph, done=done, started=started):
                    # More to do: show progress (and record the merged inventory) between stages.
                    publish("Progressing", f"stages ready: {len(done)}/{len(outcomes)}")

        status["stages"] = [outcomes[s.name].as_status() for s in spec.stages]
        if len(done) == len(outcomes):
            # (3) every stage is Ready: prune, then keep only the new inventory.
            kept = self._prune(old=old, new=fresh, disabled=[s.name for s in spec.stages if not s.prune],
                               namespace=namespace, name=name, target=target)
            current.clear()
            current.update(fresh)
            for item in kept:
                # Still tracked, so a later pass tries again; never silently orphaned.
                holder = current.setdefault(item.stage, StageInventory(item.stage, item.service_account))
                holder.entries[item.entry.id] = item.entry
            if kept:
                names = ", ".join(sorted(i.entry.id.describe() for i in kept)[:10])
                self._events.emit(raw, type_=WARNING, reason="PruneFailed",
                                  message=f"could not delete {len(kept)} object(s) no longer in Git: {names}")
            status["inventory"] = inventory.dump(current)
            revisions = sorted({o.revision for o in outcomes.values() if o.revision})
            status["lastAppliedRevision"] = revisions[0] if len(revisions) == 1 else ", ".join(revisions)
            return finish(ready=True, reason="Succeeded",
                          message=f"applied {len(outcomes)} stage(s) at {status['lastAppliedRevision']}",
                          again=interval)
        status["inventory"] = inventory.dump(current)
        waiting = [o for o in outcomes.values() if o.phase == WAITING]
        failures = [o for o in outcomes.values() if o.reason and o.phase not in (READY, WAITING)]
        if waiting and not failures:
            # Not a failure: stages are within their timeout.  Look again shortly.
            message = "; ".join(f"stage {o.name!r}: {o.message}" for o in waiting)
            return finish(ready=None, reason="Progressing", message=f"waiting for readiness: {message}",
                          again=self._settings.readiness_requeue)
        failures.sort(key=lambda o: _REASON_PRIORITY.index(o.reason)
                      if o.reason in _REASON_PRIORITY else len(_REASON_PRIORITY))
        worst = failures[0] if failures else StageOutcome("", PENDING, "StageFailed", "stages blocked")
        if worst.reason in ("SourceNotReady", "ArtifactNotFound", "StageProgressing"):
            retry = min(retry, 30.0)
        return finish(ready=False, reason=worst.reason, message=worst.message, again=retry)

    def _report_drift(self, raw: dict[str, Any], stage_name: str, result: StageResult) -> None:
        drifted = result.drifted
        if not drifted:
            return
        names = ", ".join(sorted(o.id.describe() for o in drifted)[:10])
        more = f" and {len(drifted) - 10} more" if len(drifted) > 10 else ""
        self._events.emit(raw, type_=WARNING, reason="DriftCorrected",
                          message=f"stage {stage_name!r}: restored {names}{more}")
