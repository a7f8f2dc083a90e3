"""A second, "remote" cluster for ``spec.kubeConfig`` and StageTargets: its kubeconfig as a tenant
would store it (everything inline), and that kubeconfig in a Secret.  The ``remote`` and
``remote_admin`` fixtures (a real control plane per test module) are in ``conftest.py``."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from stageset.envtest import server as envtest
from stageset.kube.client import KubeClient


def inline_kubeconfig(plane: envtest.ControlPlane, **user_extra: object) -> bytes:
    """The remote's admin credentials with everything inline, as a tenant would store them."""
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "prod",
        "clusters": [{"name": "prod", "cluster": {"server": plane.url,
                                                  "certificate-authority-data": b64(plane.pki.ca_cert)}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": b64(plane.pki.admin_cert),
                                             "client-key-data": b64(plane.pki.admin_key), **user_extra}}],
        "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "admin"}}],
    }).encode()


def kubeconfig_secret(admin: KubeClient, namespace: str, name: str, data: bytes) -> None:
    admin.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body={
        "metadata": {"name": name}, "data": {"value": base64.b64encode(data).decode()}})
