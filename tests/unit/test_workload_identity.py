"""Whose token, for which cluster (:mod:`stageset.controller.targets.workload` and a StageTarget's
ConfigMap in :mod:`stageset.controller.targets.platform`): the ConfigMap read as the StageSet, a
StageSet minting only for its own account in multi-tenant mode, this cluster's own audiences refused,
each identity's requests carrying its own account's token (another namespace's: none) — and every
refusal made before any TokenRequest.  Pure units over stubs (the real clusters:
``tests/kube/test_workload_tokens.py``, ``tests/e2e/federated/``)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from stageset.api import AppliedTarget, StageSet
from stageset.api.common import LocalObjectRef
from stageset.api.stageset import KubeConfigRef
from stageset.api.vocabulary import Reason
from stageset.apply.engine import StageApplier
from stageset.apply.errors import StageError
from stageset.apply.settings import ApplySettings
from stageset.controller.keys import ObjectKey
from stageset.controller.setup import Event
from stageset.controller.targets.clusters import Targets
from stageset.controller.targets.credentials import Credentials, KubeconfigSecret, KubeConfigSources
from stageset.controller.targets.platform import PlatformTargets, TargetWorkload, WorkloadUnusable
from stageset.controller.targets.workload import LocalAudiences, WorkloadIdentity
from stageset.kube.client import ApiError, ClientPool, ClusterKey, CredentialUnavailable, Identity
from stageset.kube.mapping import RestMapper
from stageset.kube.tokens import TokenRequester

NS = "payments"
ADDRESS = "https://prod.example:6443"
ISSUER = "https://issuer.local.example"


class Stub:
    """A client as one identity: ConfigMaps (``maps``) it may or may not read, TokenRequests, the
    issuer's discovery document; every request recorded."""

    def __init__(self, identity: Identity | None = None, *, maps: dict[str, dict[str, str]] | None = None,
                 readable: bool = True):
        self.identity = identity or Identity()
        self.maps = maps or {}
        self.readable = readable
        self.requests: list[tuple[str, str]] = []

    def get(self, path: str) -> dict[str, Any]:
        self.requests.append(("GET", path))
        if path == "/.well-known/openid-configuration":
            return {"issuer": ISSUER}
        if not self.readable:
            raise ApiError(status=403, reason="Forbidden", message="forbidden")
        name = path.rsplit("/", 1)[-1]
        if name not in self.maps:
            raise ApiError(status=404, reason="NotFound", message="not found")
        return {"metadata": {"name": name, "resourceVersion": "7"}, "data": self.maps[name]}

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.requests.append((method, path))
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return {"status": {"token": f"eyJ-{path.split('/')[6]}",
                           "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}

    def token_requests(self) -> list[str]:
        return [path for method, path in self.requests if method == "POST"]


def generic(**extra: str) -> dict[str, str]:
    return {"provider": "generic", "address": ADDRESS, **extra}


def as_account(name: str, **kwargs: Any) -> Stub:
    return Stub(Identity.service_account(namespace=NS, name=name), **kwargs)


def source(controller: Stub, *, lockdown: bool = True) -> WorkloadIdentity:
    return WorkloadIdentity(tokens=TokenRequester(client=controller),  # type: ignore[arg-type]
                            lockdown=lockdown, audiences=LocalAudiences(client=controller))  # type: ignore[arg-type]


REF = KubeConfigRef(config_map_ref=LocalObjectRef(name="prod"))


def test_the_stageset_s_own_account_its_token_and_a_key_naming_them() -> None:
    controller, tenant = Stub(), as_account("deployer", maps={"prod": generic()})
    credentials = source(controller).read(tenant, namespace=NS, ref=REF)  # type: ignore[arg-type]
    assert tenant.requests == [("GET", f"/api/v1/namespaces/{NS}/configmaps/prod")], "read as the tenant"
    assert controller.token_requests() == [f"/api/v1/namespaces/{NS}/serviceaccounts/deployer/token"]
    assert credentials.cluster.name.startswith(f"cm:{NS}/prod@deployer#")
    assert "eyJ" not in credentials.cluster.name
    assert credentials.kubeconfig == b""
    assert credentials.version == "7"
    federation = credentials.federation
    assert federation is not None
    assert federation.config.audiences == (ADDRESS,)
    bearers = federation.bearers
    assert bearers(Identity()).token() == "eyJ-deployer", "the controller's own requests: the StageSet's"
    assert bearers(Identity.service_account(namespace=NS, name="stage-sa")).token() == "eyJ-stage-sa"
    with pytest.raises(CredentialUnavailable, match=f"only ServiceAccounts of namespace {NS}"):
        bearers(Identity.service_account(namespace="other", name="deployer")).token()
    with pytest.raises(CredentialUnavailable, match="has no workload identity here"):
        bearers(Identity(user="alice")).token()
    assert not any("/namespaces/other/" in path for path in controller.token_requests())


def refused(controller: Stub, tenant: Stub, *, lockdown: bool = True) -> StageError:
    with pytest.raises(StageError) as error:
        source(controller, lockdown=lockdown).read(tenant, namespace=NS, ref=REF)  # type: ignore[arg-type]
    assert controller.token_requests() == [], "refused before any TokenRequest"
    return error.value


@pytest.mark.parametrize(("data", "reason", "message"), [
    (generic(provider="aws"), Reason.INVALID_SPEC, "provider 'aws' is not supported yet"),
    ({"provider": "generic"}, Reason.INVALID_SPEC, "key 'address' is missing"),
    (generic(serviceAccountName="admin"), Reason.INVALID_SPEC,
     "names ServiceAccount 'admin', but this StageSet acts as 'deployer': in multi-tenant mode"),
    (generic(audiences="https://kubernetes.default.svc"), Reason.INVALID_SPEC,
     "the audience 'https://kubernetes.default.svc' (key 'audiences', or 'address' when it is not set) is "
     "this cluster's own API audience"),
    (generic(audiences=ISSUER + "/"), Reason.INVALID_SPEC, "is this cluster's own API audience"),
])
def test_bad_configmaps_are_refused_naming_the_key(data: dict[str, str], reason: Reason,
                                                   message: str) -> None:
    error = refused(Stub(), as_account("deployer", maps={"prod": data}))
    assert error.reason is reason
    assert f"spec.kubeConfig.configMapRef: ConfigMap {NS}/prod: " in error.message
    assert message in error.message


def test_a_missing_or_unreadable_configmap_is_refused_as_the_tenant() -> None:
    missing = refused(Stub(), as_account("deployer"))
    assert (missing.reason, missing.message) == (
        Reason.STAGE_FAILED, f"spec.kubeConfig.configMapRef: ConfigMap {NS}/prod not found")
    denied = refused(Stub(), as_account("deployer", maps={"prod": generic()}, readable=False))
    assert denied.reason is Reason.RBAC_DENIED
    assert f"system:serviceaccount:{NS}:deployer may not read ConfigMap {NS}/prod " \
           "(spec.kubeConfig.configMapRef)" in denied.message


def test_cluster_admin_mode_may_name_another_account_of_the_namespace() -> None:
    """Single-tenant mode: the ConfigMap's serviceAccountName (of the StageSet's own namespace) is the
    controller's own requests' account there — a StageSet without serviceAccountName needs one."""
    controller = Stub()
    credentials = source(controller, lockdown=False).read(  # type: ignore[arg-type]
        Stub(maps={"prod": generic(serviceAccountName="platform")}), namespace=NS, ref=REF)
    assert controller.token_requests() == [f"/api/v1/namespaces/{NS}/serviceaccounts/platform/token"]
    assert credentials.cluster.name.startswith(f"cm:{NS}/prod@platform#")
    nobody = refused(Stub(), Stub(maps={"prod": generic()}), lockdown=False)
    assert "no ServiceAccount to request tokens for: set spec.serviceAccountName" in nobody.message


def test_workload_identity_off_refuses_before_reading_anything() -> None:
    tenant = as_account("deployer", maps={"prod": generic()})
    with pytest.raises(StageError) as off:
        KubeConfigSources(secrets=KubeconfigSecret()).read(tenant, namespace=NS, ref=REF)  # type: ignore[arg-type]
    assert off.value.reason is Reason.INVALID_SPEC
    assert "workload identity is not enabled on this controller" in off.value.message
    assert tenant.requests == []


def target(config_map: str = "prod", allowed: tuple[str, ...] = (NS,)) -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageTarget",
            "metadata": {"name": "prod", "namespace": "platform"},
            "spec": {"kubeConfig": {"configMapRef": {"name": config_map}},
                     "allowedNamespaces": list(allowed)}}


class Remotes:
    def __init__(self) -> None:
        self.connected: list[Any] = []

    def cached(self, cluster: Any) -> None:  # noqa: ARG002 - nothing is kept
        return None

    def connect(self, credentials: Any, *, name: str = "") -> Any:  # noqa: ARG002
        self.connected.append(credentials)
        return credentials


def platform(admin: Stub, *, workload: bool = True) -> PlatformTargets:
    tokens = TokenRequester(client=admin)  # type: ignore[arg-type]
    found = PlatformTargets(admin=admin, namespaces=("platform",),  # type: ignore[arg-type]
                            workload=TargetWorkload(tokens=tokens, audiences=LocalAudiences(client=None))
                            if workload else None)
    found.observe(Event.ADDED, ObjectKey("StageTarget", "platform", "prod"), target())
    return found


def test_a_stage_target_mints_for_the_platform_account_and_allowed_namespaces_only() -> None:
    admin = Stub(maps={"prod": generic(serviceAccountName="platform-deployer")})
    targets, remotes = platform(admin), Remotes()
    _, connection = targets.refresh(("platform", "prod"), remotes=remotes)
    assert connection.kind == "ConfigMap"
    assert connection.secret_version == "7"
    assert admin.token_requests() == ["/api/v1/namespaces/platform/serviceaccounts/platform-deployer/token"]
    (credentials,) = remotes.connected
    bearers = credentials.federation.bearers
    assert bearers(Identity()).token() == "eyJ-platform-deployer"
    tenant = bearers(Identity.service_account(namespace=NS, name="deployer"))
    assert tenant.token() == "eyJ-deployer", "a stage writes as its own account, by its own token"
    # The namespace withdrawn: its next request gets no token (the client, kept, asks every time).
    targets.observe(Event.MODIFIED, ObjectKey("StageTarget", "platform", "prod"), target(allowed=()))
    with pytest.raises(CredentialUnavailable, match="may not act there now"):
        tenant.token()
    # A ConfigMap change is seen by its own watch, and names the targets to reconcile.
    changed = {"metadata": {"namespace": "platform", "name": "prod", "resourceVersion": "8"}}
    assert targets.secret_changed("MODIFIED", changed, kind="ConfigMap") == [
        ObjectKey("StageTarget", "platform", "prod")]
    assert targets.secret_changed("MODIFIED", changed, kind="Secret") == [], "a Secret of that name: another"


@pytest.mark.parametrize(("data", "workload", "message"), [
    (generic(), True, "key 'serviceAccountName' is missing: a StageTarget's ConfigMap names"),
    (generic(provider="gcp", serviceAccountName="p"), True, "provider 'gcp' is not supported yet"),
    (generic(serviceAccountName="p"), False, "workload identity is not enabled on this controller"),
])
def test_a_stage_target_s_bad_configmap_is_refused_before_any_token(
        data: dict[str, str], workload: bool, message: str) -> None:
    admin = Stub(maps={"prod": data})
    with pytest.raises(WorkloadUnusable, match=message):
        platform(admin, workload=workload).refresh(("platform", "prod"), remotes=Remotes())
    assert admin.token_requests() == []


def stageset_on(kube_config: dict[str, Any]) -> StageSet:
    return StageSet.model_validate({"metadata": {"name": "shop", "namespace": NS}, "spec": {
        "serviceAccountName": "deployer", "kubeConfig": kube_config,
        "stages": [{"name": "app", "sourceRef": {"name": "app"}}]}})


def test_a_previous_workload_identity_cluster_is_reached_again_through_its_configmap() -> None:
    """After a move away (to a Secret's cluster), the cluster left behind is found by the ConfigMap the
    inventory names: the connection still kept, or the ConfigMap read again — and refused when the
    ConfigMap now names another cluster.  No request reaches any remote (nothing is sent here)."""
    controller = Stub()
    pool = ClientPool(configuration=k8s.Configuration())
    sources = KubeConfigSources(secrets=KubeconfigSecret(), config_maps=source(controller))
    targets = Targets(clients=pool, settings=ApplySettings(),
                      local=StageApplier(mapper=RestMapper(pool.client())), credentials=sources, capacity=1)
    tenant = as_account("deployer", maps={"prod": generic()})
    first = targets.resolve(tenant, stageset_on({"configMapRef": {"name": "prod"}}))  # type: ignore[arg-type]
    assert first.remote
    assert first.server == ADDRESS
    assert first.id.startswith(f"{ADDRESS}#")
    applied = AppliedTarget(id=first.id, config_map_ref=LocalObjectRef(name="prod"))
    moved = stageset_on({"secretRef": {"name": "elsewhere"}})
    reads = len(tenant.requests)
    assert targets.previous(tenant, stageset=moved, applied=applied) is first  # type: ignore[arg-type]
    assert len(tenant.requests) == reads, "the kept connection: nothing read"
    # Evicted (capacity 1): the ConfigMap is read again, as the StageSet, and names the same cluster.
    targets.connect(Credentials(cluster=ClusterKey("other"), kubeconfig=OTHER_KUBECONFIG))
    again = targets.previous(tenant, stageset=moved, applied=applied)  # type: ignore[arg-type]
    assert again.id == first.id
    assert len(tenant.requests) == reads + 1
    # The ConfigMap now names another cluster: the one left behind cannot be reached through it.
    targets.connect(Credentials(cluster=ClusterKey("other"), kubeconfig=OTHER_KUBECONFIG))
    tenant.maps["prod"] = generic(address="https://other.example:6443")
    with pytest.raises(StageError) as gone:
        targets.previous(tenant, stageset=moved, applied=applied)  # type: ignore[arg-type]
    assert gone.value.reason is Reason.CLUSTER_UNREACHABLE
    assert f"ConfigMap {NS}/prod now names another cluster" in gone.value.message
    # One token per audience (the address is the default audience): the first kept throughout.
    assert [path for _, path in controller.requests if "/token" in path] == [
        f"/api/v1/namespaces/{NS}/serviceaccounts/deployer/token"] * 2


OTHER_KUBECONFIG = b"""apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: 'https://third.example:6443'}}]
users: [{name: u, user: {token: t}}]
"""
