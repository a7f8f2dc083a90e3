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

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.config import JsonDict

from stageset.api.actions import ActionLedger, StageActions
from stageset.api.common import (
    API_VERSION,
    ONE_KUBECONFIG,
    THIS_CLUSTER,
    ApiModel,
    Condition,
    Count,
    DNSLabel,
    DNSSubdomain,
    Duration,
    LocalObjectRef,
    SecretKeyRef,
    StatusModel,
    Time,
    duration_seconds,
    one_kubeconfig_ref,
)
from stageset.api.history import StageHistory
from stageset.api.release import (
    MAX_WINDOWS,
    MIN_VERSION_RULE,
    MinVersion,
    PendingUpdate,
    Promotion,
    PromotionState,
    Rollback,
    StageSnapshot,
    UpdateWindow,
    WindowScope,
    checked_min_version,
)
from stageset.api.sourceref import SourceRef
from stageset.api.target import TargetRef
from stageset.api.vocabulary import StagePhase

MAX_STAGES = 64
MAX_DEPENDENCIES = 32
"""Entries of ``spec.dependsOn`` (a bound the CEL cost estimate of its rules needs)."""
MAX_SUPERSEDES = 16
"""StageSets in ``spec.supersedes``."""
DEFAULT_TIMEOUT = "15m"
"""``spec.timeout`` when left out, as in the reference."""
MAX_PATCHES = 32
"""Patches per stage."""
MAX_PATCH_BYTES = 32768
"""Bytes of one inline ``patch``."""
MAX_JSON6902_OPERATIONS = 64
MAX_CONFLICT_RULES = 32
MAX_CHECKS = 64
"""``readyChecks.checks`` entries per stage."""
MAX_HEALTH_EXPRS = 16
"""``readyChecks.exprs`` entries per stage (one per kind)."""
MAX_CEL_EXPRESSION = 2048
"""Characters of one health-check expression: a first bound on what a tenant's expression may cost."""

_SHORT = Annotated[str, Field(min_length=1, max_length=253)]

CelExpression = Annotated[str, Field(min_length=1, max_length=MAX_CEL_EXPRESSION)]
"""A CEL expression over the object's top-level fields (``metadata``, ``spec``, ``status`` ...)."""


DEPENDENCY_API_VERSION_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                                  r"[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
"""``group/version`` or a core ``version``: a DNS subdomain, then a DNS label."""
KIND_PATTERN = r"^[A-Za-z][A-Za-z0-9]*$"

_IS_STAGESET = f"has(self.apiVersion) && self.apiVersion == '{API_VERSION}' && self.kind == 'StageSet'"

_API_VERSION_WITH_KIND: JsonDict = {
    "rule": "has(self.apiVersion) == has(self.kind)",
    "message": "set apiVersion and kind together (an object of that kind), or neither (a StageSet)",
    "fieldPath": ".kind",
}
_MIN_VERSION_OF_STAGESETS: JsonDict = {
    "rule": f"!has(self.minVersion) || !has(self.kind) || ({_IS_STAGESET})",
    "message": "minVersion applies to StageSet dependencies only (a version floor on what it applied); "
               "use readyExpr to say when an object of another kind is ready",
    "fieldPath": ".minVersion",
}
_READY_EXPR_OF_OTHER_KINDS: JsonDict = {
    "rule": f"!has(self.readyExpr) || (has(self.kind) && !({_IS_STAGESET}))",
    "message": "readyExpr applies to dependencies of other kinds (apiVersion and kind set); a StageSet "
               "dependency is ready when it is Ready at its generation (see minVersion)",
    "fieldPath": ".readyExpr",
}


