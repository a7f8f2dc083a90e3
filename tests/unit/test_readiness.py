from __future__ import annotations

from typing import Any

import pytest

from stageset.apply.readiness import Status, readiness


def deployment(status: dict[str, Any], *, generation: int = 1, replicas: int = 2) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "generation": generation},
            "spec": {"replicas": replicas}, "status": status}


FULL = {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
        "availableReplicas": 2}


@pytest.mark.parametrize(("obj", "expected"), [
    (deployment(FULL), Status.CURRENT),
    (deployment({**FULL, "readyReplicas": 1}), Status.IN_PROGRESS),
    (deployment(FULL, generation=2), Status.IN_PROGRESS),
    (deployment({}), Status.IN_PROGRESS),
    (deployment({**FULL, "readyReplicas": 0, "conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}), Status.FAILED),
    (deployment({**FULL, "replicas": 3}), Status.IN_PROGRESS),
])
def test_deployment(obj: dict[str, Any], expected: Status) -> None:
    assert readiness(obj).status is expected


@pytest.mark.parametrize(("conditions", "expected"), [
    ([{"type": "Complete", "status": "True"}], Status.CURRENT),
    ([{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}], Status.FAILED),
    ([], Status.IN_PROGRESS),
])
def test_job(conditions: list[dict[str, str]], expected: Status) -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "status": {"conditions": conditions}}
    assert readiness(job).status is expected


@pytest.mark.parametrize(("obj", "expected"), [
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}, Status.CURRENT),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"type": "ClusterIP"}},
     Status.CURRENT),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
      "spec": {"type": "LoadBalancer"}, "status": {}}, Status.IN_PROGRESS),
    ({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "p"},
      "status": {"phase": "Bound"}}, Status.CURRENT),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "status": {"phase": "Failed"}},
     Status.FAILED),
    ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"},
      "status": {"phase": "Terminating"}}, Status.IN_PROGRESS),
    ({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
      "metadata": {"name": "x"}, "status": {"conditions": [{"type": "Established", "status": "True"}]}},
     Status.CURRENT),
    ({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
      "metadata": {"name": "x"}, "status": {"conditions": []}}, Status.IN_PROGRESS),
    ({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "generation": 3},
      "status": {"observedGeneration": 3, "conditions": [{"type": "Ready", "status": "False"}]}},
     Status.IN_PROGRESS),
    ({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
      "status": {"conditions": [{"type": "Stalled", "status": "True", "message": "bad"}]}}, Status.FAILED),
    ({"apiVersion": "v1", "kind": "ConfigMap",
      "metadata": {"name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z"}}, Status.IN_PROGRESS),
])
def test_other_kinds(obj: dict[str, Any], expected: Status) -> None:
    assert readiness(obj).status is expected


@pytest.mark.parametrize(("status", "spec", "expected"), [
    ({"observedGeneration": 1, "readyReplicas": 3, "currentRevision": "r1", "updateRevision": "r1"},
     {"replicas": 3}, Status.CURRENT),
    ({"observedGeneration": 1, "readyReplicas": 2, "currentRevision": "r1", "updateRevision": "r1"},
     {"replicas": 3}, Status.IN_PROGRESS),
    ({"observedGeneration": 1, "readyReplicas": 3, "currentRevision": "r1", "updateRevision": "r2"},
     {"replicas": 3}, Status.IN_PROGRESS),
    ({"observedGeneration": 1, "readyReplicas": 3, "currentRevision": "r1", "updateRevision": "r2"},
     {"replicas": 3, "updateStrategy": {"type": "OnDelete"}}, Status.CURRENT),
])
def test_statefulset(status: dict[str, Any], spec: dict[str, Any], expected: Status) -> None:
    obj = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "generation": 1},
           "spec": spec, "status": status}
    assert readiness(obj).status is expected


FULL_DS = {"observedGeneration": 1, "desiredNumberScheduled": 2, "currentNumberScheduled": 2,
           "updatedNumberScheduled": 2, "numberAvailable": 2, "numberReady": 2}


@pytest.mark.parametrize(("status", "expected"), [
    (FULL_DS, Status.CURRENT),
    ({**FULL_DS, "numberAvailable": 1}, Status.IN_PROGRESS),
    ({**FULL_DS, "updatedNumberScheduled": 1}, Status.IN_PROGRESS),
    ({"observedGeneration": 1}, Status.IN_PROGRESS),
])
def test_daemonset(status: dict[str, Any], expected: Status) -> None:
    obj = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d", "generation": 1},
           "status": status}
    assert readiness(obj).status is expected


