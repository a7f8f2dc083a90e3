"""A stage's ``actions``: typed steps before it is built (``pre``), after it is ready (``post``) and
when it fails (``onFailure``), with the reference controller's field names.  Pure schema.

Each action has a ``name``, an optional ``timeout`` and ``retries``, and exactly one operation:
``job`` (Jobs rendered from a source, awaited), ``http`` (a call gated by the controller's
``--allowed-action-hosts`` and the address guard), ``wait`` (a duration, or a CEL expression on one
object), ``patch`` (merge or JSON 6902), ``delete``, ``apply`` (transient objects, never pruned).
What they do, as whom, and when they run: :mod:`stageset.controller.stageset.actions` and
``docs/actions.md``.

Every rule is a CEL rule on the model it guards (so the apiserver refuses a bad action even while
the controller is down) and a validator here (the reconciler's re-check).  The reference's fields
for scopes this controller does not have (``scope: Version`` / ``Lifetime``, ``completionAnchor``)
are declared and refused by :mod:`stageset.api.unsupported`; the three list types
(:class:`PreAction`, :class:`PostAction`, :class:`FailureAction`) exist so its table can name
where each refusal applies.

``status.stages[].actions`` (:class:`ActionLedger`) is the ledger: what ran, for which revision,
so a restart or a requeue never runs an action twice for the same revision.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from stageset.api.common import THIS_CLUSTER, ApiModel, DNSLabel, DNSSubdomain, Duration, StatusModel, Time
from stageset.api.sourceref import SourceRef

MAX_ACTIONS = 16
"""Actions per list (``pre``, ``post``, ``onFailure``)."""
MAX_RETRIES = 100
MAX_URL = 2048
MAX_BODY = 32768
"""Bytes of an inline ``http.body`` and of a ``patch``."""
MAX_HEADERS = 16
MAX_EXPECTED = 16
MAX_WAIT_EXPRESSION = 2048
MAX_SELECTOR_TERMS = 16

_SHORT = Annotated[str, Field(min_length=1, max_length=253)]
ActionName = DNSLabel
"""An action's name: an RFC 1123 label, unique within its list (``pre`` and ``post`` together)."""


class Hook(StrEnum):
    """When an action runs (the list it is in)."""

    PRE = "pre"
    POST = "post"
    ON_FAILURE = "onFailure"


class TargetRef(ApiModel):
    """One object, by API version, kind, name and namespace."""

    api_version: _SHORT | None = None
    """API version of the object, e.g. ``apps/v1``; left out, the core group (``v1``)."""
    kind: Annotated[str, Field(min_length=1, max_length=63)]
    """Kind of the object."""
    name: DNSSubdomain
    """Name of the object."""
    namespace: DNSLabel | None = None
    """Namespace of a namespaced object; defaults to the StageSet's.  Ignored for a cluster-scoped kind."""

    @property
    def api_version_or_core(self) -> str:
        return self.api_version or "v1"


class SelectorRequirement(ApiModel):
    """One term of a label selector (``metav1.LabelSelectorRequirement``)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
         "message": "In and NotIn need values; Exists and DoesNotExist take none"}]})

    key: Annotated[str, Field(min_length=1, max_length=317)]
    """The label's key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """How the key relates to the values."""
    values: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list, max_length=64, json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """The values (``In``, ``NotIn``)."""

    @model_validator(mode="after")
    def _values(self) -> SelectorRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise ValueError("In and NotIn need values; Exists and DoesNotExist take none")
        return self

    def term(self) -> str:
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return f"!{self.key}"
        return f"{self.key} {self.operator.lower()} ({','.join(self.values)})"


