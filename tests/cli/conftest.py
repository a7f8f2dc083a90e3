"""CLI fixtures: the controller process and a Git server (from the e2e suite), kubeconfigs for users,
namespaces and bindings to set a test's world up, and shell completion as a shell would ask for it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from stageset.cli.main import main
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from tests.e2e.conftest import controller, controller_args, git_server  # noqa: F401 - fixtures


def run_cli(*args: str, kubeconfig: Path | None = None, env: dict[str, str] | None = None) -> Result:
    """``stageset ARGS`` in-process, as a user's shell would run it (stdout and stderr apart)."""
    environment = {"KUBECONFIG": str(kubeconfig) if kubeconfig else "", **(env or {})}
    return CliRunner().invoke(main, list(args), env=environment, catch_exceptions=False)


def user_kubeconfig(
    admin: KubeClient,
    plane: ControlPlane,
    *,
    namespace: str,
    account: str,
    path: Path,
    context_namespace: str | None = None,
) -> Path:
    """A kubeconfig for ServiceAccount ``namespace/account`` (a token), as a user's would be."""
    admin.apply(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        field_manager="test",
    )
    token = admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        body={"spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    context: dict[str, str] = {"cluster": "local", "user": account}
    if context_namespace:
        context["namespace"] = context_namespace
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "user",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {"server": plane.url, "certificate-authority": str(plane.pki.ca_cert)},
                    }
                ],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "user", "context": context}],
            }
        )
    )
    path.chmod(0o600)
    return path


def namespaces(admin: KubeClient, *names: str) -> None:
    """Create (or keep) the namespaces ``names``."""
    for namespace in names:
        admin.apply(f"/api/v1/namespaces/{namespace}",
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                    field_manager="test")


def bind(admin: KubeClient, namespace: str, name: str, role: str, subject: dict[str, str]) -> None:
    """RoleBinding ``name`` in ``namespace``: the ClusterRole ``role`` for ``subject``."""
    admin.apply(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/{name}",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject],
        },
        field_manager="test",
    )


def viewer_kubeconfig(admin: KubeClient, plane: ControlPlane, *, namespace: str, path: Path) -> Path:
    """A kubeconfig for ServiceAccount ``namespace/viewer``, whose context's namespace is
    ``namespace`` and who may read it (ClusterRole ``view`` there) and nothing else."""
    kubeconfig = user_kubeconfig(admin, plane, namespace=namespace, account="viewer", path=path,
                                 context_namespace=namespace)
    bind(admin, namespace, "viewer-view", "view",
         {"kind": "ServiceAccount", "name": "viewer", "namespace": namespace})
    return kubeconfig


def complete(words: str, *, kubeconfig: Path, protocol: str = "bash") -> list[str]:
    """What the completion script gets back for the line ``words`` (the cursor at its end)."""
    split = words.split(" ")
    env = {
        "_STAGESET_COMPLETE": f"{protocol}_complete",
        "KUBECONFIG": str(kubeconfig),
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(split) - 1) if protocol == "bash" else split[-1],
    }
    result = CliRunner().invoke(main, [], env=env, prog_name="stageset", complete_var="_STAGESET_COMPLETE")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line]  # nothing: one empty line
    if protocol == "bash":
        return sorted(line.partition(",")[2] for line in lines)
    return sorted(line.split("\t")[1] for line in lines)


@pytest.fixture
def no_cluster(tmp_path: Path) -> dict[str, str]:
    """An environment with no kubeconfig anywhere (an empty HOME, no KUBECONFIG, not in a Pod)."""
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}
