"""Pieces shared by our two kinds: the model base, constrained strings, references, conditions.

One set of pydantic models serves three readers: the controller parses live objects
with them, :mod:`stageset.api.crd` turns their JSON schema into the CRDs the
apiserver validates against, and users read the descriptions through
``kubectl explain``.  So constraints are declared once, on the type, and bounds
(``max_length`` on strings and lists) are set everywhere a CEL rule reads a
value: the apiserver estimates the cost of every rule from those bounds and
refuses a CRD whose rules could exceed its budget.

Attribute docstrings become the schema descriptions (``use_attribute_docstrings``).
"""

from __future__ import annotations

import datetime
import re
from typing import Annotated, Any, Final

import durationpy
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from stageset.api import unsupported
from stageset.api.vocabulary import ConditionStatus

GROUP: Final = "stages.metio.wtf"
VERSION: Final = "v1"
API_VERSION: Final = "stages.metio.wtf/v1"

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# Unsigned Go durations as Flux's CRDs spell them (``5m``, ``1h30m``, ``1.5s``; Greek mu and the
# micro sign both mean µ in Go), so every admitted value also parses in Go tooling.
DURATION_PATTERN = r"^([0-9]+([.][0-9]+)?(ns|us|µs|μs|ms|s|m|h))+$"

DNSLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
"""An RFC 1123 label: namespace names, stage names."""

DNSSubdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
"""An RFC 1123 subdomain: the names of most Kubernetes objects."""

# Go's time.Duration tops out at about 2562047h; anything longer is no duration Go tooling reads.
MAX_DURATION_SECONDS = 2562047 * 3600.0


def _bounded_duration(value: str) -> str:
    duration_seconds(value)  # raises ValueError past MAX_DURATION_SECONDS
    return value


Duration = Annotated[str, Field(max_length=64, pattern=DURATION_PATTERN), AfterValidator(_bounded_duration)]
"""A Go duration string such as ``30s``, ``5m`` or ``1h30m``; see :func:`duration_seconds`."""

Time = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
"""An RFC 3339 timestamp, as ``metav1.Time`` serializes."""

Count = Annotated[int, Field(ge=0, json_schema_extra={"format": "int64"})]
"""A non-negative 64-bit integer, such as ``metadata.generation``."""


def duration_seconds(value: str) -> float:
    """A duration string (already admitted by :data:`DURATION_PATTERN`) in seconds.

    Raises ``ValueError`` for text that is not a duration.
    """
    if re.fullmatch(DURATION_PATTERN, value) is None and value != "0":
        raise ValueError(f"invalid duration {value!r}: use e.g. 30s, 5m, 1h30m")
    try:
        seconds: float = durationpy.from_str(value).total_seconds()
    except (durationpy.DurationError, OverflowError) as error:
        raise ValueError(f"duration {value!r} is out of range (at most 2562047h)") from error
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"duration {value!r} is out of range (at most 2562047h)")
    return seconds


def format_time(value: datetime.datetime) -> str:
    """The one timestamp format of our status and events: RFC 3339, UTC, whole seconds."""
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime.datetime | None:
    """A timestamp as :func:`format_time` (or the apiserver) writes it; ``None`` if unreadable."""
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


class ApiModel(BaseModel):
    """Base of every model in our API: snake_case in Python, camelCase on the wire.

    Unknown fields are errors, so a typo in a spec is reported by the reconciler's
    re-check rather than silently ignored (the apiserver prunes them before we see
    them, and ``kubectl --validate=strict`` reports them to the user).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    # The reference's fields this controller refuses (stageset.api.unsupported): declared in the
    # schema with a CEL rule each, and refused here for objects the apiserver did not check.
    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core_schema)
        unsupported.declare(cls.__name__, handler.resolve_ref_schema(schema))
        return schema

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        return unsupported.refuse(cls.__name__, data)


class StatusModel(ApiModel):
    """Base of status models: tolerant of fields it does not know.

    Status is written by controllers; during a rolling upgrade a newer controller
    may already have written a field an older one has never heard of, and that
    must not make the older one fail to parse the whole object.
    """

    model_config = ConfigDict(extra="ignore")


class LocalObjectRef(ApiModel):
    """A reference to an object in the same namespace."""

    name: DNSSubdomain
    """Name of the referent."""


THIS_CLUSTER = "this-cluster"
"""The target id of the cluster the controller runs in (an inventory, record or ledger without a
target id was applied here)."""


class SecretKeyRef(ApiModel):
    """A key of a Secret in the same namespace."""

    name: DNSSubdomain
    """Name of the Secret."""
    key: Annotated[str, Field(min_length=1, max_length=253)] = "value"
    """Key in the Secret's data; defaults to ``value``."""


ONE_KUBECONFIG: Final[dict[str, str]] = {
    "rule": "has(self.secretRef) != has(self.configMapRef)",
    "message": "kubeConfig needs exactly one of secretRef (a Secret holding a kubeconfig) and "
               "configMapRef (a ConfigMap naming the cluster, reached by workload identity)",
    "fieldPath": ".secretRef", "reason": "FieldValueRequired"}
"""The CEL rule of every ``kubeConfig`` (a StageSet's and a StageTarget's): exactly one ref."""


def one_kubeconfig_ref(schema: dict[str, Any]) -> None:
    """A ``kubeConfig``'s schema: neither ref required by the schema, exactly one of them by
    :data:`ONE_KUBECONFIG` (a missing required field would stop the apiserver before the rules run,
    with a less helpful message)."""
    required = schema.get("required")
    if isinstance(required, list):
        for name in ("secretRef", "configMapRef"):
            if name in required:
                required.remove(name)
        if not required:
            del schema["required"]
    rules = schema.get("x-kubernetes-validations", [])
    assert isinstance(rules, list)
    schema["x-kubernetes-validations"] = [*rules, ONE_KUBECONFIG]


class Condition(StatusModel):
    """One aspect of the object's state, in the shape of ``metav1.Condition``.

    ``Ready``, ``Reconciling`` and ``Stalled`` follow kstatus, so ``kubectl wait``
    and existing tooling understand our objects.
    """

    type: Annotated[
        str,
        Field(
            max_length=316,
            pattern=(
                r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
            ),
        ),
    ]
    """Type of condition in CamelCase, e.g. ``Ready``."""
    status: ConditionStatus
    """Status of the condition."""
    reason: Annotated[
        str,
        Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
    ]
    """Programmatic identifier of the reason for the last transition, e.g. ``Succeeded``."""
    message: Annotated[str, Field(max_length=32768)]
    """Human-readable details about the last transition; may be empty."""
    last_transition_time: Time
    """When the condition last changed status."""
    observed_generation: Count | None = None
    """The ``metadata.generation`` the condition was computed from."""
