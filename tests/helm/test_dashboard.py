"""The chart's shared dashboard (``dashboard.enabled``) as the real ``helm`` renders it.

What must hold: off by default; when on, a Deployment, Service and ServiceAccount of its own whose
account has no rights at all (no binding names it) and no token mounted, the pod running
``stageset dashboard --login`` with no kubeconfig, and selectors that never catch the controller's
pods (nor the controller's Services and ServiceMonitor the dashboard's).
"""

from __future__ import annotations

from typing import Any

import pytest

from stageset.cli.main import main as cli
from tests.helm.chart import CHART, Helm, find, one, without_hooks

NAME = "stageset-dashboard"
ON = ["--set", "dashboard.enabled=true"]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (found,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(found)


def test_off_by_default(helm: Helm) -> None:
    docs = helm.render()
    assert not [d for d in docs if "dashboard" in d["metadata"]["name"]]


def test_lint_strict_with_the_dashboard(helm: Helm) -> None:
    result = helm.run("lint", "--strict", str(CHART), *ON, "--set", "dashboard.tls.secretName=dash-tls")
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout


def test_its_service_account_has_no_rights_and_no_token(helm: Helm) -> None:
    docs = helm.render(*ON, "--set", "rbac.clusterAdmin=true")
    account = one(docs, "ServiceAccount", NAME)
    assert account["automountServiceAccountToken"] is False
    pod = one(docs, "Deployment", NAME)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME
    assert pod["automountServiceAccountToken"] is False
    # No binding of any kind (hooks included) names the dashboard's account.
    for binding in [*find(docs, "RoleBinding"), *find(docs, "ClusterRoleBinding")]:
        assert all(s.get("name") != NAME for s in binding.get("subjects") or []), binding["metadata"]["name"]
    # Its only view of the apiserver: the CA from kube-root-ca.crt, no projected token volume.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kube-ca"]["configMap"]["name"] == "kube-root-ca.crt"
    assert not [v for v in pod["volumes"] if "projected" in v or "secret" in v]


def test_it_runs_the_login_dashboard_with_no_kubeconfig(helm: Helm) -> None:
    deployment = one(helm.render(*ON, "--set", "dashboard.allowActions=true"), "Deployment", NAME)
    assert deployment["spec"]["replicas"] == 1  # logins live in the process's memory
    main = container(deployment)
    assert main["command"] == ["/opt/stageset/bin/stageset"]
    args = main["args"]
    assert args[:2] == ["dashboard", "--login"]
    assert "--certificate-authority=/etc/stageset/kube-ca/ca.crt" in args
    assert "--allow-actions" in args
    assert "--secure-cookies" in args
    assert not [a for a in args if a.startswith(("--kubeconfig", "--context", "-n", "-A"))]
    # Every flag the chart passes is one the command knows.
    flags = {a.split("=")[0] for a in args if a.startswith("--")}
    command = cli.commands["dashboard"]  # type: ignore[attr-defined]
    known = {opt for param in command.params for opt in param.opts}
    assert flags <= known, flags - known


def test_tls_from_a_secret(helm: Helm) -> None:
    docs = helm.render(*ON, "--set", "dashboard.tls.secretName=dash-tls")
    deployment = one(docs, "Deployment", NAME)
    main = container(deployment)
    assert {"--tls-cert-file=/etc/stageset/tls/tls.crt", "--tls-key-file=/etc/stageset/tls/tls.key"} <= set(
        main["args"])
    assert "--secure-cookies" not in main["args"]  # the request's own scheme (https) marks it Secure
    assert main["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "dash-tls"
    assert one(docs, "Service", NAME)["spec"]["ports"][0]["name"] == "https"


def test_selectors_keep_the_dashboard_and_the_controller_apart(helm: Helm) -> None:
    docs = without_hooks(helm.render(*ON, "--set", "metrics.serviceMonitor.enabled=true",
                                     "--set", "controller.shards={a}"))
    dashboard = one(docs, "Deployment", NAME)
    controllers = [d for d in find(docs, "Deployment") if d["metadata"]["name"] != NAME]
    assert controllers
    for deployment in controllers:
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert not matches(selector, pod_labels(dashboard)), deployment["metadata"]["name"]
        assert not matches(dashboard["spec"]["selector"]["matchLabels"], pod_labels(deployment))
    for service in find(docs, "Service"):
        if service["metadata"]["name"] != NAME:
            assert not matches(service["spec"]["selector"], pod_labels(dashboard))
    monitor = one(docs, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert not matches(monitor, one(docs, "Service", NAME)["metadata"]["labels"])
    assert one(docs, "Service", NAME)["spec"]["selector"] == dashboard["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("values", [
    ["--set", "dashboard.unknown=1"],
    ["--set", "dashboard.maxLogins=0"],
    ["--set", "dashboard.loginIdleSeconds=5"],
    ["--set", "dashboard.service.type=ExternalName"],
])
def test_its_values_are_schema_checked(helm: Helm, values: list[str]) -> None:
    result = helm.template(*ON, *values, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