class StageSetRef(ApiModel):
    """What this StageSet waits for before any of its stages starts.

    Without ``apiVersion`` and ``kind``: another StageSet, Ready at its current generation, no new
    revision held back by its update windows, and (with ``minVersion``) applied at a version at or
    above it.  With them: any object of that kind (an operator's CustomResourceDefinition, a
    database claim, a HelmRelease), ready when the kstatus rules say it is Current, or when
    ``readyExpr`` is true.  Either is read, and watched while waited for, as this StageSet's
    ServiceAccount."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        MIN_VERSION_RULE, _API_VERSION_WITH_KIND, _MIN_VERSION_OF_STAGESETS, _READY_EXPR_OF_OTHER_KINDS]})

    api_version: Annotated[str, Field(min_length=1, max_length=253,
                                      pattern=DEPENDENCY_API_VERSION_PATTERN)] | None = None
    """API version of the object, e.g. ``example.com/v1`` or ``v1`` (the core group); set together
    with ``kind``.  Left out (with ``kind``): a StageSet."""
    kind: Annotated[str, Field(min_length=1, max_length=63, pattern=KIND_PATTERN)] | None = None
    """Kind of the object, e.g. ``CustomResourceDefinition``, ``HelmRelease``; set together with
    ``apiVersion``.  ``stages.metio.wtf/v1`` ``StageSet`` is the same as leaving both out."""
    name: DNSSubdomain
    """Name of the StageSet (or of the object of ``kind``)."""
    namespace: DNSLabel | None = None
    """Namespace of the StageSet or object; defaults to this StageSet's.  Ignored for a
    cluster-scoped kind (a CustomResourceDefinition, a Namespace ...), which discovery tells."""
    min_version: MinVersion | None = None
    """A semantic version (``5.2.0``, ``v5.2``) the StageSet's applied revision must be at or above:
    every revision in its ``status.lastAppliedRevision`` must be a version tag (``v5.2.1@sha1:…``)
    no lower than this.  Until then this StageSet waits (``DependencyNotReady``).  StageSets only."""
    ready_expr: CelExpression | None = None
    """A CEL expression that is true when the object is ready, instead of the kstatus rules (other
    kinds only).  Variables as in ``readyChecks.exprs``: ``apiVersion``, ``kind``, ``metadata``,
    ``spec``, ``status`` (an absent one is an empty map) and ``self``, the whole object; e.g.
    ``status.phase == 'Bound'``.  An object being deleted, or whose ``status.observedGeneration``
    is behind its ``metadata.generation``, is not ready whatever it says."""

    @field_validator("min_version")
    @classmethod
    def _semver(cls, value: str | None) -> str | None:
        return checked_min_version(value)

    @model_validator(mode="after")
    def _kinds(self) -> StageSetRef:
        if (self.api_version is None) != (self.kind is None):
            raise ValueError(_API_VERSION_WITH_KIND["message"])
        if self.min_version is not None and not self.names_stageset:
            raise ValueError(_MIN_VERSION_OF_STAGESETS["message"])
        if self.ready_expr is not None and self.names_stageset:
            raise ValueError(_READY_EXPR_OF_OTHER_KINDS["message"])
        return self

    @property
    def names_stageset(self) -> bool:
        """Whether this entry is a StageSet dependency (no ``kind``, or ``stages.metio.wtf/v1`` StageSet)."""
        return self.kind is None or (self.api_version == API_VERSION and self.kind == "StageSet")


DependencyRef = StageSetRef
"""A ``spec.dependsOn`` entry: a StageSet, or an object of any kind (the older name stays)."""


class SupersededRef(ApiModel):
    """A StageSet whose objects this one takes over in place (``spec.supersedes``)."""

    name: DNSSubdomain
    """Name of the StageSet."""
    namespace: DNSLabel | None = None
    """Namespace of the StageSet; defaults to this StageSet's namespace."""

    def key(self, namespace: str) -> tuple[str, str]:
        """``(namespace, name)``, the namespace defaulted to ``namespace`` (this StageSet's)."""
        return self.namespace or namespace, self.name


_UNIQUE_SUPERSEDED: JsonDict = {
    "rule": "self.all(a, self.exists_one(b, b.name == a.name && (has(b.__namespace__) ? "
            "b.__namespace__ : '') == (has(a.__namespace__) ? a.__namespace__ : '')))",
    "message": "supersedes names a StageSet more than once",
}




class KubeConfigRef(ApiModel):
    """Apply to a remote cluster: a kubeconfig stored in a Secret of this namespace (``secretRef``), or
    a ConfigMap naming the cluster, reached with a token this cluster issues for the ServiceAccount
    (``configMapRef``, workload identity: nothing secret is stored).

    Both are read as the tenant.  A kubeconfig may not run commands or read local files; a ConfigMap's
    keys are Flux's: ``provider`` (``generic``), ``address``, ``ca.crt``, and optionally
    ``audiences`` and ``serviceAccountName``.
    """

    model_config = ConfigDict(json_schema_extra=one_kubeconfig_ref)

    secret_ref: SecretKeyRef | None = None
    """The Secret and key holding the kubeconfig; the key defaults to ``value``."""
    config_map_ref: LocalObjectRef | None = None
    """The ConfigMap naming the remote cluster (``provider: generic``, ``address``, ``ca.crt``,
    ``audiences``, ``serviceAccountName``): the controller asks this cluster for a token for the
    ServiceAccount (audience: the address) and talks to the remote as that identity, without
    impersonation.  Exclusive with ``secretRef``."""

    @model_validator(mode="after")
    def _exactly_one(self) -> KubeConfigRef:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError(ONE_KUBECONFIG["message"])
        return self


class DecryptionProvider(StrEnum):
    """Who decrypts: ``sops`` is the only provider (as in Flux and the reference)."""

    SOPS = "sops"


