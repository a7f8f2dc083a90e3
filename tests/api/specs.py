"""Specs shared by the model unit tests and the admission tests.

One table of invalid specs is run twice: against the pydantic models (no cluster)
and against a real kube-apiserver with our CRDs installed.  Both must refuse every
entry, which keeps the CRD's CEL rules and the reconciler's re-check in step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The StageSets of DESIGN.md ("must work verbatim"), copied character for character.
DESIGN_STAGESETS = Path(__file__).with_name("design-stagesets.yaml")
# The documented example of dependsOn on other kinds (examples/dependencies/).
DEPENDENCIES_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dependencies" / "stageset.yaml"


def example_stageset(path: Path) -> dict[str, Any]:
    """The StageSet of an example file, without its namespace (the tests choose theirs)."""
    documents = yaml.safe_load_all(path.read_text(encoding="utf-8"))
    found = next(d for d in documents if d and d["kind"] == "StageSet")
    found["metadata"].pop("namespace", None)
    return dict(found)

PLURALS = {"StageSet": "stagesets", "GitRepository": "gitrepositories"}


def design_stagesets() -> list[dict[str, Any]]:
    """Fresh copies of the DESIGN.md StageSets."""
    return list(yaml.safe_load_all(DESIGN_STAGESETS.read_text(encoding="utf-8")))


def stage(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "sourceRef": {"name": "repo"}, **fields}


def stageset(spec: dict[str, Any] | None, *, name: str = "subject") -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                            "metadata": {"name": name}}
    if spec is not None:
        body["spec"] = spec
    return body


def gitrepository(spec: dict[str, Any], *, name: str = "subject") -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
            "metadata": {"name": name}, "spec": spec}


@dataclass(frozen=True)
class Invalid:
    """A spec both the apiserver and the models must refuse.

    ``field`` is the path the apiserver reports (``details.causes[].field``);
    ``message`` a substring of its message.
    """

    id: str
    body: dict[str, Any]
    field: str
    message: str

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    def fresh(self) -> dict[str, Any]:
        return copy.deepcopy(self.body)


def actions(value: dict[str, Any]) -> dict[str, Any]:
    """A StageSet whose one stage has ``actions: value``."""
    return stageset({"stages": [stage("app", actions=value)]})


SHA = "0123456789abcdef0123456789abcdef01234567"
HTTPS = "https://git.example.com/org/repo.git"

INVALID = [
    # StageSet: the stage graph
    Invalid("duplicate-stage-names",
            stageset({"stages": [stage("app"), stage("db"), stage("app")]}),
            "spec.stages", 'stage name "app" is used more than once; stage names must be unique'),
    Invalid("depends-on-unknown-stage",
            stageset({"stages": [stage("db"), stage("app", dependsOn=["db", "cache"])]}),
            "spec.stages", 'stage "app" depends on a stage that is not in this StageSet'),
    Invalid("depends-on-itself",
            stageset({"stages": [stage("db"), stage("app", dependsOn=["app"])]}),
            "spec.stages[1].dependsOn", 'stage "app" may not depend on itself'),
    Invalid("depends-on-listed-twice",
            stageset({"stages": [stage("db"), stage("app", dependsOn=["db", "db"])]}),
            "spec.stages[1].dependsOn[1]", 'Duplicate value: "db"'),
    Invalid("stage-name-not-dns-label",
            stageset({"stages": [stage("Payments_App")]}),
            "spec.stages[0].name", "should match"),
    Invalid("stage-name-too-long",
            stageset({"stages": [stage("a" * 64)]}),
            "spec.stages[0].name", "may not be more than 63"),
    Invalid("no-stages",
            stageset({"stages": []}),
            "spec.stages", "should have at least 1 items"),
    Invalid("too-many-stages",
            stageset({"stages": [stage(f"s{i}") for i in range(65)]}),
            "spec.stages", "must have at most 64 items"),
    Invalid("stage-without-source",
            stageset({"stages": [{"name": "app"}]}),
            "spec.stages[0].sourceRef", "Required value"),
    Invalid("no-spec",
            stageset(None),
            "spec", "Required value"),
    # StageSet: references and durations
    Invalid("kubeconfig-secret-without-name",
            stageset({"kubeConfig": {"secretRef": {"key": "config"}}, "stages": [stage("app")]}),
            "spec.kubeConfig.secretRef.name", "Required value"),
    Invalid("kubeconfig-without-secret",
            stageset({"kubeConfig": {}, "stages": [stage("app")]}),
            "spec.kubeConfig.secretRef", "Required value"),
    Invalid("kubeconfig-secret-and-configmap",
            stageset({"kubeConfig": {"secretRef": {"name": "kc"}, "configMapRef": {"name": "wi"}},
                      "stages": [stage("app")]}),
            "spec.kubeConfig.secretRef", "exactly one of secretRef"),
    Invalid("kubeconfig-configmap-without-name",
            stageset({"kubeConfig": {"configMapRef": {}}, "stages": [stage("app")]}),
            "spec.kubeConfig.configMapRef.name", "Required value"),
    Invalid("kubeconfig-and-target-ref",
            stageset({"kubeConfig": {"secretRef": {"name": "kc"}},
                      "targetRef": {"name": "prod", "namespace": "platform"}, "stages": [stage("app")]}),
            "spec.targetRef", "kubeConfig and targetRef are exclusive"),
    Invalid("target-ref-without-namespace",
            stageset({"targetRef": {"name": "prod"}, "stages": [stage("app")]}),
            "spec.targetRef.namespace", "Required value"),
    Invalid("decryption-key-secret-in-another-namespace",
            stageset({"decryption": {"provider": "sops", "secretRef": {"name": "keys", "namespace": "other"}},
                      "stages": [stage("app")]}),
            "spec.decryption.secretRef.namespace",
            "the key Secret is always read from the StageSet's own namespace"),
    Invalid("decryption-without-key-secret",
            stageset({"decryption": {"provider": "sops"}, "stages": [stage("app")]}),
            "spec.decryption.secretRef", "cloud KMS keys are not supported"),
    Invalid("decryption-unknown-provider",
            stageset({"decryption": {"provider": "vault", "secretRef": {"name": "keys"}},
                      "stages": [stage("app")]}),
            "spec.decryption.provider", "Unsupported value"),
    Invalid("service-account-not-dns-name",
            stageset({"serviceAccountName": "Payments Deployer", "stages": [stage("app")]}),
            "spec.serviceAccountName", "should match"),
    Invalid("depends-on-stageset-without-name",
            stageset({"dependsOn": [{"namespace": "infra"}], "stages": [stage("app")]}),
            "spec.dependsOn[0].name", "Required value"),
    Invalid("interval-not-go-duration",
            stageset({"interval": "10 minutes", "stages": [stage("app")]}),
            "spec.interval", "should match"),
    Invalid("stage-timeout-without-unit",
            stageset({"stages": [stage("app", timeout="30")]}),
            "spec.stages[0].timeout", "should match"),
    Invalid("retry-interval-in-days",
            stageset({"retryInterval": "1d", "stages": [stage("app")]}),
            "spec.retryInterval", "should match"),
    Invalid("substitute-from-pod",
            stageset({"stages": [stage("app", postBuild={
                "substituteFrom": [{"kind": "Pod", "name": "vars"}]})]}),
            "spec.stages[0].postBuild.substituteFrom[0].kind", 'Unsupported value: "Pod"'),
    # StageSet: patches
    Invalid("patch-with-both-forms",
            stageset({"stages": [stage("app", patches=[{
                "patch": "kind: Deployment", "json6902": [{"op": "remove", "path": "/spec"}],
                "target": {"kind": "Deployment"}}])]}),
            "spec.stages[0].patches[0]", "a patch needs exactly one of patch and json6902"),
    Invalid("patch-with-neither-form",
            stageset({"stages": [stage("app", patches=[{"target": {"kind": "Deployment"}}])]}),
            "spec.stages[0].patches[0]", "a patch needs exactly one of patch and json6902"),
    Invalid("json6902-without-target",
            stageset({"stages": [stage("app", patches=[{
                "json6902": [{"op": "remove", "path": "/spec/replicas"}]}])]}),
            "spec.stages[0].patches[0]", "a json6902 patch needs a target"),
    Invalid("json6902-unknown-op",
            stageset({"stages": [stage("app", patches=[{
                "json6902": [{"op": "merge", "path": "/spec"}], "target": {"kind": "Deployment"}}])]}),
            "spec.stages[0].patches[0].json6902[0].op", 'Unsupported value: "merge"'),
    Invalid("json6902-move-without-from",
            stageset({"stages": [stage("app", patches=[{
                "json6902": [{"op": "move", "path": "/spec/a"}], "target": {"kind": "Deployment"}}])]}),
            "spec.stages[0].patches[0].json6902[0]", "move and copy operations need from"),
    # StageSet: conflict policies
    Invalid("conflict-unknown-action",
            stageset({"stages": [stage("app", conflictPolicy={"default": "Overwrite"})]}),
            "spec.stages[0].conflictPolicy.default", 'Unsupported value: "Overwrite"'),
    Invalid("conflict-recreate-pvc-without-allow-data-loss",
            stageset({"stages": [stage("app", conflictPolicy={
                "rules": [{"target": {"kind": "PersistentVolumeClaim"}, "action": "Recreate"}]})]}),
            "spec.stages[0].conflictPolicy.rules[0]", "set allowDataLoss: true"),
    Invalid("force-with-conflict-default-fail",
            stageset({"stages": [stage("app", force=True, conflictPolicy={"default": "Fail"})]}),
            "spec.stages[0].conflictPolicy.default", "force: true means conflictPolicy.default: Recreate"),
    Invalid("preflight-unknown",
            stageset({"stages": [stage("app", preflight="None")]}),
            "spec.stages[0].preflight", 'Unsupported value: "None"'),
    # StageSet: readiness and timeouts
    Invalid("on-timeout-unknown",
            stageset({"onTimeout": "Retry", "stages": [stage("app")]}),
            "spec.onTimeout", 'Unsupported value: "Retry"'),
    Invalid("ready-checks-and-their-old-name",
            stageset({"stages": [stage("app", readyChecks={
                "checks": [{"kind": "Namespace", "name": "a"}],
                "objects": [{"apiVersion": "v1", "kind": "Namespace", "name": "b"}]})]}),
            "spec.stages[0].readyChecks.objects",
            "readyChecks.objects is the old name of readyChecks.checks; set only checks"),
    Invalid("ready-check-without-kind",
            stageset({"stages": [stage("app", readyChecks={"checks": [{"name": "a"}]})]}),
            "spec.stages[0].readyChecks.checks[0].kind", "Required value"),
    Invalid("health-exprs-same-kind-twice",
            stageset({"stages": [stage("app", readyChecks={"exprs": [
                {"apiVersion": "example.com/v1", "kind": "Widget", "current": "true"},
                {"apiVersion": "example.com/v1", "kind": "Widget", "current": "false"}]})]}),
            "spec.stages[0].readyChecks.exprs", "may name each apiVersion and kind only once"),
    Invalid("ready-timeout-not-duration",
            stageset({"stages": [stage("app", readyChecks={"timeout": "soon"})]}),
            "spec.stages[0].readyChecks.timeout", "should match"),
    Invalid("drift-detection-interval-not-duration",
            stageset({"driftDetectionInterval": "often", "stages": [stage("app")]}),
            "spec.driftDetectionInterval", "should match"),
    # Drift by watch (issue 45): Correct or Warn, nothing else.
    Invalid("drift-detection-mode-unknown",
            stageset({"driftDetection": {"mode": "Ignore"}, "stages": [stage("app")]}),
            "spec.driftDetection.mode", 'Unsupported value: "Ignore"'),
    # StageSet: steering a release (issue 21)
    Invalid("window-both-forms",
            stageset({"updateWindows": [{"type": "Deny", "schedule": "0 9 * * *", "duration": "1h",
                                         "from": "2030-01-01T00:00:00Z", "to": "2030-01-02T00:00:00Z"}],
                      "stages": [stage("app")]}),
            "spec.updateWindows[0]", "either recurring (schedule and duration) or absolute (from and to)"),
    Invalid("window-neither-form",
            stageset({"updateWindows": [{"type": "Allow"}], "stages": [stage("app")]}),
            "spec.updateWindows[0]", "either recurring (schedule and duration) or absolute (from and to)"),
    Invalid("window-schedule-without-duration",
            stageset({"updateWindows": [{"type": "Deny", "schedule": "0 18 * * FRI"}],
                      "stages": [stage("app")]}),
            "spec.updateWindows[0].duration", "a recurring update window needs duration"),
    Invalid("window-schedule-not-cron",
            stageset({"updateWindows": [{"type": "Deny", "schedule": "every friday", "duration": "1h"}],
                      "stages": [stage("app")]}),
            "spec.updateWindows[0].schedule", "schedule must be a 5-field cron expression"),
    Invalid("window-time-zone-not-iana",
            stageset({"updateWindows": [{"type": "Deny", "schedule": "0 18 * * FRI", "duration": "1h",
                                         "timeZone": "CET +1"}], "stages": [stage("app")]}),
            "spec.updateWindows[0].timeZone", "timeZone must be an IANA time zone name"),
    Invalid("window-ends-before-it-starts",
            stageset({"updateWindows": [{"type": "Deny", "from": "2030-01-02T00:00:00Z",
                                         "to": "2030-01-01T00:00:00Z"}], "stages": [stage("app")]}),
            "spec.updateWindows[0].to", "an absolute update window's to must be after its from"),
    Invalid("window-from-without-to",
            stageset({"updateWindows": [{"type": "Deny", "from": "2030-01-02T00:00:00Z"}],
                      "stages": [stage("app")]}),
            "spec.updateWindows[0]", "an absolute update window needs both from and to"),
    Invalid("window-unknown-type",
            stageset({"updateWindows": [{"type": "Freeze", "from": "2030-01-01T00:00:00Z",
                                         "to": "2030-01-02T00:00:00Z"}], "stages": [stage("app")]}),
            "spec.updateWindows[0].type", 'Unsupported value: "Freeze"'),
    Invalid("window-scope-unknown",
            stageset({"windowScope": "Drift", "stages": [stage("app")]}),
            "spec.windowScope", 'Unsupported value: "Drift"'),
    Invalid("min-version-not-semver",
            stageset({"dependsOn": [{"name": "db", "minVersion": "latest"}], "stages": [stage("app")]}),
            "spec.dependsOn[0].minVersion", "minVersion must be a semantic version"),
    Invalid("depends-on-kind-without-api-version",
            stageset({"dependsOn": [{"kind": "Database", "name": "db"}], "stages": [stage("app")]}),
            "spec.dependsOn[0].kind", "set apiVersion and kind together"),
    Invalid("depends-on-api-version-without-kind",
            stageset({"dependsOn": [{"apiVersion": "db.example/v1", "name": "db"}],
                      "stages": [stage("app")]}),
            "spec.dependsOn[0].kind", "set apiVersion and kind together"),
    Invalid("depends-on-min-version-of-another-kind",
            stageset({"dependsOn": [{"apiVersion": "db.example/v1", "kind": "Database", "name": "db",
                                     "minVersion": "1.0.0"}], "stages": [stage("app")]}),
            "spec.dependsOn[0].minVersion", "minVersion applies to StageSet dependencies only"),
    Invalid("depends-on-ready-expr-of-a-stageset",
            stageset({"dependsOn": [{"name": "db", "readyExpr": "true"}], "stages": [stage("app")]}),
            "spec.dependsOn[0].readyExpr", "readyExpr applies to dependencies of other kinds"),
    Invalid("depends-on-ready-expr-of-a-named-stageset",
            stageset({"dependsOn": [{"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "name": "db",
                                     "readyExpr": "true"}], "stages": [stage("app")]}),
            "spec.dependsOn[0].readyExpr", "readyExpr applies to dependencies of other kinds"),
    Invalid("depends-on-kind-not-a-kind",
            stageset({"dependsOn": [{"apiVersion": "db.example/v1", "kind": "data-base", "name": "db"}],
                      "stages": [stage("app")]}),
            "spec.dependsOn[0].kind", "should match"),
    Invalid("depends-on-api-version-with-a-slash-too-many",
            stageset({"dependsOn": [{"apiVersion": "db.example/v1/x", "kind": "Database", "name": "db"}],
                      "stages": [stage("app")]}),
            "spec.dependsOn[0].apiVersion", "should match"),
    Invalid("soak-not-duration",
            stageset({"stages": [stage("app", promotion={"soak": "an hour"})]}),
            "spec.stages[0].promotion.soak", "should match"),
    Invalid("promotion-analysis",
            stageset({"stages": [stage("app", promotion={"soak": "1m", "analysis": {"checks": []}})]}),
            "spec.stages[0].promotion.analysis", "analysis (holding a stage while metric checks"),
    # GitRepository
    Invalid("git-url-ftp",
            gitrepository({"url": "ftp://git.example.com/repo.git"}),
            "spec.url", "url must start with https://, http://, ssh:// or file://"),
    Invalid("git-url-bare-path",
            gitrepository({"url": "/srv/git/repo.git"}),
            "spec.url", "or be scp-like user@host:path"),
    Invalid("git-url-missing",
            gitrepository({"interval": "1m"}),
            "spec.url", "Required value"),
    Invalid("git-branch-and-tag",
            gitrepository({"url": HTTPS, "ref": {"branch": "main", "tag": "v1.0.0"}}),
            "spec.ref", "at most one of branch, tag, semver and name may be set"),
    Invalid("git-semver-and-name",
            gitrepository({"url": HTTPS, "ref": {"semver": ">=1.0", "name": "refs/heads/main"}}),
            "spec.ref", "at most one of branch, tag, semver and name may be set"),
    Invalid("git-commit-with-tag",
            gitrepository({"url": HTTPS, "ref": {"tag": "v1.0.0", "commit": SHA}}),
            "spec.ref.commit", "commit may only be set alone or together with branch"),
    Invalid("git-short-commit",
            gitrepository({"url": HTTPS, "ref": {"commit": "0123abc"}}),
            "spec.ref.commit", "should match"),
    Invalid("git-timeout-not-duration",
            gitrepository({"url": HTTPS, "timeout": "sixty seconds"}),
            "spec.timeout", "should match"),
    Invalid("git-timeout-over-the-bound",
            gitrepository({"url": HTTPS, "timeout": "5m0.5s"}),
            "spec.timeout", "timeout must be at most 5m"),
    Invalid("git-timeout-hours",
            gitrepository({"url": HTTPS, "timeout": "1h"}),
            "spec.timeout", "timeout must be at most 5m"),
    # StageSet: actions
    Invalid("action-with-two-verbs",
            actions({"pre": [{"name": "both", "wait": {"duration": "1s"}, "http": {"url": "https://x.example/"}}]}),
            "spec.stages[0].actions.pre[0]", 'action "both" needs exactly one of job, http, wait, patch'),
    Invalid("action-without-verb",
            actions({"post": [{"name": "nothing"}]}),
            "spec.stages[0].actions.post[0]", 'action "nothing" needs exactly one of job, http, wait, patch'),
    Invalid("action-names-repeated",
            actions({"pre": [{"name": "a", "wait": {"duration": "1s"}},
                              {"name": "a", "wait": {"duration": "2s"}}]}),
            "spec.stages[0].actions.pre", 'action name "a" is used more than once in pre'),
    Invalid("action-name-in-pre-and-post",
            actions({"pre": [{"name": "a", "wait": {"duration": "1s"}}], "post": [{"name": "a", "wait": {
                "duration": "1s"}}]}),
            "spec.stages[0].actions", "an action name may be used in pre or in post, not both"),
    Invalid("wait-duration-and-expr",
            actions({"pre": [{"name": "w", "wait": {"duration": "1s", "expr": "true", "target": {
                "kind": "ConfigMap", "name": "x"}}}]}),
            "spec.stages[0].actions.pre[0].wait", "a wait needs exactly one of duration and expr"),
    Invalid("wait-expr-without-target",
            actions({"pre": [{"name": "w", "wait": {"expr": "true"}}]}),
            "spec.stages[0].actions.pre[0].wait", "expr needs a target"),
    Invalid("patch-name-and-selector",
            actions({"post": [{"name": "p", "patch": {"patch": "{}", "target": {
                "kind": "ConfigMap", "name": "x", "selector": {"matchLabels": {"a": "b"}}}}}]}),
            "spec.stages[0].actions.post[0].patch.target",
            "a patch target needs exactly one of name and selector"),
    Invalid("patch-empty-selector",
            actions({"post": [{"name": "p", "patch": {"patch": "{}", "target": {"kind": "ConfigMap",
                                                                               "selector": {}}}}]}),
            "spec.stages[0].actions.post[0].patch.target.selector",
            "an empty selector would patch every object"),
    Invalid("http-body-and-body-from",
            actions({"post": [{"name": "h", "http": {"url": "https://x.example/", "body": "{}",
                                                     "bodyFrom": {"name": "s", "key": "k"}}}]}),
            "spec.stages[0].actions.post[0].http", "set body or bodyFrom, not both"),
    Invalid("http-credentials-in-url",
            actions({"post": [{"name": "h", "http": {"url": "https://user:pw@x.example/"}}]}),
            "spec.stages[0].actions.post[0].http.url", "the URL may not carry credentials"),
    Invalid("http-host-header-from-secret",
            actions({"post": [{"name": "h", "http": {"url": "https://x.example/", "headersFrom": [
                {"name": "s", "key": "Host"}]}}]}),
            "spec.stages[0].actions.post[0].http.headersFrom[0].key", "are set by the controller"),
    Invalid("http-not-http",
            actions({"post": [{"name": "h", "http": {"url": "file:///etc/passwd"}}]}),
            "spec.stages[0].actions.post[0].http.url", "should match"),
    # spec.supersedes (issue 46): each StageSet once, at most 16.
    Invalid("supersedes-names-one-twice",
            stageset({"supersedes": [{"namespace": "team-a", "name": "app"}, {"name": "web"},
                                     {"namespace": "team-a", "name": "app"}], "stages": [stage("app")]}),
            "spec.supersedes", "supersedes names a StageSet more than once"),
    Invalid("supersedes-too-many",
            stageset({"supersedes": [{"name": f"s{i}"} for i in range(17)], "stages": [stage("app")]}),
            "spec.supersedes", "must have at most 16 items"),
    Invalid("supersedes-without-name",
            stageset({"supersedes": [{"namespace": "team-a"}], "stages": [stage("app")]}),
            "spec.supersedes[0].name", "Required value"),
    Invalid("action-retries-over-the-bound",
            actions({"post": [{"name": "h", "retries": 101, "http": {"url": "https://x.example/"}}]}),
            "spec.stages[0].actions.post[0].retries", "less than or equal to 100"),
]



# Specs both sides must accept, beyond the DESIGN.md ones.
VALID = {
    "every-action": actions({
        "pre": [{"name": "migrate", "timeout": "10m", "retries": 2,
                 "job": {"sourceRef": {"name": "migrations"}, "path": "./jobs"}},
                {"name": "orphan", "delete": {"target": {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                         "name": "web"}, "cascade": "Orphan"}},
                {"name": "maintenance", "apply": {"sourceRef": {"kind": "OCIRepository", "name": "page"},
                                                  "wait": True}}],
        "post": [{"name": "smoke", "http": {"url": "https://app.internal/healthz", "method": "GET",
                                            "expectedStatus": [200, 204],
                                            "headersFrom": [{"name": "token", "key": "Authorization"}]}},
                 {"name": "settle", "wait": {"duration": "30s"}},
                 {"name": "available", "wait": {"target": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                           "name": "web"},
                                                "expr": "status.availableReplicas >= 3", "timeout": "5m"}},
                 {"name": "traffic", "patch": {"target": {"kind": "Service", "name": "web"},
                                               "patch": "spec: {selector: {release: green}}"}},
                 {"name": "grow", "patch": {"type": "json6902", "target": {
                     "kind": "PersistentVolumeClaim", "selector": {
                         "matchLabels": {"app": "web"},
                         "matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]}},
                     "patch": '[{"op": "replace", "path": "/spec/resources/requests/storage", '
                              '"value": "9Gi"}]'}}],
        "onFailure": [{"name": "page", "http": {"url": "https://alerts.internal/x",
                                                "bodyFrom": {"name": "alert", "key": "body"}}}]}),
    # The same name in two namespaces, and one in this StageSet's own (namespace left out).
    "supersedes": stageset({"targetNamespace": "team-a", "supersedes": [
        {"namespace": "team-a", "name": "app"}, {"namespace": "team-b", "name": "app"}, {"name": "app"}],
        "stages": [stage("app")]}),
    "fan-out-and-in": stageset({"stages": [
        stage("crds"),
        stage("operator", dependsOn=["crds"]),
        stage("db", dependsOn=["crds"]),
        stage("app", dependsOn=["operator", "db"]),
        stage("independent", dependsOn=[]),
    ]}),
    "every-field": stageset({
        "dependsOn": [{"name": "infra", "namespace": "platform"}, {"name": "policies"}],
        "serviceAccountName": "deployer",
        "kubeConfig": {"secretRef": {"name": "remote", "key": "config"}},
        "decryption": {"provider": "sops", "secretRef": {"name": "sops-keys"}},
        "interval": "1h30m", "retryInterval": "45s", "timeout": "2.5m", "suspend": True,
        "stages": [stage(
            "app", path="./deploy/prod", serviceAccountName="app-deployer", prune=False,
            timeout="500ms", force=True,
            sourceRef={"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                       "name": "app", "namespace": "sources"},
            postBuild={"substitute": {"cluster_name": "prod-eu"},
                       "substituteFrom": [{"kind": "ConfigMap", "name": "vars"},
                                          {"kind": "Secret", "name": "tokens", "optional": True}]},
            readyChecks={"wait": False, "objects": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api", "namespace": "x"}]},
        )],
    }),
    "every-parity-field": stageset({
        "driftDetectionInterval": "1m", "onTimeout": "Hold",
        "stages": [stage(
            "app", onTimeout="Hold", preflight="AccessReview",
            conflictPolicy={"default": "KeepExisting", "rules": [
                {"target": {"apiVersion": "batch/v1", "kind": "Job", "name": "migrate", "namespace": "db"},
                 "action": "Recreate"},
                {"target": {"kind": "PersistentVolumeClaim"}, "action": "Recreate", "allowDataLoss": True},
                {"target": {"kind": "Service"}, "action": "Fail"}]},
            patches=[
                {"patch": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n"
                          "spec: {replicas: 2}\n"},
                {"patch": '[{"op": "replace", "path": "/spec/replicas", "value": 3}]',
                 "target": {"group": "apps", "version": "v1", "kind": "Deployment", "name": "web.*",
                            "namespace": "prod", "labelSelector": "app=web",
                            "annotationSelector": "team=payments"}},
                {"json6902": [{"op": "add", "path": "/metadata/labels/x", "value": "y"},
                              {"op": "move", "from": "/spec/a", "path": "/spec/b"},
                              {"op": "test", "path": "/spec/c", "value": {"nested": [1, 2]}},
                              {"op": "remove", "path": "/spec/d"}],
                 "target": {"kind": "ConfigMap"}}],
            readyChecks={"timeout": "30s", "disableWait": False, "exprs": [
                {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                 "current": "status.conditions.filter(e, e.type == 'Ready').all(e, e.status == 'True')",
                 "inProgress": "status.conditions.exists(e, e.type == 'Issuing')",
                 "failed": "status.conditions.filter(e, e.type == 'Ready').all(e, e.status == 'False')"}]},
        ), stage("jobs", force=True, conflictPolicy={"default": "Recreate"})],
    }),
    # What the reference allows and we took over: checks with a core kind and no apiVersion, a
    # health check with only failed, a conflict rule without kind, the helm-hook default, and the
    # "left out" values of refused fields.
    "reference-shapes": stageset({
        "rollbackOnFailure": False, "updateWindows": [], "migrations": [], "onRollback": [],
        "dependsOn": [{"name": "db", "minVersion": ""}],
        "stages": [stage(
            "app", applyHelmHookResources=True, migrationAnchor="",
            readyChecks={"disableWait": True, "checks": [
                {"kind": "Namespace", "name": "payments"},
                {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                 "name": "ledgers.payments.example"}],
                "exprs": [{"apiVersion": "db.example/v1", "kind": "Database",
                           "failed": "status.phase == 'Failed'"}]},
            conflictPolicy={"rules": [{"target": {"name": "migrate"}, "action": "Recreate"}]})],
    }),
    "drift-warn": stageset({"driftDetection": {"mode": "Warn"}, "driftDetectionInterval": "5m",
                            "stages": [stage("app")]}),
    "drift-correct-default": stageset({"driftDetection": {}, "stages": [stage("app")]}),
    "release-steering": stageset({
        "rollbackOnFailure": True, "onTimeout": "Rollback", "windowScope": "All",
        "dependsOn": [{"name": "db", "minVersion": "v5.2.0-rc.1"}, {"name": "queue", "minVersion": "3"}],
        "updateWindows": [
            {"type": "Deny", "schedule": "0 18 * * FRI", "duration": "62h", "timeZone": "Europe/Berlin"},
            {"type": "Allow", "schedule": "*/15 9-17 * * MON-THU", "duration": "10m"},
            {"type": "Deny", "from": "2030-12-24T00:00:00Z", "to": "2030-12-27T00:00:00+01:00"}],
        "stages": [stage("staging", promotion={"soak": "10m"}),
                   stage("prod", onTimeout="Hold", promotion={"soak": "0s", "requireManualPromotion": True})],
    }),
    # Dependencies on objects of other kinds (our extension): a readiness expression, a cluster-scoped
    # CRD, a core kind, a StageSet named by its kind (with minVersion), beside a plain StageSet.
    "depends-on-other-kinds": stageset({
        "dependsOn": [
            {"apiVersion": "db.example/v1", "kind": "Database", "name": "db",
             "readyExpr": "status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')"},
            {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "name": "databases.db.example"},
            {"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease", "name": "operator",
             "namespace": "operators"},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data",
             "readyExpr": "status.phase == 'Bound'"},
            {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "name": "infra", "minVersion": "1.2"},
            {"name": "policies"}],
        "stages": [stage("app")],
    }),
    "example-dependencies": example_stageset(DEPENDENCIES_EXAMPLE),
    "git-https-branch": gitrepository({"url": HTTPS, "ref": {"branch": "main"}}),
    "git-scp-like": gitrepository({"url": "git@github.com:org/repo.git", "ref": {"tag": "v1.2.3"}}),
    "git-ssh-semver": gitrepository({"url": "ssh://git@git.example.com:2222/org/repo.git",
                                     "ref": {"semver": ">=1.0.0 <2.0.0"}}),
    "git-file-commit": gitrepository({"url": "file:///srv/git/repo.git", "ref": {"commit": SHA}}),
    "git-branch-and-commit": gitrepository({
        "url": "http://127.0.0.1:8080/repo.git", "ref": {"branch": "main", "commit": SHA},
        "secretRef": {"name": "git-auth"}, "serviceAccountName": "git-reader",
        "interval": "5m", "timeout": "2m", "ignore": "*.md\n/docs/\n", "suspend": False,
    }),
    "git-timeout-at-the-bound": gitrepository({"url": HTTPS, "timeout": "4m60s"}),
}
