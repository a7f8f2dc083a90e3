"""The apply engine's change set over the fake cluster: one action per object."""

from __future__ import annotations

import pytest

from stageset.apply.changeset import Action
from stageset.apply.claims import Unclaimed
from stageset.apply.engine import StageApplier, StageResult
from stageset.apply.inventory import by_id, stage_inventory
from stageset.apply.ownership import StageOwner
from stageset.kube.client import ApiError, Identity
from stageset.kube.mapping import RestMapper
from tests.inprocess.conftest import NS, SA, TENANT
from tests.inprocess.fakes import FakeClientPool, FakeCluster

OWNER = StageOwner(NS, "shop", "app")


def cm(name: str, value: str = "v") -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": value}}


def job(image: str) -> dict[str, object]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "job"},
        "spec": {"image": image},
    }


def actions(result: StageResult) -> dict[str, tuple[Action, bool]]:
    return {c.id.name: (c.action, c.drift) for c in result.changes}


def test_one_action_per_object_across_passes() -> None:
    cluster = FakeCluster()
    cluster.grant_namespace(TENANT, NS)
    pool = FakeClientPool(cluster)
    applier = StageApplier(mapper=RestMapper(pool.client()))
    client = pool.client(Identity.service_account(namespace=NS, name=SA))

    def apply(
        objects: list[dict[str, object]], previous: StageResult | None, *, force: bool = False
    ) -> StageResult:
        inventory = stage_inventory("app", SA, (o.entry() for o in previous.objects)) if previous else None
        return applier.apply(
            client=client,
            owner=OWNER,
            objects=objects,
            default_namespace=NS,
            force=force,
            previous=by_id(inventory) if inventory else None,
            claims=Unclaimed(),
        )

    first = apply([cm("a"), cm("b")], None)
    assert actions(first) == {"a": (Action.CREATED, False), "b": (Action.CREATED, False)}
    assert first.changes.summary() == "2 created"

    second = apply([cm("a"), cm("b", "new")], first)
    assert actions(second) == {"a": (Action.UNCHANGED, False), "b": (Action.CONFIGURED, False)}
    assert second.changes.writes == 1

    cluster.edit(f"/api/v1/namespaces/{NS}/configmaps/a", lambda o: o.update(data={"k": "by hand"}))
    cluster.remove(f"/api/v1/namespaces/{NS}/configmaps/b")
    third = apply([cm("a"), cm("b", "new")], second)
    assert actions(third) == {"a": (Action.CONFIGURED, True), "b": (Action.CREATED, True)}
    assert [c.id.name for c in third.changes.drifted] == ["a", "b"]

    fourth = apply([job("one")], None)
    assert actions(fourth) == {"job": (Action.CREATED, False)}
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/job"
    cluster.failures[("apply", path, True)] = ApiError(
        status=422, reason="Invalid", message="field is immutable"
    )
    recreated = apply([job("two")], fourth, force=True)
    assert actions(recreated) == {"job": (Action.RECREATED, False)}
    assert [(r.verb, r.dry_run) for r in cluster.requests if r.path == path][-3:] == [
        ("delete", False),
        ("get", False),
        ("apply", False),
    ]


def test_waiting_tells_progress_naming_the_first_object_not_ready_and_how_many_more() -> None:
    import threading

    from stageset.apply.readiness import Readiness, Status
    from stageset.apply.settings import ApplySettings

    cluster = FakeCluster()
    cluster.grant_namespace(TENANT, NS)
    pool = FakeClientPool(cluster)
    applier = StageApplier(mapper=RestMapper(pool.client()), settings=ApplySettings(poll_interval=0.01))
    client = pool.client(Identity.service_account(namespace=NS, name=SA))

    def deploy(name: str) -> dict[str, object]:
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                "spec": {"replicas": 3}}

    result = applier.apply(client=client, owner=OWNER, objects=[deploy("a"), deploy("b")],
                           default_namespace=NS, claims=Unclaimed())
    heard: list[Readiness] = []
    final = applier.wait_ready(client=client, applied=result.objects, timeout=0.1, stop=threading.Event(),
                               progress=heard.append)
    assert heard, "progress is told while waiting"
    assert {r.message for r in heard} == {f"Deployment {NS}/a: 0/3 replicas updated (and 1 more not ready)"}
    assert final.status is Status.IN_PROGRESS
    assert final.message == heard[0].message


