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