class DecryptionSecretRef(ApiModel):
    """The Secret holding the decryption keys, in the StageSet's own namespace."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.__namespace__)",
                    "message": "decryption.secretRef.namespace: the key Secret is always read from the "
                               "StageSet's own namespace, as its ServiceAccount; a Secret of another "
                               "namespace cannot be used",
                    "fieldPath": ".namespace",
                },
            ],
        },
    )

    name: DNSSubdomain
    """Name of the Secret; entries ending in ``.agekey`` hold age identities, entries ending in
    ``.asc`` armored OpenPGP private keys."""
    namespace: DNSLabel | None = None
    """Refused when set: the key Secret is always read from the StageSet's own namespace."""

    @field_validator("namespace")
    @classmethod
    def _own_namespace_only(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError("decryption.secretRef.namespace: the key Secret is always read from the "
                             "StageSet's own namespace, as its ServiceAccount; a Secret of another "
                             "namespace cannot be used")
        return value


class Decryption(ApiModel):
    """Decrypt SOPS-encrypted files of every stage's source before they are built.

    The key Secret is read as the StageSet's ``serviceAccountName`` (the controller itself only
    in cluster-admin mode), every pass, so a rotated key is used on the next pass.  Files are
    decrypted with age and OpenPGP keys only; cloud KMS keys are not used.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.secretRef)",
                    "message": "decryption.secretRef is required: this controller decrypts with the age "
                               "(*.agekey) and OpenPGP (*.asc) keys of a Secret in the StageSet's "
                               "namespace; cloud KMS keys are not supported",
                    "fieldPath": ".secretRef",
                },
            ],
        },
    )

    provider: Annotated[DecryptionProvider, WithJsonSchema({"type": "string", "enum": ["sops"]})]
    """The decryption provider: ``sops``."""
    secret_ref: DecryptionSecretRef | None = None
    """The Secret holding the keys (required: cloud KMS, which the reference allows without one,
    is not supported)."""

    @model_validator(mode="after")
    def _keys_required(self) -> Decryption:
        if self.secret_ref is None:
            raise ValueError("decryption.secretRef is required: this controller decrypts with the age "
                             "(*.agekey) and OpenPGP (*.asc) keys of a Secret in the StageSet's "
                             "namespace; cloud KMS keys are not supported")
        return self


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

    api_version: _SHORT | None = None
    """API version of the object, e.g. ``apps/v1``; left out, the core group (``v1``)."""
    kind: _SHORT
    """Kind of the object."""
    name: _SHORT
    """Name of the object."""
    namespace: DNSLabel | None = None
    """Namespace of a namespaced object; defaults to the StageSet's.  Ignored for a cluster-scoped
    kind (a CustomResourceDefinition, a Namespace ...), which the target cluster's discovery tells."""

    @property
    def api_version_or_core(self) -> str:
        return self.api_version or "v1"


class OnTimeout(StrEnum):
    """What a stage whose readiness wait runs out of time does."""

    HOLD = "Hold"
    """The stage holds (phase ``Progressing``, reason ``StageProgressing``): its objects stay as
    applied, its dependents wait, and it is checked again at ``retryInterval``."""
    ROLLBACK = "Rollback"
    """The timeout fails the stage (phase ``Failed``, reason ``StageFailed``), as any failure does:
    with ``rollbackOnFailure: true`` the release is rolled back to its last good revisions."""




class HealthCheckExpr(ApiModel):
    """CEL expressions that judge the readiness of every object of one kind, as Flux's
    ``healthCheckExprs``.

    The variables are the object's ``apiVersion``, ``kind``, ``metadata``, ``spec`` and
    ``status`` (one the object lacks is an empty map), and ``self``, the whole object (for other
    top-level fields: ``self.data``).  First, as kstatus does, an object whose
    ``status.observedGeneration`` is behind its ``metadata.generation`` is in progress.  Then
    ``failed`` wins over ``current``, which wins over ``inProgress``; none true means in progress.
    An expression that fails to evaluate (e.g. a missing key) counts as not true and its error is
    shown while the stage waits.
    """

    api_version: Annotated[str, Field(min_length=1, max_length=253)]
    """API version of the kind, e.g. ``cert-manager.io/v1`` (the group is what is matched)."""
    kind: Annotated[str, Field(min_length=1, max_length=63)]
    """Kind the expressions apply to, e.g. ``Certificate``."""
    current: CelExpression | None = None
    """True when the object reached its desired state (ready).  Left out, as in the reference: the
    object is ready when the kstatus rules say so (``failed`` still fails it)."""
    in_progress: CelExpression | None = None
    """True while the object is still converging."""
    failed: CelExpression | None = None
    """True when the object failed: the stage fails at once instead of waiting for its timeout."""


_UNIQUE_EXPR_KINDS: JsonDict = {
    "rule": "self.all(e, self.exists_one(f, f.apiVersion == e.apiVersion && f.kind == e.kind))",
    "message": "readyChecks.exprs may name each apiVersion and kind only once",
}


_CHECKS_OR_OBJECTS: JsonDict = {
    "rule": "!has(self.checks) || !has(self.objects) || size(self.checks) == 0 || size(self.objects) == 0",
    "message": "readyChecks.objects is the old name of readyChecks.checks; set only checks",
    "fieldPath": ".objects",
}


class ReadyChecks(ApiModel):
    """How a stage decides it is ready before its dependents start.

    The wait set is every object the stage applied plus ``checks``; with ``disableWait: true``
    (or ``wait: false``) only ``checks``.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_CHECKS_OR_OBJECTS]})

    wait: bool = True
    """Wait for the applied objects to become ready; ``false`` waits only for ``checks``."""
    disable_wait: bool = False
    """Do not wait for the applied objects, only for ``checks`` (the reference's spelling of
    ``wait: false``)."""
    timeout: Duration | None = None
    """How long the readiness wait may take; wins over the stage's and the StageSet's ``timeout``.
    Zero falls through to those."""
    checks: list[ObjectRef] = Field(
        default_factory=list, max_length=MAX_CHECKS, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """Further objects to wait for, applied by this stage or not (another release's Deployment,
    the CustomResourceDefinition an operator installs), judged like the applied ones."""
    objects: list[ObjectRef] = Field(
        default_factory=list, max_length=MAX_CHECKS, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """Deprecated: the old name of ``checks``, with the same meaning; may not be set together with it."""

    @property
    def waits_for_applied(self) -> bool:
        """Whether the applied objects are waited for (``checks`` always are)."""
        return self.wait and not self.disable_wait

    @property
    def references(self) -> list[ObjectRef]:
        """``checks`` (or their old name ``objects``)."""
        return self.checks or self.objects

    @model_validator(mode="after")
    def _one_name(self) -> ReadyChecks:
        if self.checks and self.objects:
            raise ValueError(_CHECKS_OR_OBJECTS["message"])
        return self
    exprs: list[HealthCheckExpr] = Field(
        default_factory=list, max_length=MAX_HEALTH_EXPRS,
        json_schema_extra={"x-kubernetes-list-type": "atomic",
                           "x-kubernetes-validations": [_UNIQUE_EXPR_KINDS]},
    )
    """CEL health checks per kind (see ``HealthCheckExpr``); kinds without one use the kstatus rules."""

    @model_validator(mode="after")
    def _unique_kinds(self) -> ReadyChecks:
        seen: set[tuple[str, str]] = set()
        for expr in self.exprs:
            key = (expr.api_version, expr.kind)
            if key in seen:
                raise ValueError("readyChecks.exprs may name each apiVersion and kind only once")
            seen.add(key)
        return self


# -- patches -------------------------------------------------------------------------------------

_SELECTOR = Annotated[str, Field(max_length=1024)]


class PatchTarget(ApiModel):
    """Which built objects a patch applies to, as kustomize selects them; unset fields match any.

    ``name`` and ``namespace`` are regular expressions anchored at both ends (kustomize's
    rule); ``labelSelector`` and ``annotationSelector`` use label-selector syntax
    (``app=web,tier!=db``).
    """

    group: Annotated[str, Field(max_length=253)] | None = None
    """API group (empty string: the core group)."""
    version: Annotated[str, Field(max_length=63)] | None = None
    """API version, e.g. ``v1``."""
    kind: Annotated[str, Field(max_length=63)] | None = None
    """Kind, e.g. ``Deployment``."""
    name: _SELECTOR | None = None
    """Name (a regular expression)."""
    namespace: _SELECTOR | None = None
    """Namespace as written in the manifests (a regular expression)."""
    label_selector: _SELECTOR | None = None
    """Label selector, e.g. ``app=web``."""
    annotation_selector: _SELECTOR | None = None
    """Annotation selector."""


class Json6902Operation(ApiModel):
    """One RFC 6902 operation."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!(self.op in ['move', 'copy']) || has(self.from)",
         "message": "move and copy operations need from"},
    ]})

    op: Literal["add", "remove", "replace", "move", "copy", "test"]
    """The operation."""
    path: Annotated[str, Field(max_length=1024, pattern=r"^(/.*)?$")]
    """JSON pointer to the field, e.g. ``/spec/replicas``."""
    from_: Annotated[str, Field(max_length=1024, pattern=r"^(/.*)?$")] | None = Field(
        default=None, alias="from")
    """Source pointer of ``move`` and ``copy``."""
    value: Annotated[Any, WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True})] = None
    """The value of ``add``, ``replace`` and ``test`` (any JSON)."""

    @model_validator(mode="after")
    def _operands(self) -> Json6902Operation:
        # Only here: the CRD's CEL cannot see a field of any type (value), so the reconciler's
        # re-check reports a missing value (InvalidSpec naming the patch).
        if self.op in ("move", "copy") and self.from_ is None:
            raise ValueError("move and copy operations need from")
        if self.op in ("add", "replace", "test") and self.value is None:
            raise ValueError("add, replace and test operations need value")
        return self


