"""A vcluster-like fixture: a second apiserver plays the virtual cluster, and :class:`VClusterExport`
writes its kubeconfig into the host cluster as vcluster's ``exportKubeConfig`` does.

What it imitates (vcluster's own behaviour, read from its values):

- The kubeconfig Secret holds it under the key ``config``; its name is ``vc-<name>`` in the
  vcluster's namespace, or each ``additionalSecrets`` entry's name and namespace (the deprecated
  ``secret`` the same, with the top level's properties).
- The server is ``exportKubeConfig.server`` when set, else ``https://localhost:8443`` (vcluster's
  default, unreachable from anywhere but its pod).  A server the values name is a Service address
  in a real cluster; here it stands for the second apiserver, whose loopback URL is written
  instead (the only change the fixture makes to what the values say).
- With ``serviceAccount`` set, vcluster creates that ServiceAccount (namespace default
  ``kube-system``) and, with a ``clusterRole``, a ClusterRoleBinding ``vcluster-sa-<sa>-<ns>`` to
  it inside the virtual cluster, and exports a token of it; without, its admin client certificate.
- The Secret is written by vcluster's own account on the host (here: the host admin impersonating
  ``system:serviceaccount:<vcluster namespace>:vc-<name>``, so the host Role a recipe gives that
  account is what allows it), and only once the virtual cluster is up: :meth:`publish` is called
  by the test when it wants the Secret to appear.
- :meth:`rotate` re-exports with a new credential and makes the old one useless: a new token whose
  predecessor's binding object is deleted (the apiserver then refuses it), or a new client
  certificate whose predecessor's user loses its ClusterRoleBinding (kube-apiserver cannot revoke a
  certificate, so the fixture takes its rights away instead).  A controller that kept the old
  credential fails from then on; one that reconnected does not.

Identity: the host admin (``system:masters``, impersonating vcluster's host account to write the
Secret) and the virtual cluster's admin (creating the export's account and its credentials).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import yaml

from stageset.envtest.certs import issue_client_certificate
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient

DEFAULT_SERVER = "https://localhost:8443"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


@dataclass(frozen=True)
class ExportedSecret:
    namespace: str
    name: str
    properties: dict[str, Any]
    """``server``, ``serviceAccount``, ``context``, ``insecure`` for this Secret."""


@dataclass
class VClusterExport:
    """vcluster ``name`` in host namespace ``namespace``, exporting to the host per ``values``."""

    name: str
    namespace: str
    values: dict[str, Any]
    plane: ControlPlane
    """The virtual cluster."""
    virtual: KubeClient
    """Its admin."""
    host_pool: ClientPool
    generation: int = 0
    _revoke: list[Any] = field(default_factory=list)
    _credentials: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)

    @property
    def host_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:vc-{self.name}"

    def secrets(self) -> list[ExportedSecret]:
        export = self.values.get("exportKubeConfig") or {}
        top = {k: v for k, v in export.items() if k not in ("secret", "additionalSecrets")}
        found = [ExportedSecret(self.namespace, f"vc-{self.name}", top)]
        legacy = export.get("secret") or {}
        if legacy:
            found.append(
                ExportedSecret(
                    legacy.get("namespace") or self.namespace, legacy.get("name") or f"vc-{self.name}", top
                )
            )
        for extra in export.get("additionalSecrets") or []:
            properties = {k: v for k, v in extra.items() if k not in ("name", "namespace")}
            found.append(
                ExportedSecret(
                    extra.get("namespace") or self.namespace,
                    extra.get("name") or f"vc-{self.name}",
                    properties,
                )
            )
        return found

    # -- credentials ------------------------------------------------------------------------------

    def _token(self, account: dict[str, Any]) -> dict[str, Any]:
        sa, ns = account["name"], account.get("namespace") or "kube-system"
        self.virtual.apply(
            f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}},
            field_manager="vcluster",
        )
        if account.get("clusterRole"):
            binding = f"vcluster-sa-{sa}-{ns}"
            self.virtual.apply(
                f"{RBAC}/clusterrolebindings/{binding}",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": binding},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": account["clusterRole"],
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
                },
                field_manager="vcluster",
            )
        # A token bound to an object of its own, so rotating can revoke it (delete the object).
        holder = f"{sa}-export-{self.generation}"
        created = self.virtual.request(
            "POST", f"/api/v1/namespaces/{ns}/secrets", body={"metadata": {"name": holder}, "type": "Opaque"}
        )
        token = self.virtual.request(
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
            body={
                "spec": {
                    "expirationSeconds": 3600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "name": holder,
                        "uid": created["metadata"]["uid"],
                    },
                }
            },
        )["status"]["token"]
        self._revoke.append(lambda: self.virtual.delete(f"/api/v1/namespaces/{ns}/secrets/{holder}"))
        return {"token": token}

    def _certificate(self) -> dict[str, Any]:
        user = f"vcluster-{self.name}-admin-{self.generation}"
        binding = f"vcluster-export-{user}"
        self.virtual.apply(
            f"{RBAC}/clusterrolebindings/{binding}",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            },
            field_manager="vcluster",
        )
        cert, key = issue_client_certificate(self.plane.pki, user=user)
        self._revoke.append(lambda: self.virtual.delete(f"{RBAC}/clusterrolebindings/{binding}"))
        return {
            "client-certificate-data": base64.b64encode(cert).decode(),
            "client-key-data": base64.b64encode(key).decode(),
        }

    def kubeconfig(self, properties: dict[str, Any]) -> bytes:
        server = self.plane.url if properties.get("server") else DEFAULT_SERVER
        account = properties.get("serviceAccount") or {}
        key = (account.get("name"), account.get("namespace"), account.get("clusterRole"))
        if key not in self._credentials:  # one credential per identity and generation, as vcluster
            self._credentials[key] = self._token(account) if account.get("name") else self._certificate()
        user = self._credentials[key]
        context = properties.get("context") or f"vcluster_{self.name}"
        cluster: dict[str, Any] = {"server": server}
        if properties.get("insecure"):
            cluster["insecure-skip-tls-verify"] = True
        else:
            cluster["certificate-authority-data"] = base64.b64encode(
                self.plane.pki.ca_cert.read_bytes()
            ).decode()
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": context,
                "clusters": [{"name": context, "cluster": cluster}],
                "users": [{"name": context, "user": user}],
                "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            }
        ).encode()

    # -- what vcluster does -----------------------------------------------------------------------

    def publish(self) -> list[ExportedSecret]:
        """Write every exported Secret (key ``config``) as vcluster's host account."""
        writer = self.host_pool.client(
            Identity.service_account(namespace=self.namespace, name=f"vc-{self.name}")
        )
        written = self.secrets()
        for secret in written:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret.name, "namespace": secret.namespace},
                "data": {"config": base64.b64encode(self.kubeconfig(secret.properties)).decode()},
            }
            path = f"/api/v1/namespaces/{secret.namespace}/secrets/{secret.name}"
            try:
                current = writer.get(path)
            except ApiError as error:
                if not error.not_found:
                    raise
                writer.request("POST", f"/api/v1/namespaces/{secret.namespace}/secrets", body=body)
            else:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                writer.request("PUT", path, body=body)
        return written

    def rotate(self) -> None:
        """A new credential in every exported Secret; the previous ones stop working."""
        old, self._revoke = self._revoke, []
        self._credentials.clear()
        self.generation += 1
        self.publish()
        for revoke in old:
            revoke()
