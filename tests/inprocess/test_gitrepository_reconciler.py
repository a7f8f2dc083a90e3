"""The GitRepository reconciler in process: credentials read as its ServiceAccount, artifacts kept."""

from __future__ import annotations

import base64

from sources import GitOperationError, Snapshot
from stageset.controller.gitrepository import GitRepositoryReconciler
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import GITREPOSITORIES
from tests.inprocess.conftest import NS, SA, TENANT, URL, World
from tests.inprocess.fakes import CONTROLLER

PATH = GITREPOSITORIES.object_path(name="app", namespace=NS)


def reconciler(world: World, *, cluster_admin: bool = False) -> tuple[GitRepositoryReconciler, list[str]]:
    revisions: list[str] = []
    return GitRepositoryReconciler(
        clients=world.pool,
        store=world.sources,
        resource=GITREPOSITORIES,
        on_revision=lambda ns, name, revision: revisions.append(f"{ns}/{name}@{revision}"),
        identities=IdentityPolicy(cluster_admin=cluster_admin),
        clock=world.clock,
    ), revisions


def gitrepository(world: World, **spec: object) -> None:
    world.cluster.put(
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "GitRepository",
            "metadata": {"name": "app", "namespace": NS},
            "spec": {"url": URL, **spec},
        }
    )


def ready(world: World) -> dict[str, object]:
    obj = world.cluster.get(PATH)
    assert obj is not None
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")


def test_an_artifact_is_reported_and_dependents_told(world: World) -> None:
    sha = world.sources.commit(URL, {"cm.json": "{}"})
    gitrepository(world, interval="2m")
    git, revisions = reconciler(world)
    result = git.reconcile(world.cluster.get(PATH) or {})

    assert ready(world)["reason"] == "Succeeded"
    artifact = (world.cluster.get(PATH) or {})["status"]["artifact"]
    assert artifact["revision"] == f"main@sha1:{sha}"
    assert artifact["lastUpdateTime"] == "2030-01-01T00:00:00Z"
    assert revisions == [f"{NS}/app@main@sha1:{sha}"]
    assert result.requeue_after is not None
    assert 108 <= result.requeue_after <= 132  # 2m, jittered
    assert [r.user for r in world.cluster.requests] == [CONTROLLER], "only the status write"


def test_the_secret_is_read_as_the_service_account(world: World) -> None:
    world.sources.commit(URL, {"cm.json": "{}"})
    world.cluster.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "auth", "namespace": NS},
            "data": {
                "username": base64.b64encode(b"git").decode(),
                "password": base64.b64encode(b"hunter22").decode(),
            },
        }
    )
    gitrepository(world, secretRef={"name": "auth"}, serviceAccountName=SA)
    git, _ = reconciler(world)
    git.reconcile(world.cluster.get(PATH) or {})

    assert ready(world)["reason"] == "Succeeded"
    assert [(r.user, r.verb, r.path) for r in world.cluster.by(TENANT)] == [
        (TENANT, "get", f"/api/v1/namespaces/{NS}/secrets/auth")
    ]
    ((_, credentials),) = world.sources.fetches
    assert credentials is not None
    assert (credentials.username, credentials.password) == ("git", "hunter22")


def test_without_a_service_account_multi_tenant_mode_never_reads_the_secret(world: World) -> None:
    world.sources.commit(URL, {"cm.json": "{}"})
    gitrepository(world, secretRef={"name": "git-auth"})
    git, _ = reconciler(world)
    git.reconcile(world.cluster.get(PATH) or {})

    condition = ready(world)
    assert condition["reason"] == "RBACDenied"
    assert "git-auth" in str(condition["message"])
    assert not [r for r in world.cluster.requests if "/secrets/" in r.path]
    assert world.sources.fetches == []


def test_a_failed_fetch_keeps_the_last_artifact(world: World) -> None:
    sha = world.sources.commit(URL, {"cm.json": "{}"})
    gitrepository(world)
    git, _ = reconciler(world)
    git.reconcile(world.cluster.get(PATH) or {})

    def broken(url: str, **_: object) -> Snapshot:
        raise GitOperationError(f"{url}: connection refused")

    world.sources.fetch = broken  # type: ignore[method-assign,assignment]
    result = git.reconcile(world.cluster.get(PATH) or {})
    condition = ready(world)
    assert (condition["status"], condition["reason"]) == ("False", "GitOperationFailed")
    assert (world.cluster.get(PATH) or {})["status"]["artifact"]["revision"] == f"main@sha1:{sha}"
    assert result.requeue_after == 60.0