class LabelSelector(ApiModel):
    """A label selector (``metav1.LabelSelector``); every term must match."""

    match_labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=MAX_SELECTOR_TERMS)
    """Labels and their values."""
    match_expressions: list[SelectorRequirement] = Field(
        default_factory=list, max_length=MAX_SELECTOR_TERMS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Terms."""

    def query(self) -> str:
        """The selector as a ``labelSelector`` query value."""
        terms = [f"{key}={value}" for key, value in sorted(self.match_labels.items())]
        return ",".join(terms + [term.term() for term in self.match_expressions])


class PatchTarget(TargetRef):
    """What a ``patch`` action patches: one object by ``name``, or every object of the kind in the
    namespace whose labels match ``selector`` (exactly one of the two)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.name) != has(self.selector)",
         "message": "a patch target needs exactly one of name and selector"},
        {"rule": "!has(self.selector)"
                 " || (has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0)"
                 " || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)",
         "message": "an empty selector would patch every object of the kind; name at least one label",
         "fieldPath": ".selector"}]})

    name: DNSSubdomain | None = None  # type: ignore[assignment]
    """Name of the one object to patch (or ``selector``)."""
    selector: LabelSelector | None = None
    """Patch every object of the kind in the namespace whose labels match (or ``name``)."""

    @model_validator(mode="after")
    def _one(self) -> PatchTarget:
        if (self.name is None) == (self.selector is None):
            raise ValueError("a patch target needs exactly one of name and selector")
        if self.selector is not None and not self.selector.query():
            raise ValueError("an empty selector would patch every object of the kind; "
                             "name at least one label")
        return self


class PatchAction(ApiModel):
    """Patch existing objects as the stage's ServiceAccount."""

    target: PatchTarget
    """What to patch."""
    type: Literal["merge", "json6902"] = "merge"
    """``merge`` (a strategic merge patch; for a custom resource, which has none, a JSON merge
    patch), or ``json6902`` (a list of JSON Patch operations)."""
    patch: Annotated[str, Field(min_length=1, max_length=MAX_BODY)]
    """The patch, as JSON or YAML: an object for ``merge``, a list of operations for ``json6902``."""

    @model_validator(mode="after")
    def _parses(self) -> PatchAction:
        self.body()
        return self

    def body(self) -> Any:
        """The patch as JSON data; ``ValueError`` when it is not the shape its type needs."""
        try:
            parsed = yaml.safe_load(self.patch)
        except yaml.YAMLError as error:
            raise ValueError(f"patch is neither JSON nor YAML: {str(error).splitlines()[0]}") from None
        if self.type == "merge" and not isinstance(parsed, dict):
            raise ValueError("a merge patch must be an object, e.g. {\"spec\": {\"replicas\": 3}}")
        operations = isinstance(parsed, list) and bool(parsed) and all(
            isinstance(op, dict) and "op" in op and "path" in op for op in parsed)
        if self.type == "json6902" and not operations:
            raise ValueError("a json6902 patch must be a list of operations, each with op and path")
        return parsed


_TOKEN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"  # noqa: S105 - an HTTP token (header names), not a password
_FORBIDDEN_HEADERS = ("host", "content-length", "transfer-encoding", "connection")


class SecretKey(ApiModel):
    """One key of a Secret in the StageSet's namespace, read as the stage's ServiceAccount."""

    name: DNSSubdomain
    """Name of the Secret."""
    key: Annotated[str, Field(min_length=1, max_length=253)]
    """The key in the Secret's data."""