class Patch(ApiModel):
    """A kustomize patch applied to the stage's built objects, after the build and before
    ``postBuild`` substitution.

    Exactly one of ``patch`` (a strategic merge patch or a JSON 6902 patch, as text, told apart
    the way kustomize tells them apart) and ``json6902`` (JSON 6902 operations as structured
    YAML).  Without ``target`` a strategic merge patch applies to the object it names; a JSON
    6902 patch always needs a ``target``.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.patch) != has(self.json6902)",
         "message": "a patch needs exactly one of patch and json6902"},
        {"rule": "!has(self.json6902) || has(self.target)",
         "message": "a json6902 patch needs a target"},
    ]})

    patch: Annotated[str, Field(min_length=1, max_length=MAX_PATCH_BYTES)] | None = None
    """A strategic merge patch, or a JSON 6902 patch, as YAML or JSON text."""
    json6902: list[Json6902Operation] | None = Field(
        default=None, min_length=1, max_length=MAX_JSON6902_OPERATIONS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """JSON 6902 operations, applied in order."""
    target: PatchTarget | None = None
    """Which objects to patch; left out, a strategic merge patch patches the object it names."""

    @model_validator(mode="after")
    def _one_form(self) -> Patch:
        if (self.patch is None) == (self.json6902 is None):
            raise ValueError("a patch needs exactly one of patch and json6902")
        if self.json6902 is not None and self.target is None:
            raise ValueError("a json6902 patch needs a target")
        return self


# -- deletion policy -----------------------------------------------------------------------------

class DeletionPolicy(StrEnum):
    """What deleting a StageSet does to the objects it applied."""

    DELETE = "Delete"
    """Delete them, dependents first (a ``prune: false`` stage's are released instead)."""
    ORPHAN = "Orphan"
    """Release every one of them: the owner labels are removed, the objects stay (another StageSet
    may then adopt them in place)."""


# -- drift detection -----------------------------------------------------------------------------

class DriftMode(StrEnum):
    """What a change nobody committed to an applied object leads to."""

    CORRECT = "Correct"
    """Restore it (a ``DriftCorrected`` event names the objects): what the reference always does."""
    WARN = "Warn"
    """Leave it as it is and report it: the ``Drifted`` condition, a ``DriftDetected`` event,
    ``status.drifted``.  New revisions are still applied."""


class DriftDetection(ApiModel):
    """How changes to applied objects made outside Git are handled (our extension: the reference
    always corrects them)."""

    mode: DriftMode = DriftMode.CORRECT
    """``Correct`` (the default) or ``Warn``."""


MAX_DRIFTED = 64
"""Drifted objects ``status.drifted`` lists (the ``Drifted`` condition counts all of them)."""
MAX_DRIFT_FIELDS = 16
"""Field paths listed per drifted object."""


class DriftedObject(StatusModel):
    """An object a ``Warn`` StageSet left as someone else changed it."""

    stage: DNSLabel
    """The stage that applied it."""
    id: Annotated[str, Field(max_length=1024)]
    """``<namespace>_<name>_<group>_<kind>`` (as ``status.inventory`` names it)."""
    fields: list[Annotated[str, Field(max_length=512)]] = Field(
        default_factory=list, max_length=MAX_DRIFT_FIELDS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """The field paths that differ from what was applied (``spec.replicas``); empty when it was deleted."""
    deleted: bool | None = None
    """True when the object is gone (or no longer carries the owner labels)."""


# -- conflict policies ---------------------------------------------------------------------------

class ConflictAction(StrEnum):
    """What to do with an object whose change the apiserver refuses as immutable."""

    FAIL = "Fail"
    """Fail the stage, naming the object and the field (the default)."""
    RECREATE = "Recreate"
    """Delete the object, wait until it is gone, and create it again (``force: true``)."""
    KEEP_EXISTING = "KeepExisting"
    """Leave the live object exactly as it is (it is created when absent, never updated)."""


class Preflight(StrEnum):
    """What a stage asks the apiserver before its first write."""

    DRY_RUN = "DryRun"
    """Every object is server-side dry-run as the stage's identity: a denial, a schema error or an
    admission webhook's refusal fails the stage before anything is written (the default)."""
    ACCESS_REVIEW = "AccessReview"
    """Only RBAC is asked before the first write: one SelfSubjectAccessReview per verb, kind and
    namespace the stage writes (as its identity), instead of a dry-run per object new to the
    inventory.  A denial still fails the stage before anything is written; a schema error or an
    admission refusal is found by the write itself, so objects written before it stay written."""


_DATA_KINDS = ("PersistentVolumeClaim", "PersistentVolume")


class ConflictTarget(ApiModel):
    """The objects a rule governs; unset fields match any object."""

    api_version: Annotated[str, Field(max_length=253)] | None = None
    """API version, e.g. ``batch/v1`` (the group is what is matched)."""
    kind: Annotated[str, Field(min_length=1, max_length=63)] | None = None
    """Kind, e.g. ``Job``."""
    name: Annotated[str, Field(max_length=253)] | None = None
    """Name."""
    namespace: Annotated[str, Field(max_length=63)] | None = None
    """Namespace (after the StageSet's namespace is defaulted)."""


class ConflictRule(ApiModel):
    """An action for the immutable-field conflicts of the objects ``target`` matches."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!(self.action == 'Recreate' && has(self.target.kind)"
                " && (self.target.kind == 'PersistentVolumeClaim' || self.target.kind == 'PersistentVolume'))"
                " || self.allowDataLoss",
        "message": "recreating a PersistentVolumeClaim or PersistentVolume deletes its data; "
                   "set allowDataLoss: true on the rule to allow it",
    }]})

    target: ConflictTarget
    """The objects this rule governs."""
    action: ConflictAction
    """What to do on a conflict."""
    allow_data_loss: bool = False
    """Required to ``Recreate`` a PersistentVolumeClaim or PersistentVolume."""

    @model_validator(mode="after")
    def _data_loss(self) -> ConflictRule:
        if self.action is ConflictAction.RECREATE and self.target.kind in _DATA_KINDS \
                and not self.allow_data_loss:
            raise ValueError("recreating a PersistentVolumeClaim or PersistentVolume deletes its data; "
                             "set allowDataLoss: true on the rule to allow it")
        return self


class ConflictPolicy(ApiModel):
    """Per-object answers to immutable-field conflicts (a Job's template, a Service's ``clusterIP``)."""

    default: ConflictAction | None = None
    """The action for objects no rule matches; left out: ``Recreate`` with ``force: true``, else ``Fail``."""
    rules: list[ConflictRule] = Field(
        default_factory=list, max_length=MAX_CONFLICT_RULES,
        json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Rules, first match wins."""


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
                {
                    "rule": "!(has(self.force) && self.force && has(self.conflictPolicy)"
                            " && has(self.conflictPolicy.default)"
                            " && self.conflictPolicy.default != 'Recreate')",
                    "message": "force: true means conflictPolicy.default: Recreate; "
                               "set one or the other",
                    "fieldPath": ".conflictPolicy.default",
                },
            ],
        },
    )

    name: DNSLabel
    """Name of the stage, unique within the StageSet (an RFC 1123 label)."""
    source_ref: SourceRef
    """The source holding the stage's manifests: our ``GitRepository`` unless ``kind`` says otherwise (or
    the controller runs with ``--default-source-kind=ExternalArtifact``, the reference's default), or a
    Flux source: ``ExternalArtifact``, ``GitRepository``, ``OCIRepository``, ``Bucket``."""
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
    """Recreate objects whose immutable fields changed (``conflictPolicy.default: Recreate``)."""
    conflict_policy: ConflictPolicy | None = None
    """What to do, object by object, when the apiserver refuses a change as immutable."""
    preflight: Preflight | None = None
    """What is asked before the stage's first write: ``DryRun`` (left out) dry-runs every object, so
    any refusal fails the stage before anything is written; ``AccessReview`` asks only RBAC (one
    access review per verb, kind and namespace), cheaper, and leaves schema and admission errors to
    the writes themselves."""
    patches: list[Patch] = Field(
        default_factory=list, max_length=MAX_PATCHES, json_schema_extra={"x-kubernetes-list-type": "atomic"}
    )
    """kustomize patches applied, in order, to the built objects before ``postBuild`` substitution."""
    post_build: PostBuild | None = None
    """Variable substitution applied to the built (and patched) manifests."""
    ready_checks: ReadyChecks | None = None
    """What to wait for before the stage counts as ready."""
    on_timeout: OnTimeout | None = None
    """What a readiness wait that runs out of time does; defaults to the StageSet's ``onTimeout``."""
    promotion: Promotion | None = None
    """What must happen after this stage is Ready before the stages that depend on it start: a
    ``soak``, a manual promotion (``requireManualPromotion``), or both (the soak first)."""
    apply_helm_hook_resources: bool | None = None
    """Objects with ``helm.sh/hook`` annotations are applied as ordinary objects (``true``, the
    reference's default); ``false``, which would leave them out, is not supported."""
    actions: StageActions | None = None
    """Steps around the stage: ``pre`` (before it is built; a failure applies nothing), ``post`` (after
    it is ready; Ready only when they pass), ``onFailure`` (best effort when it fails).  ``pre`` and
    ``post`` run once per revision; every action runs as the stage's ServiceAccount."""

    def conflict_default(self) -> ConflictAction:
        """The action for conflicts no rule matches."""
        if self.conflict_policy is not None and self.conflict_policy.default is not None:
            return self.conflict_policy.default
        return ConflictAction.RECREATE if self.force else ConflictAction.FAIL

    def ready_timeout(self, spec_timeout: str) -> str:
        """The readiness wait's timeout: ``readyChecks.timeout``, else the stage's, else ``spec_timeout``
        (a zero value falls through)."""
        for value in (self.ready_checks.timeout if self.ready_checks else None, self.timeout):
            if value and duration_seconds(value) > 0:
                return value
        return spec_timeout

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

    @model_validator(mode="after")
    def _force_or_policy(self) -> Stage:
        if self.force and self.conflict_policy is not None and self.conflict_policy.default is not None \
                and self.conflict_policy.default is not ConflictAction.RECREATE:
            raise ValueError(f'stage "{self.name}": force: true means conflictPolicy.default: Recreate; '
                             "set one or the other")
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


