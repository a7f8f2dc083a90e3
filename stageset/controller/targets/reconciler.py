"""The StageTarget reconciler: connects to each platform target and says in its status whether it can.

Identity: the controller's own, throughout — it lists and watches StageTargets only in the target
namespaces (``--target-namespaces``; a Role each), reads each target's kubeconfig Secret there as
itself (:class:`~stageset.controller.targets.platform.PlatformTargets`) — or its workload-identity
ConfigMap, requesting a token for the platform's ServiceAccount it names — asks the remote's
``/version`` with the kubeconfig's own identity (a workload-identity target: that account's token;
no impersonation either way: nothing is written there), and writes the StageTarget's status as
itself.  No tenant identity is ever used here.

What it declares (:meth:`StageTargetReconciler.controller`): ``For`` StageTargets in the target
namespaces only, their specs indexed for every StageSet's check before any key is queued; and
(:meth:`StageTargetReconciler.secrets`) a metadata-only watch of the Secrets of the target
namespaces (and, with workload identity on, of their ConfigMaps), whose change queues the
StageTargets naming it — a rotated or replaced kubeconfig is acted on within seconds, not at the
next interval.  Every StageSet on a target is
woken by its own reconciler's watch of this kind (:mod:`stageset.controller.stageset.watches`)
when the status this writes changes (the Secret's version read, readiness, server, version).

On label shards every shard watches every StageTarget (its StageSets may name any), but only the
shard the target's own ``sharding.fluxcd.io/key`` label names (unlabelled: the main shard; see
:meth:`~stageset.controller.sharding.LabelSelector.names_shard_of`) reconciles it — connects, asks
``/version`` and writes its status; the others only read (the index, and the connection their
StageSets' passes make), and their StageSets are woken by the status the owning shard writes.

Invariants: the status names the server URL and the Kubernetes version, never a credential or
anything else of the kubeconfig (a :class:`~stageset.kube.remote.KubeconfigError` names only the
field it refuses); it is readable by the target namespace's readers, not by tenants.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable

from pydantic import ValidationError

from stageset.api import StageTarget, StageTargetStatus
from stageset.api.vocabulary import Reason
from stageset.controller.clock import Clock, system_clock
from stageset.controller.events import EventRecorder, ReadyWarnings
from stageset.controller.kinds import CONFIGMAPS, SECRETS
from stageset.controller.result import Result, TerminalError
from stageset.controller.settings import DEFAULT_RUNBOOK_BASE_URL
from stageset.controller.setup import Controller, Enqueue, reconcile_trigger
from stageset.controller.sharding import LabelSelector
from stageset.controller.status import StatusWriter, WriteListener, validation_message
from stageset.controller.targets.clusters import Targets
from stageset.controller.targets.credentials import SecretUnusable
from stageset.controller.targets.platform import CONFIG_MAP, SECRET, WorkloadUnusable
from stageset.controller.targets.workload import token_refusal
from stageset.kube.client import ApiError, ClientPool, Identity, UnreachableError
from stageset.kube.mapping import Resource
from stageset.kube.remote import KubeconfigError
from stageset.kube.tokens import TokenUnavailable
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector

log = logging.getLogger(__name__)


class StageTargetReconciler:
    def __init__(self, *, clients: ClientPool, targets: Targets, resource: Resource,
                 namespaces: tuple[str, ...], interval: float, events: EventRecorder,
                 clock: Clock = system_clock, runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL,
                 on_write: WriteListener | None = None, shard: LabelSelector | None = None):
        assert targets.platform is not None, "platform targets are wired with --target-namespaces only"
        self._clients = clients
        self._targets = targets
        self._platform = targets.platform
        self._resource = resource
        self._namespaces = namespaces
        self._interval = interval
        self._clock = clock
        self._runbooks = runbook_base_url
        self._on_write = on_write
        self._shard = shard
        self._events = events

    def owns(self, obj: KubeObject) -> bool:
        """Whether this controller writes ``obj``'s status: without label shards always; on one, when
        the target's shard label names this shard."""
        return self._shard is None or self._shard.names_shard_of((obj.get("metadata") or {}).get("labels"))

    def controller(self, *, workers: int) -> Controller:
        """``For`` StageTargets of the target namespaces (a new generation, a ``requestedAt``, a
        deletion); every event indexed first, so a StageSet's check sees the spec the watch did.  A
        Ready that turns ``False`` is told as a Warning (:class:`ReadyWarnings`)."""
        return Controller(resource=self._resource, reconciler=self, workers=workers,
                          trigger=reconcile_trigger, indexed=self._platform.observe,
                          namespaces=self._namespaces, transitions=ReadyWarnings(self._events))

    def secrets(self, *, enqueue: Enqueue, stop: threading.Event, resync: float) -> tuple[Reflector, ...]:
        """Metadata-only watches of the target namespaces' Secrets — and, with workload identity on,
        ConfigMaps (no value is ever listed or cached): a changed kubeconfig Secret or
        workload-identity ConfigMap queues the StageTargets naming it."""
        def handler(kind: str) -> Callable[[str, KubeObject], None]:
            def handle(event: str, obj: KubeObject) -> None:
                for key in self._platform.secret_changed(event, obj, kind=kind):
                    enqueue(key)
            return handle
        watched = [(SECRETS, SECRET)]
        if self._platform.workload is not None:
            watched.append((CONFIGMAPS, CONFIG_MAP))
        return tuple(Reflector(client=self._clients.client(), resource=resource, namespace=namespace,
                               stop=stop, handler=handler(kind), resync=resync, metadata_only=True)
                     for resource, kind in watched for namespace in self._namespaces)

    def reconcile(self, raw: KubeObject) -> Result:
        """Connect to the target (its Secret read again) and report; ``raw`` is read-only."""
        if not self.owns(raw):
            return Result()  # another shard's to write; this one only reads it (the index)
        raw = copy.deepcopy(raw)
        meta = raw["metadata"]
        name = (str(meta["namespace"]), str(meta["name"]))
        try:
            report = StatusWriter(client=self._clients.client(), resource=self._resource, obj=raw,
                                  model=StageTargetStatus, clock=self._clock, runbook_base_url=self._runbooks,
                                  on_write=self._on_write)
        except ValidationError as error:
            raise TerminalError(f"cannot read the StageTarget's status ({validation_message(error)})") \
                from error
        try:
            StageTarget.model_validate({**raw, "status": None})
        except ValidationError as error:
            report.conclude(ready=False, reason=Reason.INVALID_SPEC, message=validation_message(error),
                            stalled=True)
            return Result()
        cleared = report.status.model_copy(update={"server": None, "kubernetes_version": None})
        try:
            target, connection = self._platform.refresh(name, remotes=self._targets)
        except SecretUnusable as error:
            reason = Reason.SECRET_NOT_FOUND if error.missing else Reason.INVALID_SPEC
            report.conclude(ready=False, reason=reason, message=f"spec.kubeConfig: {error}", status=cleared)
            return Result(backoff=True, requeue_after=self._interval)
        except (KubeconfigError, WorkloadUnusable) as error:
            report.conclude(ready=False, reason=Reason.INVALID_SPEC, message=f"spec.kubeConfig: {error}",
                            stalled=True, status=cleared)
            return Result(requeue_after=self._interval)
        except TokenUnavailable as error:
            refusal = token_refusal(error, field="spec.kubeConfig.configMapRef")
            report.conclude(ready=False, reason=refusal.reason, message=refusal.message, status=cleared)
            return Result(backoff=True, requeue_after=self._interval)
        except ApiError as error:
            reason = Reason.RBAC_DENIED if error.forbidden else Reason.FAILED
            report.conclude(ready=False, reason=reason, message=f"reading the kubeconfig Secret (or "
                            f"ConfigMap) failed: HTTP {error.status}", status=cleared)
            return Result(backoff=True, requeue_after=self._interval)
        status = report.status.model_copy(update={"server": target.server,
                                                  "observed_secret_version": connection.secret_version})
        try:
            version = self._clients.client(Identity(), target.cluster).get("/version")
        except UnreachableError as error:
            report.conclude(ready=False, reason=Reason.CLUSTER_UNREACHABLE,
                            message=f"the cluster at {target.server} cannot be reached: {error.why}",
                            status=status.model_copy(update={"kubernetes_version": None}))
            return Result(backoff=True, requeue_after=self._interval)
        except ApiError as error:
            report.conclude(ready=False, reason=Reason.CLUSTER_UNREACHABLE,
                            message=f"the cluster at {target.server} {error.answered}",
                            status=status.model_copy(update={"kubernetes_version": None}))
            return Result(backoff=True, requeue_after=self._interval)
        seen = str(version.get("gitVersion", ""))[:256] or None
        report.conclude(ready=True, reason=Reason.SUCCEEDED,
                        message=f"connected to {target.server}" + (f" (Kubernetes {seen})" if seen else ""),
                        status=status.model_copy(update={"kubernetes_version": seen}))
        return Result(requeue_after=self._interval)