def test_ready_checks_resolve_scope_from_discovery_and_wait_for_a_kind_not_served_yet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``readyChecks.checks`` as the reference reads them: a cluster-scoped kind is read without a
    namespace (even when one is given); a kind the cluster does not serve yet is waited for."""
    import threading

    from stageset.apply.readiness import Status
    from stageset.apply.settings import ApplySettings
    from tests.inprocess import fakes

    cluster = FakeCluster()
    cluster.grant(TENANT, "/api/v1/namespaces/payments", "get")
    cluster.grant_namespace(TENANT, NS)
    pool = FakeClientPool(cluster)
    applier = StageApplier(mapper=RestMapper(pool.client()), settings=ApplySettings(poll_interval=0.01))
    client = pool.client(Identity.service_account(namespace=NS, name=SA))
    ledger = {"apiVersion": "ledger.example/v1", "kind": "Ledger",
              "metadata": {"name": "main", "namespace": NS}}
    checks = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "payments", "namespace": NS}},
              ledger]

    def wait() -> tuple[Status, str]:
        final = applier.wait_ready(client=client, applied=[], references=checks, default_namespace=NS,
                                   timeout=0.05, stop=threading.Event())
        return final.status, final.message

    assert wait() == (Status.IN_PROGRESS, "Namespace payments not found (and 1 more not ready)")
    assert ("get", "/api/v1/namespaces/payments") in {(r.verb, r.path) for r in cluster.by(TENANT)}
    cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "payments"},
                 "status": {"phase": "Active"}})
    assert wait() == (Status.IN_PROGRESS,
                      f"Ledger {NS}/main: the cluster does not serve ledger.example/v1 Ledger (yet)")
    # Another release installs the CRD, then the object: the next round finds both.
    monkeypatch.setattr(fakes, "KINDS", [*fakes.KINDS, ("ledger.example/v1", "Ledger", "ledgers", True)])
    cluster.put(ledger)
    assert wait() == (Status.CURRENT, "")


def test_warn_leaves_drift_unwritten_names_its_fields_and_looks_again_next_pass() -> None:
    """driftDetection.mode Warn in the engine: drift is SKIPPED and described, never written (nor a
    deleted object re-created); the warm check does not settle it, so the next pass finds it again;
    a new manifest is no drift and is written; without warn_drift the same drift is restored."""
    cluster = FakeCluster()
    cluster.grant_namespace(TENANT, NS)
    pool = FakeClientPool(cluster)
    applier = StageApplier(mapper=RestMapper(pool.client()))
    client = pool.client(Identity.service_account(namespace=NS, name=SA))

    def apply(objects: list[dict[str, object]], previous: StageResult | None, *, warn: bool) -> StageResult:
        inventory = stage_inventory("app", SA, (o.entry() for o in previous.objects)) if previous else None
        return applier.apply(client=client, owner=OWNER, objects=objects, default_namespace=NS,
                             previous=by_id(inventory) if inventory else None, claims=Unclaimed(),
                             warn_drift=warn)

    def writes() -> int:
        return sum(1 for r in cluster.requests if r.verb in ("apply", "create", "delete") and not r.dry_run)

    first = apply([cm("a"), cm("b"), cm("c")], None, warn=True)
    cluster.edit(f"/api/v1/namespaces/{NS}/configmaps/a", lambda o: o.update(data={"k": "by hand"}))
    cluster.remove(f"/api/v1/namespaces/{NS}/configmaps/b")
    before = writes()
    warned = apply([cm("a"), cm("b"), cm("c", "new")], first, warn=True)
    assert actions(warned) == {"a": (Action.SKIPPED, True), "b": (Action.SKIPPED, True),
                               "c": (Action.CONFIGURED, False)}
    assert writes() == before + 1, "only the new manifest (c) was written"
    by_name = {c.id.name: c for c in warned.changes}
    assert by_name["a"].fields == ("data.k",)
    assert by_name["b"].gone
    assert [c.id.name for c in warned.changes.left_drifted] == ["a", "b"]
    assert warned.changes.drifted == [], "nothing was restored"
    assert cluster.get(f"/api/v1/namespaces/{NS}/configmaps/b") is None
    # The next pass looks again (the warm check does not take a drifted object as unchanged).
    again = apply([cm("a"), cm("b"), cm("c", "new")], warned, warn=True)
    assert actions(again)["a"] == (Action.SKIPPED, True)
    # Correct: restored.
    corrected = apply([cm("a"), cm("b"), cm("c", "new")], again, warn=False)
    assert actions(corrected) == {"a": (Action.CONFIGURED, True), "b": (Action.CREATED, True),
                                  "c": (Action.UNCHANGED, False)}
