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

from pydantic import Field
from pydantic.config import JsonDict

from stageset.api.common import (
    API_VERSION,
    ApiModel,
    Condition,
    Count,
    DNSLabel,
    DNSSubdomain,
    SecretKeyRef,
    StatusModel,
)

MAX_ALLOWED_NAMESPACES = 1024
"""``allowedNamespaces`` entries per StageTarget."""

_UNIQUE_NAMESPACES: JsonDict = {"x-kubernetes-list-type": "set"}


class TargetKubeConfig(ApiModel):
    """Where the target's kubeconfig is: a Secret in the StageTarget's own namespace, read by the
    controller alone.  The same rules as ``StageSet.spec.kubeConfig``: inline data only, no
    commands, files or proxies."""

    secret_ref: SecretKeyRef
    """The Secret and key holding the kubeconfig; the key defaults to ``value``."""


class StageTargetSpec(ApiModel):
    """Which cluster, and which tenant namespaces may apply to it."""

    kube_config: TargetKubeConfig
    """The kubeconfig of the cluster (its Secret is read by the controller, never by a tenant)."""
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
    """The ``resourceVersion`` of the kubeconfig Secret last read: a change (a rotated credential,
    another cluster) wakes every StageSet on the target."""
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
    <name>``, or ``None`` for the controller's own cluster."""
    ref = spec.get("targetRef") or {}
    if ref.get("name"):
        return f"StageTarget {ref.get('namespace')}/{ref['name']}"
    secret = ((spec.get("kubeConfig") or {}).get("secretRef") or {}).get("name")
    return f"kubeConfig Secret {secret}" if secret else None
