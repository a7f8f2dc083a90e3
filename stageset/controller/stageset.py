"""The StageSet reconciler: render each stage from its source and apply it as the tenant, in order.

Identity, per request:
- reading the GitRepository a stage names: the stage's identity (tenant);
- dry-run, apply and readiness reads of the stage's objects: the stage's identity;
- discovery and status writes: the controller's own identity.
The stage's identity is ``stage.serviceAccountName``, else ``spec.serviceAccountName``,
else — only in single-tenant (cluster-admin) mode — the controller itself.  In
multi-tenant mode a StageSet with no ServiceAccount fails closed with RBACDenied.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sources import MirrorStore, RefNotFoundError, SourceError, parse_revision
from stageset.api import API_VERSION, Stage, StageSet, parse_duration
from stageset.apply.engine import StageApplier, StageError
from stageset.apply.ownership import StageOwner
from stageset.apply.readiness import Status
from stageset.build import BuildError, render_manifests
from stageset.controller.conditions import now, summarize
from stageset.controller.ordering import OrderingError, StageNode, ready_to_start, stage_graph
from stageset.controller.settings import ControllerSettings
from stageset.controller.status import write_status
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from stageset.kube.mapping import Resource

log = logging.getLogger(__name__)

READY, FAILED, PROGRESSING, PENDING = "Ready", "Failed", "Progressing", "Pending"
# Which failure wins the StageSet's Ready reason when several stages fail.
_REASON_PRIORITY = ["RBACDenied", "InvalidSpec", "StageFailed", "SourceNotReady", "ArtifactNotFound",
                    "StageProgressing"]


@dataclass
class StageOutcome:
    name: str
    phase: str
    reason: str = ""
    message: str = ""
    revision: str | None = None
    objects: int | None = None
    applied_at: str | None = None

    def as_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"name": self.name, "phase": self.phase}
        for key, value in (("revision", self.revision), ("message", self.message or None),
                           ("objects", self.objects), ("lastAppliedTime", self.applied_at)):
            if value is not None:
                status[key] = value
        return status


class StageSetReconciler:
    def __init__(self, *, clients: ClientPool, store: MirrorStore, applier: StageApplier,
                 resource: Resource, source_resource: Resource, settings: ControllerSettings,
                 stop: threading.Event):
        self._clients = clients
        self._store = store
        self._applier = applier
        self._resource = resource
        self._sources = source_resource
        self._settings = settings
        self._stop = stop

    # -- identity -------------------------------------------------------------

    def _identity(self, stageset: StageSet, stage: Stage, namespace: str) -> Identity:
        account = stage.service_account_name or stageset.spec.service_account_name
        if account:
            return Identity.service_account(namespace=namespace, name=account)
        if self._settings.cluster_admin:
            return Identity()
        raise StageError("RBACDenied", f"stage {stage.name!r}: spec.serviceAccountName is required: "
                         "the controller runs in multi-tenant mode and never applies as itself")

    # -- one stage --------------------------------------------------------------

    def _source(self, client: KubeClient, stage: Stage, namespace: str) -> tuple[str, str, str, str | None]:
        """The source's URL, revision, commit and ignore patterns, read as the stage's identity."""
        ref = stage.source_ref
        source_ns = ref.namespace or namespace
        if source_ns != namespace and self._settings.no_cross_namespace_refs:
            raise StageError("InvalidSpec", f"stage {stage.name!r}: sourceRef into another namespace "
                             "is not allowed on this controller (--no-cross-namespace-refs)")
        if ref.kind != "GitRepository" or (ref.api_version or API_VERSION) != API_VERSION:
            raise StageError("InvalidSpec", f"stage {stage.name!r}: unsupported source kind {ref.kind}")
        try:
            source = client.get(self._sources.object_path(name=ref.name, namespace=source_ns))
        except ApiError as error:
            if error.forbidden:
                raise StageError("RBACDenied", f"stage {stage.name!r}: {client.identity.describe()} "
                                 f"may not read GitRepository {source_ns}/{ref.name}") from error
            if error.not_found:
                raise StageError("SourceNotReady",
                                 f"stage {stage.name!r}: GitRepository {source_ns}/{ref.name} "
                                 "not found") from error
            raise
        artifact = (source.get("status") or {}).get("artifact") or {}
        revision = artifact.get("revision")
        if not revision:
            raise StageError("SourceNotReady", f"stage {stage.name!r}: GitRepository "
                             f"{source_ns}/{ref.name} has no artifact yet")
        _, commit = parse_revision(revision)
        return str(source["spec"]["url"]), revision, commit, source["spec"].get("ignore")

    def _run_stage(self, *, stageset: StageSet, stage: Stage, namespace: str) -> StageOutcome:
        name = stageset.metadata["name"]
        try:
            client = self._clients.client(self._identity(stageset, stage, namespace))
            url, revision, commit, ignore = self._source(client, stage, namespace)
            try:
                files = self._store.read_tree(url, commit=commit, path=stage.path, ignore=ignore)
            except RefNotFoundError as error:
                # Not in this controller's mirror (yet): the GitRepository will fetch it.
                raise StageError("ArtifactNotFound", f"stage {stage.name!r}: {error}") from error
            except SourceError as error:
                raise StageError("StageFailed", f"stage {stage.name!r}: {error}") from error
            substitutions = dict(stage.post_build.substitute) if stage.post_build else None
            objects = render_manifests(files, variables=substitutions, origin=stage.path)
            applied = self._applier.apply(client=client, owner=StageOwner(namespace, name, stage.name),
                                          objects=objects, default_namespace=namespace)
            applied_at = now()
            wants_wait = stage.ready_checks is None or stage.ready_checks.wait
            timeout = parse_duration(stage.timeout or stageset.spec.timeout).total_seconds()
            verdict = self._applier.wait_ready(client=client, applied=applied, timeout=timeout,
                                               stop=self._stop) if wants_wait else None
        except BuildError as error:
            return StageOutcome(stage.name, FAILED, "StageFailed", f"stage {stage.name!r}: {error}")
        except StageError as error:
            phase = PENDING if error.reason in ("SourceNotReady", "ArtifactNotFound") else FAILED
            return StageOutcome(stage.name, phase, error.reason, error.message)
        except ApiError as error:
            return StageOutcome(stage.name, FAILED, "StageFailed",
                                f"stage {stage.name!r}: apiserver error {error.status}: {error.message}")
        done = StageOutcome(stage.name, READY, "Succeeded", "", revision, len(applied), applied_at)
        if verdict is None or verdict.status is Status.CURRENT:
            return done
        done.message = verdict.message
        if verdict.status is Status.FAILED:
            done.phase, done.reason = FAILED, "StageFailed"
        else:
            done.phase, done.reason = PROGRESSING, "StageProgressing"
        return done

    # -- the whole StageSet ---------------------------------------------------------

    def reconcile(self, raw: dict[str, Any]) -> float | None:
        """Reconcile one StageSet; returns seconds until it should run again."""
        metadata = raw["metadata"]
        namespace, generation = metadata["namespace"], int(metadata.get("generation", 0))
        admin = self._clients.client()
        status: dict[str, Any] = dict(raw.get("status") or {})
        conditions = list(status.get("conditions") or [])
        requested = (metadata.get("annotations") or {}).get("reconcile.fluxcd.io/requestedAt")
        if requested:
            status["lastHandledReconcileAt"] = requested

        def finish(*, ready: bool | None, reason: str, message: str, stalled: bool = False,
                   again: float | None = None) -> float | None:
            status["observedGeneration"] = generation
            status["conditions"] = summarize(conditions, ready=ready, reason=reason, message=message,
                                             generation=generation, stalled=stalled)
            write_status(admin, resource=self._resource, obj=raw, status=status)
            return again

        try:
            stageset = StageSet.model_validate(raw)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return finish(ready=False, reason="InvalidSpec", message=f"{where}: {first.get('msg')}",
                          stalled=True)
        spec = stageset.spec
        interval = parse_duration(spec.interval).total_seconds()
        retry = parse_duration(spec.retry_interval or spec.interval).total_seconds()
        if spec.suspend:
            return finish(ready=False, reason="Suspended", message="reconciliation is suspended")
        try:
            graph = stage_graph([StageNode(s.name, None if s.depends_on is None else tuple(s.depends_on))
                                 for s in spec.stages])
        except OrderingError as error:
            return finish(ready=False, reason="InvalidSpec" if error.cycle is None else "Stalled",
                          message=str(error), stalled=True)

        by_name = {s.name: s for s in spec.stages}
        outcomes: dict[str, StageOutcome] = {
            s.name: StageOutcome(s.name, PENDING) for s in spec.stages}
        previous = {s.get("name"): s for s in status.get("stages") or []}
        for name, outcome in outcomes.items():
            old = previous.get(name) or {}
            outcome.revision, outcome.applied_at = old.get("revision"), old.get("lastAppliedTime")

        def publish(ready: bool | None, reason: str, message: str) -> None:
            status["stages"] = [outcomes[s.name].as_status() for s in spec.stages]
            finish(ready=ready, reason=reason, message=message)

        publish(None, "Progressing", "applying stages")
        done: set[str] = set()
        started: set[str] = set()
        futures: dict[Future[StageOutcome], str] = {}
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"stages-{metadata['name']}") as pool:
            while True:
                for name in ready_to_start(graph, done=done, started=started):
                    started.add(name)
                    outcomes[name].phase = "Applying"
                    futures[pool.submit(self._run_stage, stageset=stageset, stage=by_name[name],
                                        namespace=namespace)] = name
                    publish(None, "Progressing", f"applying stage {name!r}")
                if not futures:
                    break
                finished, _ = wait(list(futures), return_when=FIRST_COMPLETED)
                for future in finished:
                    name = futures.pop(future)
                    outcomes[name] = future.result()
                    if outcomes[name].phase == READY:
                        done.add(name)
                if futures or ready_to_start(graph, done=done, started=started):
                    publish(None, "Progressing", f"stages ready: {len(done)}/{len(outcomes)}")

        if len(done) == len(outcomes):
            revisions = sorted({o.revision for o in outcomes.values() if o.revision})
            status["lastAppliedRevision"] = revisions[0] if len(revisions) == 1 else ", ".join(revisions)
            status["stages"] = [outcomes[s.name].as_status() for s in spec.stages]
            return finish(ready=True, reason="Succeeded",
                          message=f"applied {len(outcomes)} stage(s) at {status['lastAppliedRevision']}",
                          again=interval)
        failures = [o for o in outcomes.values() if o.reason and o.phase != READY]
        failures.sort(key=lambda o: _REASON_PRIORITY.index(o.reason)
                      if o.reason in _REASON_PRIORITY else len(_REASON_PRIORITY))
        worst = failures[0] if failures else StageOutcome("", PENDING, "StageFailed", "stages blocked")
        status["stages"] = [outcomes[s.name].as_status() for s in spec.stages]
        if worst.reason in ("SourceNotReady", "ArtifactNotFound"):
            # The source's revision notification usually wakes us first; this is the safety net.
            retry = min(retry, 30.0)
        return finish(ready=False, reason=worst.reason, message=worst.message, again=retry)
