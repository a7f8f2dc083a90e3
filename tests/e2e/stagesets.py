"""Helpers for e2e tests that drive StageSets from a Git repository they control."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import GITREPOS, STAGESETS, apply, condition, get_or_none, stageset, wait_for
from tests.gitserver import GitServer


def cm(name: str, value: str = "v", *, annotations: dict[str, str] | None = None,
       finalizers: list[str] | None = None, namespace: str | None = None) -> str:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = annotations
    if finalizers:
        meta["finalizers"] = finalizers
    import json

    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": value}})


def deployment(name: str) -> str:
    return f"""\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers: [{{name: app, image: registry.invalid/{name}:1}}]
"""


def poke(admin: KubeClient, path: str) -> str:
    """Ask for a reconcile now, as `flux reconcile` does."""
    stamp = datetime.datetime.now(datetime.UTC).isoformat()
    admin.request("PATCH", path, content_type="application/merge-patch+json",
                  body={"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": stamp}}})
    return stamp


@dataclass
class Scenario:
    """A tenant namespace, a repository, and a GitRepository named ``app`` pointing at it."""

    admin: KubeClient
    git: GitServer
    tenant: Tenant
    repo: str

    @property
    def ns(self) -> str:
        return self.tenant.namespace

    def commit(self, files: dict[str, str | None], *, replace: bool = False) -> str:
        sha = self.git.commit(self.repo, files, replace=replace)
        poke(self.admin, f"{GITREPOS.format(ns=self.ns)}/app")
        return sha

    def stageset(self, name: str, stages: list[dict[str, Any]], **spec: Any) -> None:
        stages = [{"sourceRef": {"name": "app"}, **s} for s in stages]
        apply(self.admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                           "metadata": {"name": name, "namespace": self.ns},
                           "spec": {"serviceAccountName": self.tenant.service_account,
                                    "stages": stages, **spec}})

    def get(self, name: str) -> dict[str, Any]:
        return stageset(self.admin, self.ns, name)

    def path(self, name: str) -> str:
        return f"{STAGESETS.format(ns=self.ns)}/{name}"

    def wait_ready(self, name: str, *, revision: str | None = None, timeout: float = 60) -> dict[str, Any]:
        def check() -> Any:
            obj = self.get(name)
            ready = condition(obj)
            if not ready or ready["status"] != "True" or \
                    ready.get("observedGeneration") != obj["metadata"]["generation"]:
                return None
            if revision and not (obj["status"].get("lastAppliedRevision") or "").endswith(revision):
                return None
            return obj
        return wait_for(check, timeout=timeout, what=f"StageSet {name} Ready at {revision or 'any'}")

    def wait_reason(self, name: str, reason: str, timeout: float = 60) -> dict[str, Any]:
        def check() -> Any:
            ready = condition(self.get(name))
            return ready if ready and ready["reason"] == reason else None
        return wait_for(check, timeout=timeout, what=f"StageSet {name} reason {reason}")

    def configmap(self, name: str) -> dict[str, Any] | None:
        return get_or_none(self.admin, f"/api/v1/namespaces/{self.ns}/configmaps/{name}")


def scenario(admin: KubeClient, git: GitServer, tenant: Tenant, files: dict[str, str],
             *, role: str = "edit") -> Scenario:
    tenant.bind_cluster_role(role)
    repo = f"{tenant.namespace}-repo"
    url = git.create_repo(repo, files)
    apply(admin, {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                  "metadata": {"name": "app", "namespace": tenant.namespace},
                  "spec": {"url": url, "ref": {"branch": "main"}, "interval": "1m"}})
    return Scenario(admin=admin, git=git, tenant=tenant, repo=repo)
