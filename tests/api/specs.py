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
]

# Specs both sides must accept, beyond the DESIGN.md ones.
VALID = {
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
