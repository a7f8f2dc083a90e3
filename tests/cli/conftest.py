"""CLI fixtures: the controller process and a Git server (from the e2e suite), kubeconfigs for users."""

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


@pytest.fixture
def no_cluster(tmp_path: Path) -> dict[str, str]:
    """An environment with no kubeconfig anywhere (an empty HOME, no KUBECONFIG, not in a Pod)."""
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}
