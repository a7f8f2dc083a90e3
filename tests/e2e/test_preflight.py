"""``preflight: AccessReview``: RBAC asked once per verb, kind and namespace instead of a dry-run per
object, against the real apiserver, counted from its audit log.

Evidence first in each test: the requests counted are in the log (an empty log must fail, not read
as "cheap" or "nothing written").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import wait_for, writes_by
from tests.e2e.stagesets import cm, poke, scenario
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

TenantFactory = Callable[..., Tenant]
OBJECTS = 5
REVIEWS = "selfsubjectaccessreviews"


def by_tenant(events: list[dict[str, Any]], tenant: str) -> Counter[str]:
    """The tenant's requests (each impersonated by the controller), by kind of request."""
    found: Counter[str] = Counter()
    for event in events:
        if event.get("stage") != "ResponseComplete" or \
                (event.get("impersonatedUser") or {}).get("username") != tenant:
            continue
        resource = (event.get("objectRef") or {}).get("resource")
        if resource == REVIEWS:
            found["access review"] += 1
        elif "dryRun=All" in event.get("requestURI", ""):
            found[f"{event['verb']} (dry-run)"] += 1
        else:
            found[str(event["verb"])] += 1
    return found


def writes(events: list[dict[str, Any]], tenant: str) -> list[dict[str, Any]]:
    """Real writes as the tenant; an access review is a ``create`` that stores nothing."""
    return [e for e in writes_by(events, tenant) if (e.get("objectRef") or {}).get("resource") != REVIEWS]


def test_access_reviews_cost_a_cold_stage_fewer_requests_than_dry_runs(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    control_plane: ControlPlane,
) -> None:
    files = {f"app/cm-{i}.yaml": cm(f"cm-{i}") for i in range(OBJECTS)}
    dry = scenario(installed, git_server, make_tenant("pf-dry"), files)
    review = scenario(installed, git_server, make_tenant("pf-review"), files)
    seen = len(control_plane.audit_events())
    dry.stageset("cold", [{"name": "app", "path": "./app"}])  # preflight left out: DryRun
    review.stageset("cold", [{"name": "app", "path": "./app", "preflight": "AccessReview"}])
    dry.wait_ready("cold")
    review.wait_ready("cold")
    time.sleep(1)  # let the audit log catch up with the last requests
    events = control_plane.audit_events()[seen:]
    by_dry = by_tenant(events, dry.tenant.username)
    by_review = by_tenant(events, review.tenant.username)

    # Evidence first: both cold passes are in the log, every object written once.
    assert by_dry["patch"] == OBJECTS, by_dry
    assert by_review["patch"] == OBJECTS, by_review
    # DryRun: every object but the first written is dry-run; no access review.
    assert by_dry["patch (dry-run)"] == OBJECTS - 1, by_dry
    assert by_dry["access review"] == 0, by_dry
    # AccessReview: two questions (may the tenant patch, and create, ConfigMaps here?), asked as
    # the tenant (impersonated: counted by impersonatedUser above), and no dry-run at all.
    assert by_review["access review"] == 2, by_review
    assert by_review["patch (dry-run)"] == 0, by_review
    # The cold pass's checks and writes, compared without the reads: a routine pass after it (a
    # source or drift watch event can start one) adds a read of the source and a list to either
    # side, and is no part of what a cold stage costs.
    def checked_and_written(found: Counter[str]) -> int:
        return sum(n for verb, n in found.items() if verb not in ("get", "list"))
    assert checked_and_written(by_review) < checked_and_written(by_dry), (by_review, by_dry)
    assert all(review.configmap(f"cm-{i}") is not None for i in range(OBJECTS))
    # A review is not a write, and no review names another tenant's namespace.
    asked = [e for e in events if (e.get("objectRef") or {}).get("resource") == REVIEWS
             and (e.get("impersonatedUser") or {}).get("username") == review.tenant.username]
    assert len(asked) == 2
    assert all(e["responseStatus"]["code"] == 201 for e in asked), asked


