"""What a StageSet waits for, as ``tree``, ``get -o wide`` and ``graph`` show it: StageSets and
objects of other kinds in ``spec.dependsOn``, each read as the user and judged by the controller's
rules (kstatus, or its ``readyExpr`` in the CEL sandbox).  No controller runs: these commands read
the spec and the objects it names, nothing the controller wrote."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from stageset.envtest import dependencykinds as kinds
from stageset.envtest import install
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.cli.conftest import run_cli, user_kubeconfig
from tests.e2e.conftest import apply

pytestmark = [pytest.mark.apiserver]


@pytest.fixture(scope="module")
def waiting(installed: KubeClient) -> str:
    kinds.install(installed)
    namespace = f"waits-{uuid.uuid4().hex[:6]}"
    install.create_tenant(installed, namespace=namespace, service_account="deployer")
    kinds.create_database(installed, namespace, "db", status={"conditions": [
        kinds.ready_condition("False", "provisioning storage")]})
    kinds.create_database(installed, namespace, "cache",
                          status={"conditions": [kinds.ready_condition("True")], "phase": "Resizing"})
    apply(installed, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                      "metadata": {"name": "app", "namespace": namespace},
                      "spec": {"serviceAccountName": "deployer",
                               "stages": [{"name": "app", "sourceRef": {"name": "app"}}],
                               "dependsOn": [
                                   {"name": "base"},
                                   {"apiVersion": "db.example/v1", "kind": "Database", "name": "db"},
                                   {"apiVersion": "db.example/v1", "kind": "Database", "name": "cache",
                                    "readyExpr": "status.phase == 'Available'"},
                                   {"apiVersion": "db.example/v1", "kind": "Ledger", "name": "books"}]}})
    return namespace


def test_tree_names_each_dependency_with_its_state(control_plane: ControlPlane, waiting: str) -> None:
    result = run_cli("tree", "app", "-n", waiting, kubeconfig=control_plane.kubeconfig)
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert f"waits for StageSet {waiting}/base: NotFound" in lines
    assert "waits for Database db: NotReady (is not Ready: provisioning storage)" in lines
    assert ("waits for Database cache: NotReady (is not ready: spec.dependsOn[2].readyExpr is not true yet) "
            "[readyExpr: status.phase == 'Available']") in lines
    assert "waits for Ledger books: Unserved (the cluster serves no Ledger in db.example/v1)" in lines
    data = yaml.safe_load(run_cli("tree", "app", "-n", waiting, "-o", "yaml",
                                  kubeconfig=control_plane.kubeconfig).stdout)
    assert [(d["kind"], d["name"], d["state"]) for d in data["waitsFor"]] == [
        ("StageSet", "base", "NotFound"), ("Database", "db", "NotReady"), ("Database", "cache", "NotReady"),
        ("Ledger", "books", "Unserved")]


def test_get_wide_lists_what_it_waits_for_and_with_a_name_their_states(
        control_plane: ControlPlane, waiting: str) -> None:
    listed = run_cli("get", "-n", waiting, "-o", "wide", kubeconfig=control_plane.kubeconfig)
    assert listed.exit_code == 0, listed.output
    header, row = listed.stdout.splitlines()[:2]
    assert "WAITS FOR" in header
    assert f"StageSet/{waiting}/base,Database/db,Database/cache,Ledger/books" in row.split()
    one = run_cli("get", "app", "-n", waiting, "-o", "wide", kubeconfig=control_plane.kubeconfig)
    assert "  waits for Database db: NotReady (is not Ready: provisioning storage)" in one.stdout


def test_what_the_user_may_not_read_is_unknown_never_guessed(
        installed: KubeClient, control_plane: ControlPlane, waiting: str, tmp_path: Path) -> None:
    # A user who may read StageSets there (view) but not Databases.
    config = user_kubeconfig(installed, control_plane, namespace=waiting, account="viewer",
                             path=tmp_path / "viewer")
    installed.apply(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{waiting}/rolebindings/viewer",
                    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": "viewer", "namespace": waiting},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                 "name": "view"},
                     "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": waiting}]},
                    field_manager="test")
    result = run_cli("tree", "app", "-n", waiting, kubeconfig=config)
    assert result.exit_code == 0, result.output
    assert "waits for Database db: Unknown (you may not read it)" in result.stdout
    assert "provisioning storage" not in result.stdout


def test_graph_draws_objects_of_other_kinds_beside_the_stagesets(control_plane: ControlPlane,
                                                                waiting: str) -> None:
    text = run_cli("graph", "app", "-n", waiting, kubeconfig=control_plane.kubeconfig).stdout
    rows = [line.split() for line in text.splitlines()]
    assert [f"{waiting}/base", "NotFound"] in rows
    assert ["Database", "db", "NotReady", "is", "not", "Ready:", "provisioning", "storage"] in rows
    dot = run_cli("graph", "app", "-n", waiting, "-o", "dot", kubeconfig=control_plane.kubeconfig).stdout
    assert f'"object/Database/{waiting}/db" -> "stage/app" [style=dashed];' in dot
    assert f'"stageset/{waiting}/base" -> "stage/app" [style=dashed];' in dot