@pytest.mark.parametrize(("status", "expected"), [
    ({"observedGeneration": 1, "readyReplicas": 2, "availableReplicas": 2}, Status.CURRENT),
    ({"observedGeneration": 1, "readyReplicas": 2, "availableReplicas": 1}, Status.IN_PROGRESS),
])
def test_replicaset(status: dict[str, Any], expected: Status) -> None:
    obj = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "r", "generation": 1},
           "spec": {"replicas": 2}, "status": status}
    assert readiness(obj).status is expected


@pytest.mark.parametrize(("status", "message"), [
    ({"observedGeneration": 1}, "0/3 replicas updated"),
    ({**FULL, "updatedReplicas": 3, "readyReplicas": 1}, "1/3 replicas ready"),
    ({**FULL, "updatedReplicas": 3, "readyReplicas": 3, "availableReplicas": 2}, "2/3 replicas available"),
])
def test_a_waiting_deployment_says_how_far_it_got(status: dict[str, Any], message: str) -> None:
    # What a waiting stage's message shows (docs/concepts.md#readiness).
    assert readiness(deployment(status, replicas=3)).message == message


def ours(kind: str, status: dict[str, Any] | None, *, generation: int = 2,
         api_version: str = "stages.metio.wtf/v1") -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind,
                           "metadata": {"name": "app", "generation": generation}}
    if status is not None:
        obj["status"] = status
    return obj


def said(ready: str, *, at: int = 2, observed: int | None = 2, reason: str = "Succeeded",
         stalled: str | None = None, stalled_at: int | None = 2) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = [{"type": "Ready", "status": ready, "reason": reason,
                                         "message": "m", "observedGeneration": at}]
    if stalled is not None:
        stall: dict[str, Any] = {"type": "Stalled", "status": stalled, "message": "cycle"}
        if stalled_at is not None:
            stall["observedGeneration"] = stalled_at
        conditions.append(stall)
    status: dict[str, Any] = {"conditions": conditions}
    if observed is not None:
        status["observedGeneration"] = observed
    return status


OUR_KINDS = ("StageSet", "GitRepository", "StageTarget", "FleetRollout")


@pytest.mark.parametrize("kind", OUR_KINDS)
@pytest.mark.parametrize(("status", "expected", "message"), [
    # Issue 46 item 0: a child a parent has just created says nothing yet; it is not current.
    (None, Status.IN_PROGRESS, "has not reported its status for generation 2 yet"),
    ({}, Status.IN_PROGRESS, "has not reported its status for generation 2 yet"),
    ({"observedGeneration": 2}, Status.IN_PROGRESS, "has not reported"),
    (said("True", observed=None), Status.IN_PROGRESS, "has not reported"),
    (said("True"), Status.CURRENT, ""),
    # Ready about an older generation: the new spec has not been looked at.
    (said("True", at=1, observed=1), Status.IN_PROGRESS, "generation 2 not yet observed (at 1)"),
    (said("True", at=1, observed=2), Status.IN_PROGRESS, "generation 2 not yet observed"),
    (said("True", at=2, observed=1), Status.IN_PROGRESS, "generation 2 not yet observed (at 1)"),
    (said("False", reason="StageProgressing"), Status.IN_PROGRESS, "StageProgressing: m"),
    (said("Unknown", reason="Progressing"), Status.IN_PROGRESS, "Progressing: m"),
    (said("False", reason="Suspended"), Status.IN_PROGRESS, "Suspended: m"),
    # Stalled about this generation is terminal; about an older one it is not.
    (said("False", stalled="True"), Status.FAILED, "cycle"),
    (said("False", stalled="True", stalled_at=None), Status.FAILED, "cycle"),
    (said("False", at=1, observed=1, stalled="True", stalled_at=1), Status.IN_PROGRESS, "not yet observed"),
    (said("True", stalled="False"), Status.CURRENT, ""),
])
def test_our_kinds_are_current_only_when_their_controller_says_so(
        kind: str, status: dict[str, Any] | None, expected: Status, message: str) -> None:
    judged = readiness(ours(kind, status))
    assert judged.status is expected
    assert message in judged.message


def test_another_group_keeps_the_generic_rule() -> None:
    """A kind of another group with no status at all is current, as kstatus says (unchanged)."""
    assert readiness(ours("StageSet", None, api_version="example.com/v1")).status is Status.CURRENT
