"""The ``StageSet`` kind: ordered stages of manifests from Git, applied as the tenant.

Every rule the apiserver enforces through the CRD (``x-kubernetes-validations``
next to the field it guards) is repeated here as a pydantic validator, because the
reconciler re-checks specs with these models: an object stored before a rule
existed, or written while the CRD was older, must still be caught.

Ordering semantics live in one place a reader must not miss: ``Stage.depends_on``
is ``None`` when the user left it out, which means "after the stage listed before
me"; an explicit ``[]`` means "no dependencies".  The CRD therefore never defaults
that field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.config import JsonDict

from stageset.api.common import (
    API_VERSION,
    ApiModel,
    Condition,
    Count,
    DNSLabel,
    DNSSubdomain,
    Duration,
    SecretKeyRef,
    StatusModel,
    Time,
)
from stageset.api.vocabulary import StagePhase

MAX_STAGES = 64

_SHORT = Annotated[str, Field(min_length=1, max_length=253)]


class SourceRef(ApiModel):
    """The source a stage's manifests come from."""

    api_version: _SHORT | None = None
    """API version of the source; defaults to ``stages.metio.wtf/v1``."""
    kind: _SHORT = "GitRepository"
    """Kind of the source."""
    name: DNSSubdomain
    """Name of the source."""
    namespace: DNSLabel | None = None
    """Namespace of the source; defaults to the StageSet's namespace."""


class StageSetRef(ApiModel):
    """Another StageSet this one waits for."""

    name: DNSSubdomain
    """Name of the StageSet."""
    namespace: DNSLabel | None = None
    """Namespace of the StageSet; defaults to this StageSet's namespace."""


class KubeConfigRef(ApiModel):
    """Apply to a remote cluster, with the kubeconfig stored in a Secret of this namespace.

    The Secret is read as the tenant; the kubeconfig may not run commands or read
    local files.
    """

    secret_ref: SecretKeyRef
    """The Secret and key holding the kubeconfig; the key defaults to ``value``."""


class SubstituteRef(ApiModel):
    """A ConfigMap or Secret whose data provides substitution variables."""

    kind: Literal["ConfigMap", "Secret"]
    """Kind of the referent."""
    name: DNSSubdomain
    """Name of the referent, in the StageSet's namespace."""
    optional: bool = False
    """Do not fail when the referent does not exist."""