def test_a_stage_its_account_may_not_create_in_fails_before_any_write(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    control_plane: ControlPlane, kube_pool: ClientPool,
) -> None:
    tenant = make_tenant("pf-denied")
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{tenant.namespace}"
    # May change ConfigMaps that exist, not create them.
    rule = {"apiGroups": [""], "resources": ["configmaps"],
            "verbs": ["get", "list", "watch", "patch", "update"]}
    installed.request("POST", f"{rbac}/roles", body={"metadata": {"name": "no-create"}, "rules": [rule]})
    installed.request("POST", f"{rbac}/rolebindings", body={
        "metadata": {"name": "no-create"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-create"},
        "subjects": [{"kind": "ServiceAccount", "name": tenant.service_account,
                      "namespace": tenant.namespace}]})

    # Why a new object needs both reviews: a server-side apply is a patch, and one that creates is
    # authorized for create as well — patch alone is refused.
    as_tenant = kube_pool.client(Identity.service_account(namespace=tenant.namespace,
                                                          name=tenant.service_account))

    def refusal() -> str:
        with pytest.raises(ApiError) as refused:
            as_tenant.apply(f"/api/v1/namespaces/{tenant.namespace}/configmaps/probe",
                            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}},
                            field_manager="test", dry_run=True)
        assert refused.value.forbidden, refused.value.message
        return refused.value.message
    # (until the new binding reaches the apiserver's RBAC cache the patch itself is refused: a
    # dry-run, so asking again writes nothing)
    wait_for(lambda: "cannot create" in refusal(), what="patch allowed and create refused", timeout=30,
             interval=0.2)

    s = scenario(installed, git_server, tenant, {f"app/cm-{i}.yaml": cm(f"cm-{i}") for i in range(3)},
                 role="view")  # view: read the GitRepository; the Role above: ConfigMaps, no create
    seen = len(control_plane.audit_events())
    s.stageset("denied", [{"name": "app", "path": "./app", "preflight": "AccessReview"}])
    denied = s.wait_reason("denied", "RBACDenied")
    time.sleep(1)  # let the audit log catch up with the last requests
    events = control_plane.audit_events()[seen:]

    # The message names the stage, the identity, an object, the verb and the namespace.
    message = denied["message"]
    assert "stage 'app'" in message, message
    assert tenant.username in message, message
    assert f"ConfigMap {tenant.namespace}/cm-" in message, message
    assert "cannot create" in message, message
    assert f'namespace "{tenant.namespace}"' in message, message
    # Evidence first: the passes are in the log — each asked the tenant's two reviews (patch
    # allowed, create refused), then dry-ran the objects behind the refusal (the apiserver's own
    # answer, whose message the stage shows) — and nothing was written, nothing exists.
    asked = by_tenant(events, tenant.username)
    passes = asked["access review"] // 2
    assert passes >= 1, asked
    assert asked["access review"] == 2 * passes, asked
    assert asked["patch (dry-run)"] == 3 * passes, asked
    assert writes(events, tenant.username) == [], writes(events, tenant.username)
    assert all(s.configmap(f"cm-{i}") is None for i in range(3))

    # Given create, the same StageSet converges without an edit: asked to reconcile, as a user would
    # after fixing the Role (its own retry backs off with every refusal, longer under load).
    installed.request("PATCH", f"{rbac}/roles/no-create", content_type="application/merge-patch+json",
                      body={"rules": [{**rule, "verbs": [*rule["verbs"], "create"]}]})
    poke(installed, s.path("denied"))
    wait_for(lambda: all(s.configmap(f"cm-{i}") is not None for i in range(3)), timeout=90,
             what="the ConfigMaps once create is granted")


def test_an_object_that_exists_already_is_adopted_through_the_dry_run(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    control_plane: ControlPlane,
) -> None:
    tenant = make_tenant("pf-adopt")
    installed.request("POST", f"/api/v1/namespaces/{tenant.namespace}/configmaps", body={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-0"}, "data": {"k": "by hand"}})
    s = scenario(installed, git_server, tenant, {f"app/cm-{i}.yaml": cm(f"cm-{i}") for i in range(3)})
    seen = len(control_plane.audit_events())
    s.stageset("adopt", [{"name": "app", "path": "./app", "preflight": "AccessReview"}])
    s.wait_ready("adopt")
    time.sleep(1)
    asked = by_tenant(control_plane.audit_events()[seen:], tenant.username)

    # The reviewed objects are written create-only: the one that exists is refused (409), then
    # dry-run (is it another StageSet's? no: adopted in place) and applied; the others created.
    adopted = s.configmap("cm-0")
    assert adopted is not None
    assert adopted["data"] == {"k": "v"}
    assert all(s.configmap(f"cm-{i}") is not None for i in range(1, 3))
    assert asked["access review"] == 2, asked
    assert asked["patch (dry-run)"] == 1, asked
    assert asked["patch"] == 4, asked  # three create-only, one apply of the adopted object


NETWORK_POLICY = """apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-everything}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  ingress: [{}]
  egress: [{}]
"""


@pytest.mark.parametrize("preflight", ["DryRun", "AccessReview"])
def test_a_stage_rendering_a_network_policy_fails_for_the_tenant_deployer_with_nothing_applied(
    controller: ControllerProcess, installed: KubeClient, git_server: GitServer, make_tenant: TenantFactory,
    control_plane: ControlPlane, preflight: str,
) -> None:
    """stageset-tenant-deployer (what `create tenant` binds) may not write NetworkPolicies: a tenant's
    Git that renders one beside its workload gets RBACDenied naming the policy, and none of the
    stage's objects is written — with the dry-run and with the access reviews alike."""
    tenant = make_tenant(f"pf-np-{preflight.lower()}")
    files = {**{f"app/cm-{i}.yaml": cm(f"cm-{i}") for i in range(2)}, "app/policy.yaml": NETWORK_POLICY}
    s = scenario(installed, git_server, tenant, files, role="stageset-tenant-deployer")
    seen = len(control_plane.audit_events())
    s.stageset("opens-up", [{"name": "app", "path": "./app", "preflight": preflight}])
    denied = s.wait_reason("opens-up", "RBACDenied")
    time.sleep(1)  # let the audit log catch up with the last requests
    events = control_plane.audit_events()[seen:]

    message = denied["message"]
    assert "stage 'app'" in message, message
    assert tenant.username in message, message
    assert f"NetworkPolicy {tenant.namespace}/allow-everything" in message, message
    assert "networkpolicies" in message, message
    # Evidence first: the pass asked as the tenant (reviews or dry-runs are in the log) — then
    # nothing at all was written, and nothing of the stage exists.
    asked = by_tenant(events, tenant.username)
    assert asked["access review"] + asked["patch (dry-run)"] >= 1, asked
    assert writes(events, tenant.username) == [], writes(events, tenant.username)
    assert all(s.configmap(f"cm-{i}") is None for i in range(2))
    policies = installed.get(f"/apis/networking.k8s.io/v1/namespaces/{tenant.namespace}/networkpolicies")
    assert policies["items"] == []
