"""The GitRepository reconciler through the controller process, against real Git servers."""

from __future__ import annotations

import base64
import datetime
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import (
    GITREPOS,
    ControllerProcess,
    apply,
    condition,
    get_or_none,
    stageset,
    wait_for,
)
from tests.gitserver import GitServer
from tests.sshserver import SshServer, keygen

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

PASSWORD = "s3cret-passw0rd-never-logged"


def cm(name: str, value: str = "v") -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata: {{k: {value}}}\n"


@pytest.fixture
def private_server() -> Iterator[GitServer]:
    with GitServer(username="bot", password=PASSWORD) as server:
        yield server


def repo_object(admin: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    return admin.get(f"{GITREPOS.format(ns=namespace)}/{name}")


def git_repository(namespace: str, name: str, url: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1m", **spec}}


def credentials_secret(admin: KubeClient, namespace: str, password: str) -> None:
    admin.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git-auth"},
        "data": {"username": base64.b64encode(b"bot").decode(),
                 "password": base64.b64encode(password.encode()).decode()}})


def allow_secret_read(admin: KubeClient, namespace: str, account: str) -> None:
    admin.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                  body={"metadata": {"name": account}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    admin.request("POST", f"{rbac}/roles", body={
        "metadata": {"name": "read-git-auth"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["git-auth"],
                   "verbs": ["get"]}]})
    admin.request("POST", f"{rbac}/rolebindings", body={
        "metadata": {"name": "read-git-auth"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-git-auth"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]})


def ready(admin: KubeClient, namespace: str, name: str, status: str, reason: str | None = None
          ) -> Callable[[], Any]:
    def check() -> Any:
        found = condition(repo_object(admin, namespace, name))
        return found if found and found["status"] == status and \
            (reason is None or found["reason"] == reason) else None
    return check


def deploy_and_wait(admin: KubeClient, tenant: Tenant) -> None:
    """A one-stage StageSet ``app`` applying ``./deploy`` of GitRepository ``app``, until Ready."""
    ns = tenant.namespace
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                  "metadata": {"name": "app", "namespace": ns},
                  "spec": {"serviceAccountName": tenant.service_account,
                           "stages": [{"name": "deploy", "sourceRef": {"name": "app"}, "path": "./deploy"}]}})
    wait_for(lambda: (c := condition(stageset(admin, ns, "app"))) and c["status"] == "True",
             what="StageSet Ready")


def test_private_repository_credentials_are_read_as_the_repositorys_service_account(
    controller: ControllerProcess, installed: KubeClient, private_server: GitServer,
    make_namespace: Callable[..., str],
) -> None:
    ns = make_namespace("git")
    url = private_server.create_repo("private", {"app/cm.yaml": cm("x")})
    credentials_secret(installed, ns, PASSWORD)
    allow_secret_read(installed, ns, "git-reader")
    apply(installed, git_repository(ns, "with-sa", url, secretRef={"name": "git-auth"},
                                    serviceAccountName="git-reader"))
    apply(installed, git_repository(ns, "without-sa", url, secretRef={"name": "git-auth"}))

    done = wait_for(ready(installed, ns, "with-sa", "True"), what="with-sa Ready")
    artifact = repo_object(installed, ns, "with-sa")["status"]["artifact"]
    assert artifact["revision"] == f"main@sha1:{private_server.head('private')}"
    assert artifact["digest"].startswith("sha1:")
    assert done["reason"] == "Succeeded"

    # No serviceAccountName: the controller's own identity, which may not read Secrets.
    denied = wait_for(ready(installed, ns, "without-sa", "False", "RBACDenied"),
                      what="without-sa RBACDenied")
    assert "git-auth" in denied["message"]
    assert PASSWORD not in controller.output()


def test_wrong_password_is_reported_without_leaking_it(
    controller: ControllerProcess, installed: KubeClient, private_server: GitServer,
    make_namespace: Callable[..., str],
) -> None:
    ns = make_namespace("gitbad")
    url = private_server.create_repo("private2", {"cm.yaml": cm("x")})
    wrong = "wrong-" + PASSWORD
    credentials_secret(installed, ns, wrong)
    allow_secret_read(installed, ns, "git-reader")
    apply(installed, git_repository(ns, "repo", url, secretRef={"name": "git-auth"},
                                    serviceAccountName="git-reader"))
    failed = wait_for(ready(installed, ns, "repo", "False", "AuthenticationFailed"),
                      what="AuthenticationFailed")
    live = repo_object(installed, ns, "repo")
    assert wrong not in str(live)
    assert wrong not in controller.output()
    assert failed["observedGeneration"] == live["metadata"]["generation"]


def test_new_revision_is_applied_and_a_deleted_branch_keeps_the_last_artifact(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant("revs")
    tenant.bind_cluster_role("edit")
    ns = tenant.namespace
    repo = f"{ns}-app"
    url = git_server.create_repo(repo, {"deploy/cm.yaml": cm("app", "one")})
    git_server.branch(repo, "release")
    apply(installed, git_repository(ns, "app", url, ref={"branch": "release"}))
    deploy_and_wait(installed, tenant)
    configmap = f"/api/v1/namespaces/{ns}/configmaps/app"
    assert installed.get(configmap)["data"] == {"k": "one"}

    # A new commit, and a reconcile request: the new revision reaches the StageSet without its interval.
    second = git_server.commit(repo, {"deploy/cm.yaml": cm("app", "two")}, branch="release")
    now = datetime.datetime.now(datetime.UTC).isoformat()
    installed.request("PATCH", f"{GITREPOS.format(ns=ns)}/app",
                      content_type="application/merge-patch+json",
                      body={"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": now}}})
    wait_for(lambda: installed.get(configmap)["data"] == {"k": "two"}, what="new revision applied")
    wait_for(lambda: stageset(installed, ns, "app")["status"].get("lastAppliedRevision")
             == f"release@sha1:{second}", what="lastAppliedRevision")
    assert repo_object(installed, ns, "app")["status"]["lastHandledReconcileAt"] == now

    # The branch disappears: Ready=False, the artifact and everything applied stay.
    git_server.delete_branch(repo, "release")
    later = datetime.datetime.now(datetime.UTC).isoformat()
    installed.request("PATCH", f"{GITREPOS.format(ns=ns)}/app",
                      content_type="application/merge-patch+json",
                      body={"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": later}}})
    gone = wait_for(ready(installed, ns, "app", "False", "RefNotFound"), what="RefNotFound")
    assert "release" in gone["message"]
    assert repo_object(installed, ns, "app")["status"]["artifact"]["revision"] == f"release@sha1:{second}"
    assert get_or_none(installed, configmap) is not None
    ss = stageset(installed, ns, "app")
    assert condition(ss)["status"] == "True"  # type: ignore[index]


