"""The reference's StageSet fields this controller does not implement (yet): declared, then refused.

The group ``stages.metio.wtf/v1`` is shared with the Go StageSet controller (the reference), so a
StageSet written for it must mean the same here or be refused.  The apiserver prunes a field our
schema does not declare (with at most a warning under the default field validation), which would
make a ported StageSet silently mean something else.  So every field of the reference's API we do
not implement is **declared** in our schema -- loosely typed, with
``x-kubernetes-preserve-unknown-fields`` for objects, so nothing under it is pruned either -- and
**refused** at admission by a CEL rule whose message names the field and says whether (and by
which issue) it is planned.  The models refuse it the same way (a ``before`` validator on
:class:`~stageset.api.common.ApiModel`), so an object stored before a rule existed, or under an
older CRD, still fails with ``InvalidSpec`` naming the field.

:data:`REFUSED` is the one table.  It drives the CRD (a property and a rule on the model that
carries the field: :func:`declare`) and the models' re-check (:func:`refuse`).  Accepting a field
when the issue that builds it lands is deleting its line here; that issue declares the field,
typed, on its model.  A field the model already declares (``onTimeout``) is refused only for the
value the line names.

A value that means what leaving the field out means -- ``false``, ``[]``, ``""``, as the
reference's ``omitempty`` fields read them -- is accepted and ignored.

No I/O, no identity: these are pure schema and validation rules.
"""

from __future__ import annotations

import enum
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

from pydantic.alias_generators import to_snake
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError


class Shape(enum.Enum):
    """How a refused field is declared: loose enough that any value the reference accepts is
    stored as sent (then refused by the rule), never pruned or refused for its type."""

    OBJECT = "object"
    OBJECTS = "objects"
    FLAG = "flag"
    TEXT = "text"

    def schema(self) -> JsonDict:
        loose: JsonDict = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        if self is Shape.OBJECT:
            return loose
        if self is Shape.OBJECTS:
            return {"type": "array", "items": loose}
        if self is Shape.FLAG:
            return {"type": "boolean"}
        return {"type": "string", "maxLength": 4096}

    @property
    def empty(self) -> Any:
        """The value that means "left out" (``None``: there is none, e.g. ``{}`` is not)."""
        return {Shape.OBJECT: None, Shape.OBJECTS: [], Shape.FLAG: False, Shape.TEXT: ""}[self]

    def cel_empty(self, field: str) -> str | None:
        """A CEL test that ``self.<field>`` holds :attr:`empty` (cost independent of its size)."""
        if self is Shape.OBJECTS:
            return f"size(self.{field}) == 0"
        if self is Shape.FLAG:
            return f"!self.{field}"
        if self is Shape.TEXT:
            return f"self.{field} == ''"
        return None


# Where each model sits in a StageSet, for the docs and the tests (messages name the field only:
# the apiserver and the models prefix them with the exact path).
PATHS: Final = {
    "StageSetSpec": "spec",
    "Stage": "spec.stages[]",
    "Promotion": "spec.stages[].promotion",
    "PreAction": "spec.stages[].actions.pre[]",
    "PostAction": "spec.stages[].actions.post[]",
    "FailureAction": "spec.stages[].actions.onFailure[]",
}


# FleetRollout's models (the reference's version-based rollout fields), kept apart from the
# StageSet's table: the StageSet walk (tests/api) covers exactly PATHS.
FLEET_PATHS: Final = {
    "FleetRolloutSpec": "spec",
    "FleetWave": "spec.waves[]",
}
_ALL_PATHS: Final = {**PATHS, **FLEET_PATHS}


@dataclass(frozen=True)
class Refusal:
    """One field (or one value of a field) of the reference's API that is refused here."""

    model: str
    """The class name of the model that carries the field (a key of :data:`PATHS`)."""
    field: str
    """The field's name on the wire."""
    what: str
    """What it does in the reference, in a few words."""
    _: KW_ONLY
    planned: str | None = None
    """The issue that builds it (``"issue 21"``); ``None``: not planned."""
    shape: Shape | None = None
    """How to declare the field; ``None`` when the model declares it (then ``value`` is set)."""
    value: str | bool | None = None
    """Refuse only this value of a field the model declares."""
    instead: str = "remove it to apply this StageSet here"
    """What to do instead."""

    @property
    def path(self) -> str:
        return f"{_ALL_PATHS[self.model]}.{self.field}"

    @property
    def message(self) -> str:
        subject = self.field if self.value is None else f"{self.field}: {_literal(self.value)}"
        when = f" yet (planned: {self.planned})" if self.planned else ""
        return f"{subject} ({self.what}) is not supported by this controller{when}; {self.instead}"

    def rule(self) -> JsonDict:
        """The CEL rule, placed on the model carrying the field."""
        condition = f"!has(self.{self.field})"
        if self.value is not None:
            condition += f" || self.{self.field} != {_cel_literal(self.value)}"
        elif self.shape is not None and (empty := self.shape.cel_empty(self.field)) is not None:
            condition += f" || {empty}"
        return {"rule": condition, "message": self.message, "fieldPath": f".{self.field}",
                "reason": "FieldValueForbidden"}

    def refuses(self, value: Any) -> bool:
        if value is None:  # the apiserver drops nulls: absent
            return False
        if self.value is not None:
            return bool(value == self.value)
        return self.shape is None or value != self.shape.empty


