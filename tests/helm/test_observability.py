"""The chart's alert rules and Grafana dashboard, rendered by the real ``helm``: exactly the files
the metrics test checks against a real scrape (tests/e2e/test_metrics.py)."""

from __future__ import annotations

import json

import yaml

from tests.helm.chart import CHART, Helm, controller_args, find, one

FILES = CHART / "files"


def test_rules_and_dashboard_are_off_by_default_and_render_the_files_when_on(helm: Helm) -> None:
    docs = helm.render()
    assert not find(docs, "PrometheusRule")
    assert not [d for d in find(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]

    docs = helm.render("--set", "metrics.prometheusRule.enabled=true",
                       "--set", "metrics.prometheusRule.labels.release=prom",
                       "--set", "metrics.grafanaDashboard.enabled=true", release="prod", namespace="ops")
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["name"] == "prod-stageset"
    assert rule["metadata"]["namespace"] == "ops"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == "prod"
    assert rule["spec"] == yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())
    dashboard = one(docs, "ConfigMap", "prod-stageset-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["stageset.json"]) == \
        json.loads((FILES / "grafana-dashboard.json").read_text())


def test_the_tenant_quota_alert_is_off_by_default_and_joins_the_tenant_label(helm: Helm) -> None:
    docs = helm.render("--set", "metrics.prometheusRule.enabled=true")
    assert [g["name"] for g in one(docs, "PrometheusRule")["spec"]["groups"]] == ["stageset"]
    docs = helm.render("--set", "metrics.prometheusRule.enabled=true",
                       "--set", "metrics.prometheusRule.tenantQuota.enabled=true",
                       "--set-json", "metrics.prometheusRule.tenantQuota.threshold=0.8",
                       "--set", "metrics.prometheusRule.tenantQuota.for=5m")
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    assert groups[0] == yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())["groups"][0]
    quota = groups[1]
    assert quota["name"] == "stageset-tenant-quota"
    rule = quota["rules"][0]
    assert rule["alert"] == "TenantQuotaNearlyUsed"
    assert rule["for"] == "5m"
    assert ">= 0.8" in rule["expr"]
    assert 'kube_resourcequota{type="used"}' in rule["expr"]
    assert 'kube_namespace_labels{label_stages_metio_wtf_tenant!=""}' in rule["expr"]
    assert "{{ $labels.label_stages_metio_wtf_tenant }}" in rule["annotations"]["summary"]
    refused = helm.template("--set-json", "metrics.prometheusRule.tenantQuota.threshold=2", check=False)
    assert refused.returncode != 0


def test_rules_need_the_metrics_port(helm: Helm) -> None:
    result = helm.template("--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.enabled=false",
                           check=False)
    assert result.returncode != 0
    assert "metrics.prometheusRule.enabled=true needs metrics.enabled=true" in result.stderr


def test_json_logs_by_default_and_the_service_monitor_keeps_object_labels(helm: Helm) -> None:
    assert "--log-format=json" in controller_args(helm.render())
    docs = helm.render("--set", "metrics.serviceMonitor.enabled=true")
    assert one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["honorLabels"] is True