class PostBuild(ApiModel):
    """Variable substitution (``${var}``) applied to the built manifests."""

    substitute: dict[str, str] = Field(default_factory=dict)
    """Variables and their values; these win over ``substituteFrom``."""
    substitute_from: list[SubstituteRef] = Field(
        default_factory=list, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """ConfigMaps and Secrets providing variables; later entries win."""


class ObjectRef(ApiModel):
    """An object, by API version, kind and name."""

    api_version: _SHORT
    """API version of the object, e.g. ``apps/v1``."""
    kind: _SHORT
    """Kind of the object."""
    name: _SHORT
    """Name of the object."""
    namespace: DNSLabel | None = None
    """Namespace of the object; leave out for cluster-scoped objects."""


class ReadyChecks(ApiModel):
    """How a stage decides it is ready before its dependents start."""

    wait: bool = True
    """Wait for the applied objects to become ready; ``false`` disables waiting."""
    objects: list[ObjectRef] = Field(
        default_factory=list, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """Further objects (not necessarily applied by this stage) to wait for."""


class Stage(ApiModel):
    """One step: the manifests at ``path`` in a source, applied together."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.dependsOn) || !(self.name in self.dependsOn)",
                    "message": "a stage may not depend on itself",
                    "messageExpression": "'stage \"' + self.name + '\" may not depend on itself'",
                    "fieldPath": ".dependsOn",
                },
            ],
        },
    )

    name: DNSLabel
    """Name of the stage, unique within the StageSet (an RFC 1123 label)."""
    source_ref: SourceRef
    """The source holding the stage's manifests."""
    path: Annotated[str, Field(min_length=1, max_length=4096)] = "./"
    """Directory in the source, relative to its root."""
    depends_on: list[DNSLabel] | None = Field(
        default=None, max_length=MAX_STAGES, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """Names of stages of this StageSet that must be ready first.

    Left out, the stage depends on the stage listed before it; ``[]`` means it
    depends on none and starts at once.
    """
    service_account_name: DNSSubdomain | None = None
    """ServiceAccount to apply this stage as, instead of the StageSet's."""
    prune: bool = True
    """Delete objects this stage applied earlier that its manifests no longer contain."""
    timeout: Duration | None = None
    """How long applying and waiting may take; defaults to the StageSet's ``timeout``."""
    force: bool = False
    """Recreate objects whose immutable fields changed."""
    post_build: PostBuild | None = None
    """Variable substitution applied to the built manifests."""
    ready_checks: ReadyChecks | None = None
    """What to wait for before the stage counts as ready."""

    @model_validator(mode="after")
    def _dependencies(self) -> Stage:
        if self.depends_on is None:
            return self
        if self.name in self.depends_on:
            raise ValueError(f'stage "{self.name}" may not depend on itself')
        # The CRD's list-type "set" refuses repeated entries; so do we.
        repeated = sorted({name for name in self.depends_on if self.depends_on.count(name) > 1})
        if repeated:
            names = ", ".join(repeated)
            raise ValueError(f'stage "{self.name}" lists {names} more than once in dependsOn')
        return self


# The rules below sit on the ``stages`` list: only there can a rule see every stage.
# Their messages name the offending stage.  The CEL cost estimator loses the
# length bound of elements that went through ``filter``/``max``/``join``, and then
# prices any string built from them as unbounded, so the offending stage is found
# by index (``map(...).indexOf(false)``), which keeps ``self[i].name`` at 63 bytes.
# Naming the unknown entry as well would repeat that search and, at 64 stages of 64
# entries, exceed the per-expression budget; the reconciler's message names it.
_UNIQUE_NAMES: JsonDict = {
    "rule": "self.all(s, self.exists_one(t, t.name == s.name))",
    "message": "stage names must be unique",
    "messageExpression": (
        "'stage name \"'"
        " + self[self.map(s, self.exists_one(t, t.name == s.name)).indexOf(false)].name"
        " + '\" is used more than once; stage names must be unique'"
    ),
}
_KNOWN_DEPENDENCIES: JsonDict = {
    "rule": "self.all(s, !has(s.dependsOn) || s.dependsOn.all(d, self.exists(t, t.name == d)))",
    "message": "dependsOn may only name stages of this StageSet",
    "messageExpression": (
        "'stage \"' + self[self.map(s, !has(s.dependsOn)"
        " || s.dependsOn.all(d, self.exists(t, t.name == d))).indexOf(false)].name"
        " + '\" depends on a stage that is not in this StageSet;"
        " dependsOn may only name stages of this StageSet'"
    ),
}


class StageSetSpec(ApiModel):
    """The desired state of a StageSet."""

    stages: list[Stage] = Field(
        min_length=1,
        max_length=MAX_STAGES,
        json_schema_extra={
            # Atomic: the order carries meaning (implicit dependencies), so the list
            # must not be merged entry by entry by server-side apply.
            "x-kubernetes-list-type": "atomic",
            "x-kubernetes-validations": [_UNIQUE_NAMES, _KNOWN_DEPENDENCIES],
        },
    )
    """The stages, in order; a stage without ``dependsOn`` runs after the one before it."""
    depends_on: list[StageSetRef] = Field(
        default_factory=list, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """StageSets that must be ready before any stage of this one starts."""
    service_account_name: DNSSubdomain | None = None
    """ServiceAccount every write is made as (impersonated).

    Left out, the controller's own identity is used, which only a controller
    installed in cluster-admin mode accepts.
    """
    kube_config: KubeConfigRef | None = None
    """Apply to the remote cluster this kubeconfig points at."""
    interval: Duration = "10m"
    """How often to reconcile, correcting drift."""
    retry_interval: Duration | None = None
    """How soon to retry after a failure; defaults to ``interval``."""
    timeout: Duration = "5m"
    """Default per-stage timeout for applying and waiting."""
    suspend: bool = False
    """Stop reconciling; objects already applied stay as they are."""

    @model_validator(mode="after")
    def _stage_graph_names(self) -> StageSetSpec:
        names = [stage.name for stage in self.stages]
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ValueError(
                    f'stage name "{name}" is used more than once; stage names must be unique'
                )
            seen.add(name)
        for stage in self.stages:
            unknown = [name for name in stage.depends_on or [] if name not in seen]
            if unknown:
                raise ValueError(
                    f'stage "{stage.name}" depends on unknown stage(s) {", ".join(unknown)}; '
                    "dependsOn may only name stages of this StageSet"
                )
        return self


class StageStatus(StatusModel):
    """Where one stage stands."""

    name: DNSLabel
    """Name of the stage."""
    # The schema stays a bounded string: an older controller must be able to read (and a newer
    # one to write) a phase the other does not know.
    phase: Annotated[StagePhase, WithJsonSchema({"type": "string", "maxLength": 64})]
    """Pending, Applying, Waiting, Ready, Progressing (held at its timeout) or Failed."""
    revision: Annotated[str, Field(max_length=1024)] | None = None
    """Source revision last applied by this stage."""
    message: Annotated[str, Field(max_length=32768)] | None = None
    """Details, e.g. why the stage failed."""
    last_applied_time: Time | None = None
    """When the stage was last applied."""
    objects: Count | None = None
    """How many objects the stage manages."""
    waiting_since: Time | None = None
    """While the stage waits for its objects to become ready: since when (its timeout counts from here)."""

    @field_validator("phase", mode="before")
    @classmethod
    def _unknown_phase_is_pending(cls, value: Any) -> Any:
        # A phase only a newer controller knows reads as Pending: the stage is simply applied again.
        return value if value in set(StagePhase) else StagePhase.PENDING


class InventoryEntry(StatusModel):
    """One object a stage applied."""

    id: Annotated[str, Field(max_length=1024)]
    """``<namespace>_<name>_<group>_<kind>`` (Flux's format; namespace empty when cluster-scoped)."""
    v: Annotated[str, Field(max_length=256)]
    """The API version it was applied with."""
    h: Annotated[str, Field(max_length=64)] | None = None
    """A digest of the manifest last applied, to tell drift from a new revision."""


class StageInventory(StatusModel):
    """The objects one stage owns: what prune and teardown may delete, and nothing else."""

    name: DNSLabel
    """Name of the stage (kept after the stage is removed from the spec, until torn down)."""
    service_account_name: Annotated[str, Field(max_length=253)] | None = None
    """The ServiceAccount the objects were applied as; prune and teardown use it too."""
    entries: list[InventoryEntry] = Field(default_factory=list)
    """The objects."""


class StageSetStatus(StatusModel):
    """The observed state of a StageSet."""

    observed_generation: Count | None = None
    """The ``metadata.generation`` last reconciled."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """``Ready``, ``Reconciling`` and ``Stalled``, as kstatus expects."""
    last_applied_revision: Annotated[str, Field(max_length=1024)] | None = None
    """Source revision of the last complete apply of all stages."""
    stages: list[StageStatus] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Per-stage progress."""
    inventory: list[StageInventory] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Per-stage inventory of applied objects; old and new entries are both kept until prune ran."""
    last_handled_reconcile_at: Annotated[str, Field(max_length=256)] | None = None
    """The last ``reconcile.fluxcd.io/requestedAt`` annotation value acted on."""


class StageSet(ApiModel):
    """A set of stages applied in dependency order, as the tenant's ServiceAccount."""

    api_version: Literal["stages.metio.wtf/v1"] = API_VERSION
    """``stages.metio.wtf/v1``."""
    kind: Literal["StageSet"] = "StageSet"
    """``StageSet``."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Standard object metadata."""
    spec: StageSetSpec
    """The desired state."""
    status: StageSetStatus | None = None
    """The observed state, written by the controller."""
