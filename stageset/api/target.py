"""The ``StageTarget`` kind: a cluster the platform owns, named by tenants' StageSets (``spec.targetRef``).

A StageTarget lives in one of the namespaces the controller is started with
(``--target-namespaces``); anywhere else it is ignored.  Its kubeconfig Secret sits beside it and
is read by the controller's own identity only, never by a tenant: the tenant names the target, the
platform holds the credentials.  ``allowedNamespaces`` lists the tenant namespaces whose StageSets
may use it, by name (not a label selector: a tenant able to label its own namespace must not be
able to grant itself a cluster).

The status says whether the controller could reach the cluster (the server URL and the Kubernetes
version it saw), never anything of the kubeconfig's credentials.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from stageset.api.common import (
    API_VERSION,
    ONE_KUBECONFIG,
    ApiModel,
    Condition,
    Count,
    DNSLabel,
    DNSSubdomain,
    LocalObjectRef,
    SecretKeyRef,
    StatusModel,
    one_kubeconfig_ref,
)

MAX_ALLOWED_NAMESPACES = 1024
"""``allowedNamespaces`` entries per StageTarget."""

_UNIQUE_NAMESPACES: JsonDict = {"x-kubernetes-list-type": "set"}




class TargetKubeConfig(ApiModel):
    """Where the target's cluster is: a kubeconfig Secret in the StageTarget's own namespace, or a
    ConfigMap there naming the cluster (workload identity), read by the controller alone.  The same
    rules as ``StageSet.spec.kubeConfig``: inline data only, no commands, files or proxies."""

    model_config = ConfigDict(json_schema_extra=one_kubeconfig_ref)

    secret_ref: SecretKeyRef | None = None
    """The Secret and key holding the kubeconfig; the key defaults to ``value``."""
    config_map_ref: LocalObjectRef | None = None
    """The ConfigMap naming the cluster (``provider: generic``, ``address``, ``ca.crt``, optional
    ``audiences``) and the ServiceAccount of this namespace the controller requests tokens for
    (``serviceAccountName``, required here): the platform's own identity on the cluster, used for
    discovery and the target's health.  Each stage still writes as its own ServiceAccount there, by
    a token requested for it (never by impersonation).  Exclusive with ``secretRef``."""

    @model_validator(mode="after")
    def _exactly_one(self) -> TargetKubeConfig:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError(ONE_KUBECONFIG["message"])
        return self


class StageTargetSpec(ApiModel):
    """Which cluster, and which tenant namespaces may apply to it."""

    kube_config: TargetKubeConfig
    """The cluster: a kubeconfig Secret or a workload-identity ConfigMap, read by the controller, never by
    a tenant."""
    allowed_namespaces: list[DNSLabel] = Field(
        default_factory=list, max_length=MAX_ALLOWED_NAMESPACES, json_schema_extra=_UNIQUE_NAMESPACES)
    """The namespaces whose StageSets may name this target, by name.  Removing one stops its
    StageSets' releases on the target (``Ready=False``); nothing is deleted."""


class StageTargetStatus(StatusModel):
    """What the controller saw of the cluster."""

    observed_generation: Count | None = None
    """The ``metadata.generation`` last reconciled."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """``Ready``: the kubeconfig was accepted and the cluster answered, or why not."""
    server: str | None = Field(default=None, max_length=2048)
    """The cluster's server URL, from the kubeconfig."""
    kubernetes_version: str | None = Field(default=None, max_length=256)
    """The Kubernetes version the cluster reported (``/version``'s ``gitVersion``)."""
    observed_secret_version: str | None = Field(default=None, max_length=256)
    """The ``resourceVersion`` of the kubeconfig Secret (or workload-identity ConfigMap) last read: a
    change (a rotated credential, another cluster) wakes every StageSet on the target."""
    last_handled_reconcile_at: str | None = Field(default=None, max_length=256)
    """The last ``reconcile.fluxcd.io/requestedAt`` annotation value acted on."""


class StageTarget(ApiModel):
    """A cluster the platform owns, that StageSets of the allowed namespaces apply to by name."""

    api_version: Literal["stages.metio.wtf/v1"] = API_VERSION
    """``stages.metio.wtf/v1``."""
    kind: Literal["StageTarget"] = "StageTarget"
    """``StageTarget``."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Standard object metadata."""
    spec: StageTargetSpec
    """The desired state."""
    status: StageTargetStatus | None = None
    """The observed state, written by the controller."""


class TargetRef(ApiModel):
    """A StageTarget a StageSet applies to: the cluster the platform registered under that name."""

    name: DNSSubdomain
    """Name of the StageTarget."""
    namespace: DNSLabel
    """Namespace of the StageTarget (one of the controller's ``--target-namespaces``)."""


def target_text(spec: Mapping[str, Any]) -> str | None:
    """The cluster a StageSet's raw ``spec`` applies to, by name (the CLI and the dashboard show it):
    ``StageTarget <namespace>/<name>`` (the platform's, never its server), ``kubeConfig Secret
    <name>``, ``kubeConfig ConfigMap <name>`` (workload identity), or ``None`` for the controller's own
    cluster."""
    ref = spec.get("targetRef") or {}
    if ref.get("name"):
        return f"StageTarget {ref.get('namespace')}/{ref['name']}"
    kube_config = spec.get("kubeConfig") or {}
    secret = (kube_config.get("secretRef") or {}).get("name")
    if secret:
        return f"kubeConfig Secret {secret}"
    config_map = (kube_config.get("configMapRef") or {}).get("name")
    return f"kubeConfig ConfigMap {config_map}" if config_map else None
