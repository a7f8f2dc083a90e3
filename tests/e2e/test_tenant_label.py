"""The ``tenant`` label of the per-object series comes from the Namespace's
``stages.metio.wtf/tenant`` label, which the controller (with exactly the chart's rights) reads
through a metadata-only Namespace watch; a StageSet labelling itself with another tenant changes
nothing, and relabelling the Namespace moves the series."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stageset.api.tenancy import TENANT_LABEL
from stageset.envtest.controller import ControllerProcess
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import wait_for
from tests.e2e.metrics import METRICS_ARGS, metrics_url, scrape
from tests.e2e.stagesets import cm, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]


@pytest.fixture(scope="module")
def controller_args() -> list[str]:
    return METRICS_ARGS


def tenants_of(url: str, namespace: str) -> set[str]:
    return {labels.get("tenant", "") for labels, _ in scrape(url).samples(
        "stageset_reconcile_condition", kind="StageSet", namespace=namespace)}


def label_namespace(admin: KubeClient, namespace: str, tenant: str | None) -> None:
    admin.request("PATCH", f"/api/v1/namespaces/{namespace}", content_type="application/merge-patch+json",
                  body={"metadata": {"labels": {TENANT_LABEL: tenant}}})


def test_the_tenant_label_is_the_namespaces_and_cannot_be_claimed_by_a_stageset(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
) -> None:
    url = metrics_url(controller)
    labelled = scenario(installed, git_server, make_tenant("tenantlabel"), {"app/cm.yaml": cm("a")})
    label_namespace(installed, labelled.ns, "payments")
    plain = scenario(installed, git_server, make_tenant("notenant"), {"app/cm.yaml": cm("a")})
    for s in (labelled, plain):
        # Each StageSet claims the tenant "billing" with the very label the Namespace carries.
        s.stageset("claims", [{"name": "app", "path": "./app"}])
        installed.request("PATCH", s.path("claims"), content_type="application/merge-patch+json",
                          body={"metadata": {"labels": {TENANT_LABEL: "billing"}}})
        s.wait_ready("claims")
    wait_for(lambda: tenants_of(url, labelled.ns) == {"payments"}, what="tenant=payments on the series")
    assert tenants_of(url, plain.ns) == {""}
    assert 'tenant="billing"' not in scrape(url).text

    label_namespace(installed, labelled.ns, "shops")
    wait_for(lambda: tenants_of(url, labelled.ns) == {"shops"}, what="the series to follow the relabel")
    label_namespace(installed, labelled.ns, None)
    wait_for(lambda: tenants_of(url, labelled.ns) == {""}, what="the label to go with the Namespace's")
