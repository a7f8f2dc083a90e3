"""Is a live object ready?  A Python port of the core kstatus rules.

Pure functions of the object's JSON.  ``Status.CURRENT`` means the object reached
its desired state; ``IN_PROGRESS`` means wait; ``FAILED`` is terminal (waiting will
not help).  Unknown kinds are current once their controller (if any) observed the
latest generation and no Ready-style condition says otherwise.

Our own kinds (``stages.metio.wtf``: StageSet, GitRepository, StageTarget, FleetRollout) are
stricter (:func:`_ours`): the controller always writes their status, so one is current only when it
says so — ``status.observedGeneration`` and the ``Ready`` condition's both at the object's
generation, and ``Ready=True``.  A StageSet a parent StageSet has just created carries no status
yet; under the generic rule it would read as current at once, and the parent would go on (and
prune what the child is about to take over) before the child has done anything.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stageset.kube.types import KubeObject


class Status(enum.Enum):
    CURRENT = "Current"
    IN_PROGRESS = "InProgress"
    FAILED = "Failed"


@dataclass(frozen=True)
class Readiness:
    status: Status
    message: str = ""
    watched: bool = False
    """Still in progress, and every object awaited is watched: a change wakes the waiter."""


def _conditions(obj: KubeObject) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in obj.get("status", {}).get("conditions", []) or []}


def _generation_observed(obj: KubeObject) -> Readiness | None:
    generation = obj.get("metadata", {}).get("generation")
    observed = obj.get("status", {}).get("observedGeneration")
    if generation is not None and observed is not None and observed < generation:
        return Readiness(Status.IN_PROGRESS, f"generation {generation} not yet observed (at {observed})")
    return None


def _deployment(obj: KubeObject) -> Readiness:
    spec, status = obj.get("spec", {}), obj.get("status", {})
    conditions = _conditions(obj)
    progressing = conditions.get("Progressing", {})
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        return Readiness(Status.FAILED, f"rollout failed: {progressing.get('message', '')}")
    wanted = spec.get("replicas", 1)
    for field, label in (("updatedReplicas", "updated"), ("readyReplicas", "ready"),
                         ("availableReplicas", "available")):
        have = status.get(field, 0)
        if have < wanted:
            return Readiness(Status.IN_PROGRESS, f"{have}/{wanted} replicas {label}")
    if status.get("replicas", 0) > wanted:
        return Readiness(Status.IN_PROGRESS, "old replicas are pending termination")
    return Readiness(Status.CURRENT)


def _statefulset(obj: KubeObject) -> Readiness:
    spec, status = obj.get("spec", {}), obj.get("status", {})
    wanted = spec.get("replicas", 1)
    if status.get("readyReplicas", 0) < wanted:
        return Readiness(Status.IN_PROGRESS, f"{status.get('readyReplicas', 0)}/{wanted} replicas ready")
    if spec.get("updateStrategy", {}).get("type", "RollingUpdate") == "RollingUpdate" and \
            status.get("updateRevision") and status.get("currentRevision") != status.get("updateRevision"):
        return Readiness(Status.IN_PROGRESS, "rolling update in progress")
    return Readiness(Status.CURRENT)


def _daemonset(obj: KubeObject) -> Readiness:
    status = obj.get("status", {})
    wanted = status.get("desiredNumberScheduled")
    if wanted is None:
        return Readiness(Status.IN_PROGRESS, "not yet scheduled")
    for field, label in (("currentNumberScheduled", "scheduled"), ("updatedNumberScheduled", "updated"),
                         ("numberAvailable", "available"), ("numberReady", "ready")):
        if status.get(field, 0) < wanted:
            return Readiness(Status.IN_PROGRESS, f"{status.get(field, 0)}/{wanted} pods {label}")
    return Readiness(Status.CURRENT)


def _replicaset(obj: KubeObject) -> Readiness:
    wanted = obj.get("spec", {}).get("replicas", 1)
    status = obj.get("status", {})
    if status.get("availableReplicas", 0) < wanted or status.get("readyReplicas", 0) < wanted:
        available = status.get("availableReplicas", 0)
        return Readiness(Status.IN_PROGRESS, f"{available}/{wanted} replicas available")
    return Readiness(Status.CURRENT)


def _job(obj: KubeObject) -> Readiness:
    conditions = _conditions(obj)
    if conditions.get("Failed", {}).get("status") == "True":
        return Readiness(Status.FAILED, f"job failed: {conditions['Failed'].get('message', '')}")
    if conditions.get("Complete", {}).get("status") == "True":
        return Readiness(Status.CURRENT)
    return Readiness(Status.IN_PROGRESS, "job not complete")


def _pod(obj: KubeObject) -> Readiness:
    phase = obj.get("status", {}).get("phase")
    if phase == "Succeeded":
        return Readiness(Status.CURRENT)
    if phase == "Failed":
        return Readiness(Status.FAILED, "pod failed")
    if _conditions(obj).get("Ready", {}).get("status") == "True":
        return Readiness(Status.CURRENT)
    return Readiness(Status.IN_PROGRESS, f"pod is {phase or 'Pending'}")


def _pvc(obj: KubeObject) -> Readiness:
    phase = obj.get("status", {}).get("phase")
    if phase == "Bound":
        return Readiness(Status.CURRENT)
    return Readiness(Status.IN_PROGRESS, f"claim is {phase or 'Pending'}")


def _service(obj: KubeObject) -> Readiness:
    if obj.get("spec", {}).get("type") != "LoadBalancer":
        return Readiness(Status.CURRENT)
    if obj.get("status", {}).get("loadBalancer", {}).get("ingress"):
        return Readiness(Status.CURRENT)
    return Readiness(Status.IN_PROGRESS, "load balancer has no ingress yet")


def _crd(obj: KubeObject) -> Readiness:
    conditions = _conditions(obj)
    if conditions.get("NamesAccepted", {}).get("status") == "False":
        message = conditions["NamesAccepted"].get("message", "")
        return Readiness(Status.FAILED, f"names not accepted: {message}")
    if conditions.get("Established", {}).get("status") == "True":
        return Readiness(Status.CURRENT)
    return Readiness(Status.IN_PROGRESS, "not yet established")


def _namespace(obj: KubeObject) -> Readiness:
    if obj.get("status", {}).get("phase", "Active") == "Active":
        return Readiness(Status.CURRENT)
    return Readiness(Status.IN_PROGRESS, "namespace is terminating")


OUR_GROUP = "stages.metio.wtf"


def _ours(obj: KubeObject) -> Readiness:
    """One of our kinds: current only when its controller said ``Ready=True`` about its current
    generation (both ``status.observedGeneration`` and the condition's); ``Stalled=True`` about that
    generation is terminal; anything else — no status at all included — is in progress."""
    generation = obj.get("metadata", {}).get("generation")
    status = obj.get("status") or {}
    conditions = _conditions(obj)
    stalled = conditions.get("Stalled", {})
    if stalled.get("status") == "True" and stalled.get("observedGeneration", generation) == generation:
        return Readiness(Status.FAILED, str(stalled.get("message") or "stalled"))
    ready = conditions.get("Ready")
    if ready is None or status.get("observedGeneration") is None:
        return Readiness(Status.IN_PROGRESS, f"has not reported its status for generation {generation} yet")
    if status.get("observedGeneration") != generation or ready.get("observedGeneration") != generation:
        return Readiness(Status.IN_PROGRESS, f"generation {generation} not yet observed "
                                             f"(at {status.get('observedGeneration')})")
    if ready.get("status") != "True":
        reason = f"{ready.get('reason')}: " if ready.get("reason") else ""
        return Readiness(Status.IN_PROGRESS, f"{reason}{ready.get('message') or 'not ready'}")
    return Readiness(Status.CURRENT)


def _generic(obj: KubeObject) -> Readiness:
    conditions = _conditions(obj)
    stalled = conditions.get("Stalled", {})
    if stalled.get("status") == "True":
        return Readiness(Status.FAILED, stalled.get("message", "stalled"))
    ready = conditions.get("Ready")
    if ready is not None and ready.get("status") != "True":
        return Readiness(Status.IN_PROGRESS, ready.get("message", "not ready"))
    if conditions.get("Reconciling", {}).get("status") == "True":
        return Readiness(Status.IN_PROGRESS, conditions["Reconciling"].get("message", "reconciling"))
    return Readiness(Status.CURRENT)


_RULES: dict[tuple[str, str], Callable[[KubeObject], Readiness]] = {
    ("apps", "Deployment"): _deployment,
    ("apps", "StatefulSet"): _statefulset,
    ("apps", "DaemonSet"): _daemonset,
    ("apps", "ReplicaSet"): _replicaset,
    ("batch", "Job"): _job,
    ("", "Pod"): _pod,
    ("", "PersistentVolumeClaim"): _pvc,
    ("", "Service"): _service,
    ("", "Namespace"): _namespace,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): _crd,
}


def preconditions(obj: KubeObject) -> Readiness | None:
    """What holds for every kind, before its own rule: being deleted, or a generation its controller
    has not observed yet, is in progress.  ``None``: go on to the kind's rule."""
    if obj.get("metadata", {}).get("deletionTimestamp"):
        return Readiness(Status.IN_PROGRESS, "being deleted")
    return _generation_observed(obj)


def readiness(obj: KubeObject) -> Readiness:
    """Judge one live object."""
    early = preconditions(obj)
    if early is not None:
        return early
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    if group == OUR_GROUP:
        return _ours(obj)
    rule = _RULES.get((group, str(obj.get("kind", ""))), _generic)
    return rule(obj)