class HeaderFrom(SecretKey):
    """A request header from a Secret: the key names the header, its value is the header's value."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": f'self.key.matches("{_TOKEN}")',
         "message": "the key names the header: letters, digits and !#$%&'*+.^_`|~- only",
         "fieldPath": ".key"},
        {"rule": "!(self.key.lowerAscii() in " + str(list(_FORBIDDEN_HEADERS)) + ")",
         "message": "Host, Content-Length, Transfer-Encoding and Connection are set by the controller",
         "fieldPath": ".key"}]})

    key: Annotated[str, Field(min_length=1, max_length=128)]
    """The key in the Secret's data, and the header's name."""

    @field_validator("key")
    @classmethod
    def _header_name(cls, key: str) -> str:
        if re.fullmatch(_TOKEN, key) is None:
            raise ValueError("the key names the header: letters, digits and !#$%&'*+.^_`|~- only")
        if key.lower() in _FORBIDDEN_HEADERS:
            raise ValueError("Host, Content-Length, Transfer-Encoding and Connection are set by the "
                             "controller")
        return key


class HttpAction(ApiModel):
    """Call an HTTP endpoint and succeed on the expected status.

    The host must be allowed by the controller's ``--allowed-action-hosts`` (none is, unless the
    platform team lists it), and the address guard refuses loopback, link-local and cloud metadata
    addresses at every connection, redirects included.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.body) || !has(self.bodyFrom)", "message": "set body or bodyFrom, not both"},
        {"rule": "!self.url.matches('^[a-zA-Z]+://[^/?#]*@')",
         "message": "the URL may not carry credentials; send them in headersFrom", "fieldPath": ".url"}]})

    url: Annotated[str, Field(min_length=1, max_length=MAX_URL, pattern=r"^[hH][tT][tT][pP][sS]?://[^\s]+$")]
    """The URL (``http`` or ``https``)."""
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "POST"
    """The method (``POST`` when left out, as in the reference)."""
    body: Annotated[str, Field(max_length=MAX_BODY)] | None = None
    """The request body, inline."""
    body_from: SecretKey | None = None
    """The request body, from a Secret key (never shown in status, events or logs)."""
    headers_from: list[HeaderFrom] = Field(
        default_factory=list, max_length=MAX_HEADERS, json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Request headers from Secret keys (the key is the header's name; the value is never shown)."""
    expected_status: list[Annotated[int, Field(ge=100, le=599)]] = Field(
        default_factory=list, max_length=MAX_EXPECTED, json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """Status codes that count as success; left out, any ``2xx``."""

    @model_validator(mode="after")
    def _checks(self) -> HttpAction:
        if self.body is not None and self.body_from is not None:
            raise ValueError("set body or bodyFrom, not both")
        try:
            parts = urlsplit(self.url)
            credentials = parts.username is not None or parts.password is not None
        except ValueError:
            raise ValueError("the URL is malformed") from None
        if credentials:
            raise ValueError("the URL may not carry credentials; send them in headersFrom")
        return self

    @property
    def carries_secrets(self) -> bool:
        return self.body_from is not None or bool(self.headers_from)

    def accepts(self, status: int) -> bool:
        return status in self.expected_status if self.expected_status else 200 <= status < 300


class WaitAction(ApiModel):
    """Wait for a ``duration``, or until the CEL expression ``expr`` holds on ``target``."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.duration) != has(self.expr)",
         "message": "a wait needs exactly one of duration and expr"},
        {"rule": "has(self.expr) == has(self.target)",
         "message": "expr needs a target, and a target an expr"},
        {"rule": "!has(self.timeout) || has(self.expr)",
         "message": "timeout applies to an expr wait; a duration wait lasts its duration",
         "fieldPath": ".timeout"}]})

    duration: Duration | None = None
    """How long to wait."""
    target: TargetRef | None = None
    """The object ``expr`` is evaluated on, read as the stage's ServiceAccount."""
    expr: Annotated[str, Field(min_length=1, max_length=MAX_WAIT_EXPRESSION)] | None = None
    """A CEL expression over the target's top-level fields (``metadata``, ``spec``, ``status``; ``self``
    is the whole object) that must return a bool; waits while it is false or fails to evaluate."""
    timeout: Duration | None = None
    """How long an ``expr`` wait may take (with the action's ``timeout``: the shorter)."""

    @model_validator(mode="after")
    def _one(self) -> WaitAction:
        if (self.duration is None) == (self.expr is None):
            raise ValueError("a wait needs exactly one of duration and expr")
        if (self.expr is None) != (self.target is None):
            raise ValueError("expr needs a target, and a target an expr")
        if self.timeout is not None and self.expr is None:
            raise ValueError("timeout applies to an expr wait; a duration wait lasts its duration")
        return self


class JobAction(ApiModel):
    """Render the Jobs at ``path`` in a source, create them as the stage's ServiceAccount and wait
    until every one has completed."""

    source_ref: SourceRef
    """The source holding the Jobs (named as a stage's ``sourceRef``)."""
    path: Annotated[str, Field(min_length=1, max_length=4096)] = "./"
    """Directory in the source."""


class DeleteAction(ApiModel):
    """Delete one object as the stage's ServiceAccount; an object that is not there counts as deleted."""

    target: TargetRef
    """The object."""
    cascade: Literal["Background", "Foreground", "Orphan"] | None = None
    """What happens to its dependents, as ``kubectl delete --cascade``: ``Background`` (left out),
    ``Foreground`` or ``Orphan``."""


class ApplyAction(ApiModel):
    """Apply the objects at ``path`` in a source as the stage's ServiceAccount, outside the stage's
    inventory: they are never pruned (pair the action with a ``delete``)."""

    source_ref: SourceRef
    """The source holding the objects."""
    path: Annotated[str, Field(min_length=1, max_length=4096)] = "./"
    """Directory in the source."""
    wait: bool = False
    """Wait until the applied objects are ready (kstatus), within the action's timeout."""


_VERBS = ("job", "http", "wait", "patch", "delete", "apply")


def _exactly_one(schema: JsonDict) -> None:
    rules = schema.get("x-kubernetes-validations", [])
    assert isinstance(rules, list)
    present = ", ".join(f"has(self.{verb})" for verb in _VERBS)
    schema["x-kubernetes-validations"] = [*rules, {
        "rule": f"[{present}].filter(x, x).size() == 1",
        "message": "an action needs exactly one of job, http, wait, patch, delete and apply",
        "messageExpression": "'action \"' + self.name + '\" needs exactly one of job, http, wait, patch, "
                             "delete and apply'"}]


class Action(ApiModel):
    """One step around a stage: a ``name``, optionally a ``timeout`` and ``retries``, and exactly one
    of ``job``, ``http``, ``wait``, ``patch``, ``delete``, ``apply``.  Runs as the stage's
    ServiceAccount on the stage's target cluster."""

    model_config = ConfigDict(json_schema_extra=_exactly_one)

    name: ActionName
    """Name of the action (status, events, the ledger)."""
    scope: Literal["Revision", "Version", "Lifetime"] | None = None
    """How often the action runs: ``Revision`` (left out), once per revision of the stage.
    ``Version`` and ``Lifetime`` are the reference's and refused here."""
    timeout: Duration | None = None
    """How long the action may take, every attempt and every reconcile it spans; left out, the
    stage's ``timeout``."""
    retries: Annotated[int, Field(ge=0, le=MAX_RETRIES)] | None = None
    """Attempts after the first that fails (a refusal is not retried: a host not allowed, an
    address refused, a 4xx answer other than 408 and 429, a denial)."""
    job: JobAction | None = None
    """Create Jobs from a source and wait until they complete."""
    http: HttpAction | None = None
    """Call an HTTP endpoint."""
    wait: WaitAction | None = None
    """Wait for a duration or a condition."""
    patch: PatchAction | None = None
    """Patch existing objects."""
    delete: DeleteAction | None = None
    """Delete an object."""
    apply: ApplyAction | None = None
    """Apply transient objects (not pruned)."""

    @model_validator(mode="after")
    def _one_verb(self) -> Action:
        if sum(getattr(self, verb) is not None for verb in _VERBS) != 1:
            raise ValueError(f'action "{self.name}" needs exactly one of job, http, wait, patch, delete '
                             "and apply")
        return self

    @property
    def verb(self) -> str:
        """``job``, ``http``, ``wait``, ``patch``, ``delete`` or ``apply``."""
        return next(verb for verb in _VERBS if getattr(self, verb) is not None)


class PreAction(Action):
    """An action run before the stage is built and applied; its failure applies nothing."""


class PostAction(Action):
    """An action run after the stage is ready; the stage is Ready only when every one succeeded."""


class FailureAction(Action):
    """An action run, best effort, when the stage fails from its apply on."""


def _unique(hook: str) -> JsonDict:
    return {
        "x-kubernetes-list-type": "atomic",
        "x-kubernetes-validations": [{
            "rule": "self.all(a, self.exists_one(b, b.name == a.name))",
            "message": f"action names must be unique within {hook}",
            "messageExpression": (f"'action name \"' + self[self.map(a, self.exists_one(b, b.name == a.name))"
                                  f".indexOf(false)].name + '\" is used more than once in {hook}'")}]}


_PRE_POST_DISJOINT: JsonDict = {
    "rule": "!has(self.pre) || !has(self.post) || self.pre.all(a, !self.post.exists(b, b.name == a.name))",
    "message": "an action name may be used in pre or in post, not both (the ledger records names)",
}


class StageActions(ApiModel):
    """Steps around a stage, each list run in order: ``pre`` before the stage is built (a failure
    applies nothing), ``post`` after it is ready (it is Ready only when they pass), ``onFailure``
    best effort when it fails from its apply on.  ``pre`` and ``post`` actions run once per
    revision of the stage (``status.stages[].actions``)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_PRE_POST_DISJOINT]})

    pre: list[PreAction] = Field(default_factory=list, max_length=MAX_ACTIONS,
                                 json_schema_extra=_unique("pre"))
    """Before the stage is built and applied."""
    post: list[PostAction] = Field(default_factory=list, max_length=MAX_ACTIONS,
                                   json_schema_extra=_unique("post"))
    """After the stage is ready."""
    on_failure: list[FailureAction] = Field(default_factory=list, max_length=MAX_ACTIONS,
                                            json_schema_extra=_unique("onFailure"))
    """When the stage fails (its apply, its readiness, a post action), once per failure."""

    @model_validator(mode="after")
    def _names(self) -> StageActions:
        for hook in Hook:
            names = [a.name for a in self.of(hook)]
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f'action name "{repeated[0]}" is used more than once in {hook.value}')
        both = sorted({a.name for a in self.pre} & {a.name for a in self.post})
        if both:
            raise ValueError(f'action name "{both[0]}" is used in pre and in post; an action name may be '
                             "used in pre or in post, not both (the ledger records names)")
        return self

    def of(self, hook: Hook) -> list[Action]:
        chosen: list[PreAction] | list[PostAction] | list[FailureAction] = (
            self.pre if hook is Hook.PRE else self.post if hook is Hook.POST else self.on_failure)
        return list(chosen)

    def __bool__(self) -> bool:
        return bool(self.pre or self.post or self.on_failure)


# -- status: the ledger ----------------------------------------------------------------------------

class ActionRun(StatusModel):
    """The ``pre`` or ``post`` action in progress (its attempts span reconciles)."""

    hook: Annotated[str, Field(max_length=16)]
    """``pre`` or ``post``."""
    name: Annotated[str, Field(max_length=63)]
    """The action."""
    since: Time
    """When its first attempt started (its timeout counts from here)."""
    attempt: Annotated[int, Field(ge=0, le=MAX_RETRIES + 1)] = 0
    """Attempts that failed so far."""
    retry_at: Time | None = None
    """After a failed attempt: not before this time."""
    error: Annotated[str, Field(max_length=1024)] | None = None
    """Why the last attempt failed (Secret values removed)."""
    run: Annotated[int, Field(ge=0)] | None = None
    """How far this attempt got: the run of Jobs it awaits (``job``), that its objects were applied
    (``apply``)."""


class ActionLedger(StatusModel):
    """What a stage's actions did for its current revision, on its current target.

    The revision is the stage's source revision and ``inputs``, a digest of what else the stage
    builds from (``path``, ``patches``, and ``postBuild`` values other than Secret values); when
    either changes, or the stage moves to another cluster (``target``), the ledger starts over and
    ``pre`` and ``post`` actions run again (on the new cluster)."""

    revision: Annotated[str, Field(max_length=1024)]
    """The stage's source revision."""
    inputs: Annotated[str, Field(max_length=80)]
    """``sha256:<16 hex>`` of the stage's other build inputs."""
    executed: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list, max_length=2 * MAX_ACTIONS,
        json_schema_extra={"x-kubernetes-list-type": "atomic"})
    """The ``pre`` and ``post`` actions done for this revision."""
    running: ActionRun | None = None
    """The action in progress."""
    on_failure_ran: bool | None = None
    """``onFailure`` ran for the stage's current failure (again only after it was Ready)."""
    target: Annotated[str, Field(max_length=1024)] | None = None
    """The id of the remote cluster the actions ran on (absent: this cluster)."""

    def key(self) -> tuple[str, str, str]:
        return self.revision, self.inputs, self.target or THIS_CLUSTER