def _literal(value: str | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _cel_literal(value: str | bool) -> str:
    return _literal(value) if isinstance(value, bool) else f"'{value}'"


_GATES = "use soak and requireManualPromotion, which are supported, or remove it"
_REVISION = "leave scope out: an action runs once per revision of its stage (scope: Revision)"

REFUSED: Final = (
    # spec
    Refusal("StageSetSpec", "onRollback", "actions run after a rollback", shape=Shape.OBJECTS),
    Refusal("StageSetSpec", "errorBudget", "freezing rollouts on an SLO error budget", shape=Shape.OBJECT),
    Refusal("StageSetSpec", "version", "the deployed version, for versioned migrations", shape=Shape.OBJECT),
    Refusal("StageSetSpec", "migrations", "versioned migrations", shape=Shape.OBJECTS),
    Refusal("StageSetSpec", "migrationsSourceRef", "versioned migrations read from a source",
            shape=Shape.OBJECT),
    # spec.stages[]
    Refusal("Stage", "errorBudget", "freezing a stage on its SLO error budget", shape=Shape.OBJECT),
    Refusal("Stage", "migrationAnchor", "the anchor versioned migrations name", shape=Shape.TEXT),
    # spec.stages[].promotion
    Refusal("Promotion", "analysis", "holding a stage while metric checks (Prometheus) run",
            shape=Shape.OBJECT, instead=_GATES),
    Refusal("Promotion", "fastTrack", "ending a soak early on a healthy metric", shape=Shape.OBJECT,
            instead=_GATES),
    Refusal("Promotion", "restartGate", "holding a stage while its pods restart", shape=Shape.OBJECT,
            instead=_GATES),
    Refusal("Promotion", "eventGate", "holding a stage on Warning events of its pods", shape=Shape.OBJECT,
            instead=_GATES),
    Refusal("Stage", "applyHelmHookResources", "leaving out objects with helm.sh/hook annotations",
            value=False, instead="helm.sh/hook objects are applied as ordinary objects here; "
                                 "remove them from the stage's path or leave this field out"),
    # spec.stages[].actions: the reference's scopes other than Revision, and their anchor
    *(line for model in ("PreAction", "PostAction") for line in (
        Refusal(model, "scope", "running the action once per spec.version", value="Version",
                instead=_REVISION),
        Refusal(model, "scope", "running the action once in the StageSet's lifetime, kept in a StageLedger",
                value="Lifetime", instead=_REVISION),
        Refusal(model, "completionAnchor", "the object that witnesses a scope: Lifetime action",
                shape=Shape.OBJECT, instead="remove it (there is no scope: Lifetime here)"))),
    Refusal("FailureAction", "scope", "a ledger scope for an onFailure action",
            instead="remove it: onFailure actions are not gated by the ledger "
                    "(the reference refuses it too)"),
    Refusal("FailureAction", "completionAnchor", "the object that witnesses a scope: Lifetime action",
            shape=Shape.OBJECT, instead="remove it (there is no scope: Lifetime here)"),
)
"""Every refused field; one line per field (or value)."""


_VERSIONS = "a FleetRollout rolls out revisions of its members' sources, not a spec.version; remove it"

FLEET_REFUSED: Final = (
    Refusal("FleetRolloutSpec", "targetVersion", "the spec.version every member is moved to",
            shape=Shape.TEXT, instead=_VERSIONS),
    Refusal("FleetRolloutSpec", "previousVersion", "the spec.version a regression returns members to",
            shape=Shape.TEXT, instead=_VERSIONS),
    Refusal("FleetRolloutSpec", "onRegression", "what the reference does to members on a regression",
            shape=Shape.OBJECT, instead="remove it: a failing member halts the rollout here, and each "
                                        "member's own rollbackOnFailure restores it"),
    Refusal("FleetWave", "gate", "an approval or metric gate before a wave opens", shape=Shape.OBJECT,
            instead="use the wave's soak, or each stage's promotion gate, which are supported"),
)
"""Every refused FleetRollout field."""

_BY_MODEL: Final = {model: tuple(r for r in (*REFUSED, *FLEET_REFUSED) if r.model == model)
                    for model in _ALL_PATHS}


def of(model: str) -> tuple[Refusal, ...]:
    """The refusals of the model named ``model``."""
    return _BY_MODEL.get(model, ())


def declare(model: str, schema: JsonDict) -> None:
    """Add ``model``'s refused fields (where the model does not declare them) and their rules to
    ``schema``, the model's JSON schema."""
    refusals = of(model)
    if not refusals:
        return
    properties = schema.setdefault("properties", {})
    assert isinstance(properties, dict)
    for refusal in refusals:
        if refusal.shape is not None and refusal.field not in properties:
            properties[refusal.field] = {**refusal.shape.schema(),
                                         "description": f"{refusal.message}."}
    # A new list: the one there may be the model's own ``json_schema_extra``, shared by every call.
    rules = schema.get("x-kubernetes-validations", [])
    assert isinstance(rules, list)
    schema["x-kubernetes-validations"] = [*rules, *(refusal.rule() for refusal in refusals)]


def refuse(model: str, data: Any) -> Any:
    """``data`` (a model's raw input) without refused fields that hold their empty value; raises
    when one holds anything else, with a message naming every such field."""
    refusals = of(model)
    if not refusals or not isinstance(data, dict):
        return data
    kept = dict(data)
    problems: list[str] = []
    for refusal in refusals:
        key = next((k for k in (refusal.field, to_snake(refusal.field)) if k in kept), None)
        if key is None:
            continue
        if refusal.refuses(kept[key]):
            problems.append(refusal.message)
        elif refusal.shape is not None:
            del kept[key]  # means "left out"; the model may not declare it
    if problems:
        raise PydanticCustomError("unsupported_field", "; ".join(problems))
    return kept
