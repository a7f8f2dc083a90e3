"""The ``GitRepository`` kind: where a stage's manifests come from.

Field names follow Flux's ``source.toolkit.fluxcd.io`` GitRepository so users can
port theirs by changing the ``apiVersion``.  As for StageSet, each CEL rule in the
CRD is mirrored by a pydantic validator for the reconciler's re-check.

Accepting a URL scheme here only means the spec is well formed; whether the
controller may fetch from it (``file://`` in particular) is the URL policy of
:mod:`sources`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from stageset.api.common import (
    API_VERSION,
    DURATION_PATTERN,
    ApiModel,
    Condition,
    Count,
    DNSSubdomain,
    Duration,
    LocalObjectRef,
    StatusModel,
    Time,
    duration_seconds,
)

# https/http/ssh/file URLs, or scp-like "user@host:path".  Written so the same text
# is a valid RE2 (CEL) and Python pattern, and holds no quote or backslash, so it
# can sit inside a CEL string literal unchanged.
URL_PATTERN = r"^((https?|ssh|file)://.+|[A-Za-z0-9._~-]+@[A-Za-z0-9.-]+:.+)$"
URL_MESSAGE = (
    "url must start with https://, http://, ssh:// or file://, or be scp-like user@host:path"
)

_REF_NAME = Annotated[str, Field(min_length=1, max_length=1024)]

MAX_TIMEOUT = "5m"
"""Upper bound of ``spec.timeout``: a Git operation holds a worker for at most this long."""

_TIMEOUT = Annotated[
    str,
    Field(
        max_length=64,
        pattern=DURATION_PATTERN,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"duration(self) <= duration('{MAX_TIMEOUT}')",
                 "message": f"timeout must be at most {MAX_TIMEOUT}"},
            ],
        },
    ),
]

_ONE_SELECTOR: JsonDict = {
    "rule": "[has(self.branch), has(self.tag), has(self.semver), has(self.name)]"
    ".filter(x, x).size() <= 1",
    "message": "at most one of branch, tag, semver and name may be set",
}
_COMMIT_ONLY_WITH_BRANCH: JsonDict = {
    "rule": "!has(self.commit) || !(has(self.tag) || has(self.semver) || has(self.name))",
    "message": "commit may only be set alone or together with branch",
    "fieldPath": ".commit",
}


class GitRef(ApiModel):
    """Which revision to check out; with nothing set, the remote's default branch.

    At most one of ``branch``, ``tag``, ``semver`` and ``name``; ``commit`` alone
    pins a commit, and with ``branch`` pins a commit that must be on that branch.
    """

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [_ONE_SELECTOR, _COMMIT_ONLY_WITH_BRANCH]}
    )

    branch: _REF_NAME | None = None
    """Branch to follow, e.g. ``main``."""
    tag: _REF_NAME | None = None
    """Tag to check out."""
    semver: _REF_NAME | None = None
    """Semantic-version range; the highest matching tag is checked out."""
    name: _REF_NAME | None = None
    """A full reference name, e.g. ``refs/pull/42/head``."""
    commit: Annotated[str, Field(pattern=r"^([0-9a-f]{40}|[0-9a-f]{64})$")] | None = None
    """Full SHA-1 or SHA-256 commit hash (lowercase hex)."""

    @model_validator(mode="after")
    def _one_selector(self) -> GitRef:
        selectors = [
            field
            for field in ("branch", "tag", "semver", "name")
            if getattr(self, field) is not None
        ]
        if len(selectors) > 1:
            given = ", ".join(selectors)
            raise ValueError(f"at most one of branch, tag, semver and name may be set, got {given}")
        if self.commit is not None and set(selectors) - {"branch"}:
            raise ValueError("commit may only be set alone or together with branch")
        return self


class GitRepositorySpec(ApiModel):
    """The desired state of a GitRepository."""

    url: Annotated[
        str,
        Field(
            min_length=1,
            max_length=2048,
            json_schema_extra={
                "x-kubernetes-validations": [
                    {"rule": f"self.matches('{URL_PATTERN}')", "message": URL_MESSAGE},
                ],
            },
        ),
    ]
    """Repository URL: ``https://``, ``http://``, ``ssh://``, ``file://``, or scp-like
    ``git@host:path``."""
    ref: GitRef | None = None
    """Which revision to check out; defaults to the remote's default branch."""
    secret_ref: LocalObjectRef | None = None
    """Secret with credentials: ``username``/``password``, ``bearerToken``, or
    ``identity`` and ``known_hosts`` for SSH."""
    interval: Duration = "1m"
    """How often to look for new commits."""
    timeout: _TIMEOUT = "60s"
    """Deadline for each fetch (listing refs and fetching together), at most 5m."""
    ignore: Annotated[str, Field(max_length=65536)] | None = None
    """Extra ``.gitignore``-style patterns of files to leave out of the artifact."""
    suspend: bool = False
    """Stop looking for new commits."""
    service_account_name: DNSSubdomain | None = None
    """ServiceAccount the controller impersonates to read ``secretRef``."""

    @field_validator("url")
    @classmethod
    def _url_scheme(cls, url: str) -> str:
        if re.fullmatch(URL_PATTERN, url) is None:
            raise ValueError(URL_MESSAGE)
        return url

    @field_validator("timeout")
    @classmethod
    def _bounded_timeout(cls, timeout: str) -> str:
        if duration_seconds(timeout) > duration_seconds(MAX_TIMEOUT):
            raise ValueError(f"timeout must be at most {MAX_TIMEOUT}")
        return timeout


class Artifact(StatusModel):
    """The revision the GitRepository last fetched."""

    revision: Annotated[str, Field(min_length=1, max_length=1024)]
    """Revision in Flux's format, e.g. ``main@sha1:<40 hex>``."""
    digest: Annotated[str, Field(max_length=1024)] | None = None
    """Digest of the artifact's content, e.g. ``sha256:<hex>``."""
    last_update_time: Time | None = None
    """When the revision last changed."""
    url: Annotated[str, Field(max_length=2048)] | None = None
    """Where the controller stores the artifact, when it is served."""


class GitRepositoryStatus(StatusModel):
    """The observed state of a GitRepository."""

    observed_generation: Count | None = None
    """The ``metadata.generation`` last reconciled."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """``Ready``, ``Reconciling`` and ``Stalled``, as kstatus expects."""
    artifact: Artifact | None = None
    """The revision last fetched."""
    last_handled_reconcile_at: Annotated[str, Field(max_length=256)] | None = None
    """The last ``reconcile.fluxcd.io/requestedAt`` annotation value acted on."""


class GitRepository(ApiModel):
    """A Git repository the controller fetches stage manifests from."""

    api_version: Literal["stages.metio.wtf/v1"] = API_VERSION
    """``stages.metio.wtf/v1``."""
    kind: Literal["GitRepository"] = "GitRepository"
    """``GitRepository``."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Standard object metadata."""
    spec: GitRepositorySpec
    """The desired state."""
    status: GitRepositoryStatus | None = None
    """The observed state, written by the controller."""
