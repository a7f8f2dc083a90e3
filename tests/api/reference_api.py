"""The reference controller's StageSet API, field by field, as its API page documents it.

Written by hand from metio/stageset-controller's ``docs/content/api/stageset.md`` (and, for the
few fields that page leaves out, the comments of its ``api/v1`` types): every field with a value of
the shape the reference documents, and what this controller does with it.  Not derived from our
schema or from the reference's CRD: a field either of them forgot must still show up here.

``refused`` is ``None`` for a field implemented here (the apiserver must store it as sent), else
the path the refusal names.  A field inside a refused object (``actions.pre[].job``) is covered by
its refused parent: the whole object is kept as sent and refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

ANY_OBJECT = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}


@dataclass(frozen=True)
class Field:
    path: str
    """Where the value goes in a minimal StageSet, e.g. ``spec.stages[0].readyChecks.checks``."""
    value: Any
    refused: str | None = None
    """The path a refusal names (``None``: implemented, stored as sent)."""

    @property
    def id(self) -> str:
        return f"{self.path}={self.value!r}"[:80]


def _stage(field: str, value: Any, refused: bool = False) -> Field:
    path = f"spec.stages[0].{field}"
    return Field(path, value, path if refused else None)


FIELDS = [
    # -- scheduling
    Field("spec.interval", "5m"),
    Field("spec.retryInterval", "1m"),
    Field("spec.driftDetectionInterval", "2m"),
    Field("spec.timeout", "15m"),
    Field("spec.onTimeout", "Hold"),
    Field("spec.onTimeout", "Rollback"),
    Field("spec.suspend", True),
    # -- ordering between StageSets
    Field("spec.dependsOn", [{"name": "platform", "namespace": "platform-system"}, {"name": "db"}]),
    Field("spec.dependsOn", [{"name": "db", "minVersion": "5.2.0"}]),
    # -- security and targeting
    Field("spec.serviceAccountName", "payments-deployer"),
    Field("spec.kubeConfig", {"secretRef": {"name": "prod-eu-kubeconfig"}}),
    Field("spec.kubeConfig", {"secretRef": {"name": "prod-eu-kubeconfig", "key": "value"}}),
    Field("spec.kubeConfig", {"configMapRef": {"name": "eks-workload-identity"}}),
    Field("spec.decryption", {"provider": "sops", "secretRef": {"name": "sops-age"}}),
    # -- versioning and migrations
    Field("spec.version", {"fromObject": {"stage": "app", "kind": "Deployment", "name": "web",
                                          "apiVersion": "apps/v1", "fieldPath": "{.data.version}"}},
          "spec.version"),
    Field("spec.version", {"value": "2.1.0"}, "spec.version"),
    Field("spec.version", {"fromArtifact": {"stage": "app", "path": "VERSION"},
                           "requireMigrationCoverage": True, "approvalMode": "Always",
                           "allowDowngrade": True}, "spec.version"),
    Field("spec.migrations", [{"name": "backfill-ledger-2-0", "from": ">=1.0.0, <2.0.0", "to": "2.0.0",
                               "stage": "app", "actions": [{"name": "backfill", "job": {
                                   "sourceRef": {"name": "ledger-backfill-job"}}}],
                               "down": [{"name": "undo", "wait": {"duration": "1s"}}]}],
          "spec.migrations"),
    Field("spec.migrationsSourceRef", {"sourceRef": {"kind": "JsonnetSnippet", "name": "ladder"},
                                       "path": "./"}, "spec.migrationsSourceRef"),
    # -- rollback
    Field("spec.rollbackOnFailure", True),
    Field("spec.rollbackOnFailure", False),
    Field("spec.onRollback", [{"name": "disable-maintenance-mode",
                               "job": {"sourceRef": {"name": "maintenance-off"}}}], "spec.onRollback"),
    # -- update windows
    Field("spec.windowScope", "Updates"),
    Field("spec.windowScope", "All"),
    Field("spec.updateWindows", [
        {"type": "Deny", "schedule": "0 9 * * MON-FRI", "duration": "8h", "timeZone": "Europe/Berlin"},
        {"type": "Deny", "from": "2026-12-24T00:00:00Z", "to": "2026-12-27T00:00:00Z"}]),
    Field("spec.updateWindows", [
        {"type": "Allow", "schedule": "0 14 * * TUE,THU", "duration": "3h", "timeZone": "America/New_York"}]),
    Field("spec.updateWindows", []),
    # -- error budget (the gating pages, and the types)
    Field("spec.errorBudget", {"source": {"prometheus": {"address": "http://prometheus:9090",
                                                         "query": "slo:budget:ratio"}},
                               "freezeThreshold": "0", "resumeThreshold": "0.05", "interval": "5m",
                               "onSourceError": "Hold", "dryRun": True}, "spec.errorBudget"),
    # -- stages
    _stage("name", "app"),
    _stage("sourceRef", {"name": "my-app"}),
    _stage("sourceRef", {"name": "my-app", "kind": "ExternalArtifact",
                         "apiVersion": "source.toolkit.fluxcd.io/v1", "namespace": "other-ns"}),
    _stage("sourceRef", {"name": "my-app", "kind": "JsonnetSnippet", "apiVersion": "jaas.metio.wtf/v1"}),
    _stage("sourceRef", {"name": "my-app", "kind": "OCIRepository"}),
    _stage("path", "./overlays/prod"),
    _stage("serviceAccountName", "payments-eu-deployer"),
    _stage("prune", False),
    _stage("timeout", "3m"),
    _stage("onTimeout", "Hold"),
    _stage("onTimeout", "Rollback"),
    _stage("force", True),
    _stage("applyHelmHookResources", True),
    _stage("applyHelmHookResources", False, refused=True),
    _stage("migrationAnchor", "db-pre", refused=True),
    _stage("patches", []),
    _stage("patches", [{"patch": "- op: replace\n  path: /spec/replicas\n  value: 6\n",
                        "target": {"kind": "Deployment", "name": "web"}}]),
    _stage("patches", [{"patch": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
                        "target": {"group": "apps", "version": "v1", "kind": "Deployment", "name": "web",
                                   "namespace": "prod", "labelSelector": "app=web",
                                   "annotationSelector": "team=payments"}}]),
    _stage("conflictPolicy", {}),
    _stage("conflictPolicy", {"default": "Fail", "rules": [
        {"target": {"apiVersion": "batch/v1", "kind": "Job"}, "action": "Recreate"},
        {"target": {"kind": "PersistentVolumeClaim", "name": "scratch"}, "action": "Recreate",
         "allowDataLoss": True},
        {"target": {"name": "migrate", "namespace": "db"}, "action": "KeepExisting"}]}),
    _stage("postBuild", {}),
    _stage("postBuild", {"substitute": {"cluster_name": "prod-eu"}, "substituteFrom": [
        {"kind": "ConfigMap", "name": "cluster-vars"},
        {"kind": "Secret", "name": "cluster-secrets", "optional": True}]}),
    _stage("readyChecks", {}),
    _stage("readyChecks", {"timeout": "20m", "disableWait": False}),
    _stage("readyChecks", {"checks": [
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "name": "ledgers.example"},
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ledger-operator",
         "namespace": "platform-system"},
        {"kind": "Namespace", "name": "payments"}]}),
    _stage("readyChecks", {"exprs": [{"apiVersion": "db.example/v1", "kind": "Database",
                                      "current": "status.phase == 'Running'",
                                      "inProgress": "status.phase in ['Pending','Provisioning']",
                                      "failed": "status.phase == 'Failed'"}]}),
    _stage("readyChecks", {"exprs": [{"apiVersion": "db.example/v1", "kind": "Database",
                                      "failed": "status.phase == 'Failed'"}]}),
    _stage("readyChecks", {"disableWait": True}),
    _stage("actions", {}),
    _stage("actions", {
        "pre": [{"name": "db-migrate", "timeout": "10m", "retries": 2, "scope": "Revision",
                 "job": {"sourceRef": {"name": "my-app-migrations"}, "path": "./jobs"}}],
        "post": [{"name": "smoke-test", "http": {
            "url": "https://my-app.internal/healthz", "method": "GET", "expectedStatus": [200],
            "headersFrom": [{"name": "gate-token", "key": "token"}]}}],
        "onFailure": [{"name": "page-oncall", "http": {"url": "https://alerts.internal/failed"}}]}),
    Field("spec.stages[0].actions", {"pre": [
        {"name": "enable-traffic", "patch": {"target": {"apiVersion": "v1", "kind": "Service", "name": "web"},
                                             "type": "merge", "patch": '{"spec": {}}'}},
        {"name": "approve", "http": {"url": "https://gate.internal/approve",
                                     "bodyFrom": {"name": "approve-secret", "key": "body"}}},
        {"name": "settle", "wait": {"duration": "30s"}},
        {"name": "until-available", "wait": {"target": ANY_OBJECT, "expr": "status.availableReplicas >= 3",
                                             "timeout": "5m"}},
        {"name": "drop-legacy", "delete": {"target": {"apiVersion": "batch/v1", "kind": "Job",
                                                      "name": "legacy-migration"}, "cascade": "Foreground"}},
        {"name": "canary", "apply": {"sourceRef": {"name": "my-app-canary"}, "path": "./", "wait": True},
         "completionAnchor": ANY_OBJECT}]}, "spec.stages[0].actions.pre[5].completionAnchor"),
    Field("spec.stages[0].actions", {"pre": [{"name": "db-upgrade", "scope": "Version",
                                              "wait": {"duration": "1s"}}]},
          "spec.stages[0].actions.pre[0].scope"),
    Field("spec.stages[0].actions", {"pre": [{"name": "install", "scope": "Lifetime",
                                              "wait": {"duration": "1s"}}]},
          "spec.stages[0].actions.pre[0].scope"),
    Field("spec.stages[0].actions", {"post": [{"name": "purge", "scope": "Version",
                                               "wait": {"duration": "1s"}}]},
          "spec.stages[0].actions.post[0].scope"),
    Field("spec.stages[0].actions", {"post": [{"name": "install-db", "scope": "Lifetime",
                                               "job": {"sourceRef": {"name": "install-db"}}}]},
          "spec.stages[0].actions.post[0].scope"),
    Field("spec.stages[0].actions", {"post": [{"name": "smoke", "scope": "Revision",
                                               "http": {"url": "https://app.internal/healthz"}}]}),
    Field("spec.stages[0].actions", {"post": [{"name": "install-db", "completionAnchor": {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "db"}, "wait": {"duration": "1s"}}]},
          "spec.stages[0].actions.post[0].completionAnchor"),
    Field("spec.stages[0].actions", {"onFailure": [{"name": "page", "scope": "Revision",
                                                    "http": {"url": "https://alerts.internal/x"}}]},
          "spec.stages[0].actions.onFailure[0].scope"),
    Field("spec.stages[0].actions", {"onFailure": [{"name": "page", "completionAnchor": ANY_OBJECT,
                                                    "http": {"url": "https://alerts.internal/x"}}]},
          "spec.stages[0].actions.onFailure[0].completionAnchor"),
    _stage("promotion", {"soak": "10m"}),
    _stage("promotion", {"requireManualPromotion": True}),
    _stage("promotion", {"soak": "30m", "requireManualPromotion": True}),
    _stage("promotion.analysis", {
        "checks": [{"name": "error-rate", "source": {"prometheus": {"address": "http://p:9090",
                                                                   "query": "rate(x[1m])"}},
                    "threshold": {"max": "0.01"}}], "interval": "1m", "failureLimit": 2,
        "onFailure": "Rollback", "onSourceError": "Hold", "dryRun": True}, refused=True),
    _stage("promotion.fastTrack", {"source": {"prometheus": {"address": "http://p:9090", "query": "q"}},
                                   "max": "0", "after": "5m"}, refused=True),
    _stage("promotion.restartGate", {"onFailure": "Hold", "checks": [{"name": "pods", "selector": {
        "matchLabels": {"app": "web"}}, "maxRestarts": 3}]}, refused=True),
    _stage("promotion.eventGate", {"checks": [{"name": "oom", "selector": {"matchLabels": {"app": "web"}},
                                               "reasons": ["OOMKilling"], "maxEvents": 1}]}, refused=True),
    _stage("errorBudget", {"source": {"prometheus": {"address": "http://p:9090", "query": "q"}},
                           "freezeThreshold": "0.1"}, refused=True),
]


_STEP = re.compile(r"([A-Za-z]+)(?:\[(\d+)\])?")


def put(body: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` (``spec.stages[0].readyChecks``) in ``body``, creating what is missing."""
    steps = path.split(".")
    current: Any = body
    for number, step in enumerate(steps):
        match = _STEP.fullmatch(step)
        assert match is not None, step
        key, index = match.group(1), match.group(2)
        last = number == len(steps) - 1
        if index is None:
            if last:
                current[key] = value
            else:
                current = current.setdefault(key, {})
            continue
        items = current.setdefault(key, [])
        while len(items) <= int(index):
            items.append({})
        if last:
            items[int(index)] = value
        else:
            current = items[int(index)]


def get(body: Any, path: str) -> Any:
    current = body
    for step in path.split("."):
        match = _STEP.fullmatch(step)
        assert match is not None, step
        current = current[match.group(1)]
        if match.group(2) is not None:
            current = current[int(match.group(2))]
    return current


def kept(sent: Any, stored: Any) -> bool:
    """Whether everything ``sent`` holds is in ``stored`` as sent (the apiserver may add defaults)."""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(k in stored and kept(v, stored[k]) for k, v in sent.items())
    if isinstance(sent, list):
        return isinstance(stored, list) and len(sent) == len(stored) and all(
            kept(a, b) for a, b in zip(sent, stored, strict=True))
    return bool(sent == stored)