def test_suspended_repository_is_not_fetched(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_namespace: Callable[..., str],
) -> None:
    ns = make_namespace("susp")
    url = git_server.create_repo(f"{ns}-s", {"cm.yaml": cm("x")})
    git_server.reset_log()
    apply(installed, git_repository(ns, "repo", url, suspend=True))
    wait_for(ready(installed, ns, "repo", "False", "Suspended"), what="Suspended")
    assert git_server.fetch_count(f"{ns}-s") == 0
    assert "artifact" not in repo_object(installed, ns, "repo")["status"]


def ssh_secret(admin: KubeClient, namespace: str, *, identity: bytes, known_hosts: bytes) -> None:
    admin.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "git-auth"},
        "data": {"identity": base64.b64encode(identity).decode(),
                 "known_hosts": base64.b64encode(known_hosts).decode()}})


def test_ssh_repository_with_strict_host_key_checking(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer,
    make_namespace: Callable[..., str],
) -> None:
    ns = make_namespace("ssh")
    git_server.create_repo(f"{ns}-ssh", {"cm.yaml": cm("x")})
    with SshServer(git_server.root) as ssh:
        ssh_secret(installed, ns, identity=ssh.identity, known_hosts=ssh.known_hosts)
        allow_secret_read(installed, ns, "git-reader")
        apply(installed, git_repository(ns, "good", ssh.url(f"{ns}-ssh"), secretRef={"name": "git-auth"},
                                        serviceAccountName="git-reader"))
        wait_for(ready(installed, ns, "good", "True"), what="SSH GitRepository Ready")
        revision = repo_object(installed, ns, "good")["status"]["artifact"]["revision"]
        assert revision == f"main@sha1:{git_server.head(f'{ns}-ssh')}"

        # Another host's key in known_hosts: refused, never accepted.
        other = make_namespace("ssh-bad")
        _, stranger = keygen(Path(tempfile.mkdtemp()) / "k", comment="")
        ssh_secret(installed, other, identity=ssh.identity,
                   known_hosts=ssh.known_hosts.split(b" ", 1)[0] + b" " + stranger)
        allow_secret_read(installed, other, "git-reader")
        apply(installed, git_repository(other, "bad", ssh.url(f"{ns}-ssh"),
                                        secretRef={"name": "git-auth"}, serviceAccountName="git-reader"))
        refused = wait_for(ready(installed, other, "bad", "False", "AuthenticationFailed"),
                           what="wrong host key refused")
        assert "host key" in refused["message"].lower()
    assert ssh.identity.decode() not in controller.output()


def test_a_git_server_that_goes_down_prunes_nothing(
    controller: ControllerProcess, installed: KubeClient, make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant("down")
    tenant.bind_cluster_role("edit")
    ns = tenant.namespace
    server = GitServer().start()
    try:
        url = server.create_repo("app", {"deploy/cm.yaml": cm("survivor")})
        apply(installed, git_repository(ns, "app", url))
        deploy_and_wait(installed, tenant)
    finally:
        server.stop()
    installed.request("PATCH", f"{GITREPOS.format(ns=ns)}/app", content_type="application/merge-patch+json",
                      body={"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": "down-1"}}})
    wait_for(ready(installed, ns, "app", "False", "GitOperationFailed"), what="GitOperationFailed")
    installed.request("PATCH", f"/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets/app",
                      content_type="application/merge-patch+json",
                      body={"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": "down-2"}}})
    wait_for(lambda: stageset(installed, ns, "app")["status"].get("lastHandledReconcileAt") == "down-2",
             what="StageSet reconciled while the server is down")
    assert condition(stageset(installed, ns, "app"))["status"] == "True"  # type: ignore[index]
    assert get_or_none(installed, f"/api/v1/namespaces/{ns}/configmaps/survivor") is not None