_ONE_TARGET: JsonDict = {
    "rule": "!(has(self.kubeConfig) && has(self.targetRef))",
    "message": "kubeConfig and targetRef are exclusive: name a StageTarget or give a kubeconfig, not both",
    "fieldPath": ".targetRef", "reason": "FieldValueForbidden",
}


class StageSetSpec(ApiModel):
    """The desired state of a StageSet."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_ONE_TARGET]})

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
        default_factory=list, max_length=MAX_DEPENDENCIES,
        json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """StageSets, and objects of other kinds (``apiVersion`` and ``kind`` set), that must be ready
    before any stage of this one starts."""
    supersedes: list[SupersededRef] = Field(
        default_factory=list, max_length=MAX_SUPERSEDES,
        json_schema_extra={"x-kubernetes-list-type": "atomic",
                           "x-kubernetes-validations": [_UNIQUE_SUPERSEDED]})
    """StageSets whose objects this one takes over: an object this StageSet renders that one of them
    holds is adopted in place (same object, new owner labels; nothing deleted or created) instead of
    an ``OwnershipConflict``, and that StageSet lets it go.  Its actions' ledger comes along, so a
    ``pre``/``post`` action it ran for the revision does not run again.  Only what this StageSet's
    ServiceAccount could take over by hand: it must be allowed to ``get`` and ``patch`` each StageSet
    named here (else ``SupersedeDenied``, and nothing is taken).  An extension: the reference has no
    such field (see the tenancy tiers page: "Moving from tier 1 to tier 2")."""
    service_account_name: DNSSubdomain | None = None
    """ServiceAccount every write is made as (impersonated).

    Left out, the controller's own identity is used, which only a controller
    installed in cluster-admin mode accepts.
    """
    kube_config: KubeConfigRef | None = None
    """Apply to a remote cluster: the one a kubeconfig Secret points at (``secretRef``), or the one a
    ConfigMap names, reached by workload identity (``configMapRef``)."""
    target_ref: TargetRef | None = None
    """Apply to the cluster a StageTarget of the platform names (exclusive with ``kubeConfig``).  The
    target and its kubeconfig are read by the controller; this namespace must be one of the target's
    ``allowedNamespaces``.  Writes there still impersonate the stage's ServiceAccount."""
    target_namespace: DNSLabel | None = None
    """Put every namespaced object of every stage into this namespace, overriding what its manifest
    says (Flux's ``targetNamespace``); cluster-scoped objects are left as they are.  Bounded by the
    stage identity's rights there, like any write.  Changing it moves the objects: created in the new
    namespace, the old ones pruned once every stage is Ready."""
    deletion_policy: DeletionPolicy = DeletionPolicy.DELETE
    """What deleting this StageSet does to its objects: ``Delete`` them (a ``prune: false`` stage's
    are released), or ``Orphan`` — release every one (owner labels removed, objects kept, an
    ``Orphaned`` event lists them)."""
    decryption: Decryption | None = None
    """Decrypt SOPS-encrypted files of the stages' sources (age and OpenPGP keys from a Secret)."""
    interval: Duration | None = None
    """How often to reconcile, correcting drift; defaults to the controller's ``--default-interval``
    (10m unless the platform team changed it)."""
    drift_detection_interval: Duration | None = None
    """How often to re-apply a Ready StageSet to correct drift, when more often than ``interval``
    (a longer value has no effect).  A change is noticed by watch within seconds anyway, where the
    controller can watch what was applied (``--max-drift-watches``): this is the backstop."""
    drift_detection: DriftDetection | None = None
    """Correct drift (the default) or only report it (``mode: Warn``)."""
    retry_interval: Duration | None = None
    """How soon to retry after a failure; defaults to ``interval``."""
    timeout: Duration = DEFAULT_TIMEOUT
    """Default per-stage timeout for applying and waiting (the reference's default, 15m)."""
    on_timeout: OnTimeout = OnTimeout.HOLD
    """What a stage whose readiness wait runs out of time does: ``Hold`` (keep waiting, its
    dependents too) or ``Rollback`` (the timeout fails the stage; with ``rollbackOnFailure`` the
    release is rolled back).  A stage's own ``onTimeout`` wins."""
    rollback_on_failure: bool = False
    """When a stage fails (or times out under ``onTimeout: Rollback``) after its source moved to a
    new revision: re-apply every stage that moved in this release at its last good revision
    (``status.lastAppliedSnapshot``), dependents first, and delete the objects the new revision
    added.  The failed revisions are not applied again until a source or the spec changes."""
    update_windows: list[UpdateWindow] = Field(
        default_factory=list, max_length=MAX_WINDOWS, json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """When new revisions may roll out.  A Deny window that is open holds them; with any Allow
    declared, they roll out only while an Allow is open (and no Deny).  Deleting a StageSet is never
    held."""
    window_scope: WindowScope | None = None
    """What a closed window holds back: ``Updates`` (the default: new revisions wait, the applied
    ones keep being corrected) or ``All`` (nothing is applied while closed)."""
    suspend: bool = False
    """Stop reconciling; objects already applied stay as they are."""

    @property
    def drift_mode(self) -> DriftMode:
        return self.drift_detection.mode if self.drift_detection is not None else DriftMode.CORRECT

    def interval_seconds(self, default: float) -> float:
        """``interval`` in seconds; ``default`` (the controller's ``--default-interval``) when unset."""
        return duration_seconds(self.interval) if self.interval else default

    def retry_seconds(self, default: float) -> float:
        """How soon to retry after a failure: ``retryInterval``, else the interval."""
        return duration_seconds(self.retry_interval) if self.retry_interval \
            else self.interval_seconds(default)

    def requeue_when_ready(self, default: float) -> float:
        """Seconds until a Ready StageSet is applied again: the interval, or
        ``driftDetectionInterval`` when shorter."""
        interval = self.interval_seconds(default)
        if self.drift_detection_interval and duration_seconds(self.drift_detection_interval) > 0:
            return min(interval, duration_seconds(self.drift_detection_interval))
        return interval

    @model_validator(mode="after")
    def _one_target(self) -> StageSetSpec:
        if self.kube_config is not None and self.target_ref is not None:
            raise ValueError(str(_ONE_TARGET["message"]))
        return self

    @model_validator(mode="after")
    def _superseded_once(self) -> StageSetSpec:
        named = [(ref.namespace or "", ref.name) for ref in self.supersedes]
        if len(set(named)) != len(named):
            raise ValueError(str(_UNIQUE_SUPERSEDED["message"]))
        return self

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
    promotion_state: PromotionState | None = None
    """Where the stage stands against its promotion gate (absent without one)."""
    last_handled_promotion: Annotated[str, Field(max_length=256)] | None = None
    """The ``stages.metio.wtf/promote`` token last acted on for this stage (each token acts once)."""
    actions: ActionLedger | None = None
    """The ledger of the stage's actions: which ran for its current revision, and the one in progress."""

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


class AppliedTarget(StatusModel):
    """The remote cluster a stage's objects were applied on, and how it was reached: never a credential."""

    id: Annotated[str, Field(max_length=1024)]
    """The cluster's stable id: its server URL and CA fingerprint (``https://host:6443#<16 hex>``)."""
    kube_config: SecretKeyRef | None = None
    """The kubeConfig Secret (and key) it was reached through, to reach it again after a move."""
    config_map_ref: LocalObjectRef | None = None
    """Or the kubeConfig ConfigMap (workload identity) it was reached through."""
    target_ref: TargetRef | None = None
    """Or the platform's StageTarget it was reached through (``spec.targetRef``)."""


class StageInventory(StatusModel):
    """The objects one stage owns: what prune and teardown may delete, and nothing else."""

    name: DNSLabel
    """Name of the stage (kept after the stage is removed from the spec, until torn down)."""
    service_account_name: Annotated[str, Field(max_length=253)] | None = None
    """The ServiceAccount the objects were applied as; prune and teardown use it too."""
    entries: list[InventoryEntry] = Field(default_factory=list)
    """The objects."""
    target: AppliedTarget | None = None
    """The remote cluster they were applied on (absent: this cluster)."""

    @property
    def target_id(self) -> str:
        return self.target.id if self.target is not None else THIS_CLUSTER


class PreviousTargets(StatusModel):
    """A move to another cluster in flight: what is still to be cleaned up where the stages were before."""

    since: Time
    """When the move started."""
    cleanup_since: Time | None = None
    """When every stage was first Ready on the new cluster and its cleanup began: it is given up
    ``--max-teardown-wait`` after."""
    inventory: list[StageInventory] = Field(
        default_factory=list, json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Per stage and previous target, the objects still there (each names its target)."""
    deleted: Count | None = None
    """Objects deleted there so far (told by the ``Retargeted`` event when the move is done)."""
    released: Count | None = None
    """Objects of ``prune: false`` stages released there so far."""


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
    last_applied_snapshot: list[StageSnapshot] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["stage"]})
    """Per stage, the revision of the last fully successful pass (every stage Ready and promoted):
    what a rollback restores."""
    pending_update: PendingUpdate | None = None
    """Set while an update window holds new revisions back (or a ``windowScope: All`` freeze holds
    everything)."""
    last_handled_update_override: Annotated[str, Field(max_length=256)] | None = None
    """The last ``stages.metio.wtf/update-now`` value acted on (each value acts once)."""
    override_revisions: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict)
    """The revisions ``update-now`` let through, by stage, until each stage has applied its own (ours)."""
    rollback: Rollback | None = None
    """The last rollback, while its failed revisions are still what the sources offer."""
    history: list[StageHistory] = Field(
        default_factory=list, max_length=MAX_STAGES,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["stage"]})
    """Each stage's last applied releases, newest first (bounded: see ``stageset history``)."""
    previous_targets: PreviousTargets | None = None
    """While the StageSet moves to another cluster: the objects still on the previous one."""
    drifted: list[DriftedObject] = Field(
        default_factory=list, max_length=MAX_DRIFTED, json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """``driftDetection.mode: Warn``: the objects left as someone else changed them (at most
    64; the ``Drifted`` condition counts them all)."""


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
