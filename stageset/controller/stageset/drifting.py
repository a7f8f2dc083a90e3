"""What the StageSet reconciler tells the drift watches (:mod:`stageset.controller.drift`).

- Around each reconcile (:meth:`DriftHooks.around`): a StageSet being deleted or suspended needs no
  watch (its teardown's deletes, or an admin's edits while suspended, trigger nothing); otherwise the
  pass is begun (events about its objects are held meanwhile) and settled when it ends, with the
  stages its spec names and its ``spec.kubeConfig`` Secret as the pass read it.
- After each stage's apply (:class:`DriftRecorded`, the stage runner's wrapper): the objects it owns
  now, as it left them, replace what it applied before.  A stage that failed before it applied, or
  only re-checked readiness, keeps what it had.

Nothing here decides what to write: a change the watches see queues the StageSet, whose normal pass
corrects it (or, in ``Warn`` mode, reports it).

Identity: none of its own.  The objects are registered with the client the stage applied with (its
identity on its cluster); the kubeConfig Secret with the StageSet's identity on this cluster
(:meth:`~stageset.controller.identity.IdentityPolicy.for_stageset`), the one that read it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from stageset.api import StageSet
from stageset.apply.changeset import Action
from stageset.apply.core import namespace_of
from stageset.apply.engine import StageResult
from stageset.apply.errors import StageError
from stageset.controller.drift.registry import Applied, DriftWatches, SecretWatch
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import CONFIGMAPS, SECRETS
from stageset.controller.result import Result
from stageset.controller.stageset.plan import StageOutcome
from stageset.controller.stageset.stage import StageRun, StageWork
from stageset.controller.targets.clusters import Targets, credential_object
from stageset.kube.client import ClientPool
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)


class DriftHooks:
    def __init__(self, *, drift: DriftWatches, clients: ClientPool, identities: IdentityPolicy,
                 targets: Targets):
        self._drift = drift
        self._clients = clients
        self._identities = identities
        self._targets = targets
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], StageSet] = {}
        """The StageSet (as its pass read it) of each pass under way that ran a stage."""

    def around(self, raw: KubeObject, reconcile: Callable[[], Result]) -> Result:
        """Run ``reconcile`` (a pass over ``raw``) between telling the drift watches it begins and ends."""
        meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
        ref = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if meta.get("deletionTimestamp") or spec.get("suspend"):
            self._drift.forget(ref)
            return reconcile()
        self._drift.begin(ref)
        try:
            return reconcile()
        finally:
            self._settle(ref, spec)

    def _settle(self, ref: tuple[str, str], spec: KubeObject) -> None:
        """Tell the watches the pass ended; what goes wrong here is logged, never the pass's."""
        with self._lock:
            stageset = self._seen.pop(ref, None)
        stages = [str(s.get("name")) for s in spec.get("stages") or [] if isinstance(s, dict)]
        try:
            if stageset is None:
                self._drift.settle(ref, stages=stages, keep_secret=True)
            else:
                self._drift.settle(ref, stages=stages, secret=self._secret(stageset))
        except Exception:  # the StageSet falls back to its interval; its pass stands
            log.exception("drift watches of StageSet %s/%s not updated", *ref)

    def forget(self, namespace: str, name: str) -> None:
        self._drift.forget((namespace, name))

    def stage_done(self, run: StageRun, result: StageResult | None) -> None:
        """A stage's work ended: what it owns now, as it left it, replaces what it applied before."""
        meta = run.stageset.metadata
        ref = (str(meta["namespace"]), str(meta["name"]))
        with self._lock:
            self._seen[ref] = run.stageset
        if result is None or run.recheck:
            return
        objects = [Applied(resource=o.resource, namespace=namespace_of(o),
                           name=str(o.manifest["metadata"]["name"]), live=o.live)
                   for o in result.objects if o.action is not Action.SKIPPED or o.drifted]
        try:
            client = self._clients.client(run.rendered.identity, run.rendered.target.cluster)
            self._drift.applied(ref, run.rendered.stage.name, client, objects)
        except Exception:  # the stage's outcome stands; its drift is noticed at the interval
            log.exception("drift watches of stage %s of StageSet %s/%s not updated",
                          run.rendered.stage.name, *ref)

    def _secret(self, stageset: StageSet) -> SecretWatch | None:
        """The object ``spec.kubeConfig`` names (its Secret, or with workload identity its ConfigMap)
        to watch, as the StageSet's identity, from the version its pass read."""
        ref = stageset.spec.kube_config
        if ref is None:
            return None
        namespace = str(stageset.metadata["namespace"])
        named = credential_object(namespace, ref)
        version = self._targets.credential_version(namespace, ref)
        if named is None or not version:
            return None
        try:
            identity = self._identities.for_stageset(stageset, what="watching spec.kubeConfig")
        except StageError:
            return None
        kind, _, name = named
        return SecretWatch(client=self._clients.client(identity), namespace=namespace, name=name,
                           version=version, resource=SECRETS if kind == "Secret" else CONFIGMAPS)


class DriftRecorded:
    """The stage runner, telling the drift watches what each stage applied."""

    def __init__(self, inner: StageWork, hooks: DriftHooks):
        self._inner = inner
        self._hooks = hooks

    def run(self, run: StageRun) -> tuple[StageOutcome, StageResult | None]:
        outcome, result = self._inner.run(run)
        self._hooks.stage_done(run, result)
        return outcome, result
