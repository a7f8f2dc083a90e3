"""The identity policy with and without ``--default-service-account`` (pure: no requests)."""

from __future__ import annotations

import pytest

from stageset.api import GitRepository, StageSet
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.controller.identity import IdentityPolicy
from stageset.kube.client import Identity


def stageset(account: str | None = None, stage_account: str | None = None) -> StageSet:
    stage: dict[str, object] = {"name": "app", "sourceRef": {"name": "src"}, "path": "app"}
    if stage_account:
        stage["serviceAccountName"] = stage_account
    spec: dict[str, object] = {"stages": [stage]}
    if account:
        spec["serviceAccountName"] = account
    return StageSet.model_validate({"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                                    "metadata": {"name": "s", "namespace": "team"}, "spec": spec})


def repository() -> GitRepository:
    return GitRepository.model_validate({"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                                         "metadata": {"name": "src", "namespace": "team"},
                                         "spec": {"url": "https://git.example/x.git",
                                                  "secretRef": {"name": "k"}}})


def deployer(name: str = "deployer") -> Identity:
    return Identity.service_account(namespace="team", name=name)


@pytest.mark.parametrize("cluster_admin", [False, True])
def test_without_an_account_the_default_of_the_own_namespace_acts_never_the_controller(
        cluster_admin: bool) -> None:
    policy = IdentityPolicy(cluster_admin=cluster_admin, default_service_account="deployer")
    s = stageset()
    assert policy.for_stage(s, s.spec.stages[0]) == deployer()
    assert policy.stage_account(s, s.spec.stages[0]) == "deployer"  # what the inventory records
    assert policy.for_stageset(s, what="reading dependsOn") == deployer()
    assert policy.for_gitrepository(repository()) == deployer()


def test_a_named_account_wins_over_the_default() -> None:
    policy = IdentityPolicy(cluster_admin=False, default_service_account="deployer")
    s = stageset("own", stage_account="stage-own")
    assert policy.for_stage(s, s.spec.stages[0]) == deployer("stage-own")
    assert policy.for_stageset(s, what="x") == deployer("own")


def test_without_a_default_multi_tenant_mode_still_fails_closed() -> None:
    policy = IdentityPolicy(cluster_admin=False)
    s = stageset()
    with pytest.raises(StageError) as refused:
        policy.for_stage(s, s.spec.stages[0])
    assert refused.value.reason == Reason.RBAC_DENIED
    assert policy.stage_account(s, s.spec.stages[0]) is None
    assert IdentityPolicy(cluster_admin=True).for_stage(s, s.spec.stages[0]) == Identity()


def test_an_inventory_applied_as_the_controller_is_never_deleted_as_the_default() -> None:
    # Objects the controller applied (no account recorded) stay the controller's to delete: only
    # cluster-admin mode may; the default account does not stand in for it.
    assert IdentityPolicy(cluster_admin=False, default_service_account="deployer").for_inventory(
        None, "team") is None
    assert IdentityPolicy(cluster_admin=True, default_service_account="deployer").for_inventory(
        None, "team") == Identity()
    assert IdentityPolicy(cluster_admin=False, default_service_account="deployer").for_inventory(
        "deployer", "team") == deployer()
