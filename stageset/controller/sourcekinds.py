"""What a stage's ``sourceRef`` names, and what a source object's status says: pure rules, no I/O.

Identity: none here; the reads these rules plan are made as the stage's identity by
:mod:`stageset.controller.render.reads`.

A ``sourceRef`` names one of three things (:func:`classify`):

* **our** ``GitRepository`` (``stages.metio.wtf/v1``), fetched into the controller's Git mirror;
* a **Flux source** (``source.toolkit.fluxcd.io``, ``v1`` or, where Flux still serves it, ``v1beta2``):
  ``ExternalArtifact``, ``GitRepository``, ``OCIRepository`` or ``Bucket``, whose
  ``status.artifact {url, revision, digest}`` is downloaded and verified;
* a **producer** (any other kind, with its ``apiVersion``): resolved to the ``ExternalArtifact``
  in the same namespace whose ``spec.sourceRef`` names it (group, kind, name), as the reference does.

Omitted fields follow :class:`DefaultSourceKind` (``--default-source-kind``): by default an omitted
``kind`` is our ``GitRepository``, and an omitted ``apiVersion`` is ours for ``GitRepository`` and
Flux's ``v1`` for Flux's other kinds; with ``ExternalArtifact`` (the reference's meaning) an omitted
``kind`` is Flux's ``ExternalArtifact`` and an omitted ``apiVersion`` is Flux's ``v1`` for every kind.

The status rules (:func:`artifact_state`) follow the reference: a source must be ``Ready`` (else
``SourceNotReady``, quoting its reason and message) and carry an artifact with a URL and a digest
(else ``ArtifactNotFound``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

OUR_GROUP = "stages.metio.wtf"
OUR_API_VERSION = "stages.metio.wtf/v1"
FLUX_GROUP = "source.toolkit.fluxcd.io"
FLUX_VERSIONS = ("v1", "v1beta2")
"""Served versions we read, preferred first (Flux 2.7 serves only ``v1``; older releases also
``v1beta2`` for ``OCIRepository`` and ``Bucket``)."""
FLUX_KINDS: dict[str, str] = {
    "ExternalArtifact": "externalartifacts",
    "GitRepository": "gitrepositories",
    "OCIRepository": "ocirepositories",
    "Bucket": "buckets",
}
"""Flux source kinds a stage may name directly, and their plurals."""
EXTERNAL_ARTIFACT = "ExternalArtifact"


class DefaultSourceKind(StrEnum):
    """What an omitted ``sourceRef.kind`` means (``--default-source-kind``)."""

    GIT_REPOSITORY = "GitRepository"
    """Our ``stages.metio.wtf/v1`` GitRepository (the default)."""
    EXTERNAL_ARTIFACT = "ExternalArtifact"
    """Flux's ``source.toolkit.fluxcd.io/v1`` ExternalArtifact, as in the reference controller."""


@dataclass(frozen=True)
class SourceObject:
    """A source object by group, kind, namespace and name: what a watch event or a download wakes."""

    group: str
    kind: str
    namespace: str
    name: str


class RefKind(StrEnum):
    OURS = "ours"
    FLUX = "flux"
    PRODUCER = "producer"


@dataclass(frozen=True)
class SourceTarget:
    """What a ``sourceRef`` resolves to before anything is read."""

    kind: RefKind
    group: str
    version: str
    name: str
    """The kind's name (``GitRepository``, ``ExternalArtifact``, a producer's kind)."""
    problem: str | None = None
    """Why the reference cannot be resolved at all (an InvalidSpec message), if it cannot."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def plural(self) -> str:
        return FLUX_KINDS.get(self.name, "")

    def describe(self) -> str:
        """``GitRepository`` for ours, ``OCIRepository.source.toolkit.fluxcd.io`` for Flux's, etc."""
        if self.kind is RefKind.OURS:
            return self.name
        if self.kind is RefKind.FLUX and self.name != "GitRepository":
            return self.name
        return f"{self.name}.{self.group}" if self.group else self.name


def _split(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def classify(*, api_version: str | None, kind: str | None, default: DefaultSourceKind) -> SourceTarget:
    """What ``sourceRef {apiVersion, kind}`` names under ``default`` (see the module)."""
    reference = default is DefaultSourceKind.EXTERNAL_ARTIFACT
    if not kind:
        if api_version:
            kind = "GitRepository" if _split(api_version)[0] == OUR_GROUP else EXTERNAL_ARTIFACT
        else:
            kind = EXTERNAL_ARTIFACT if reference else "GitRepository"
    if not api_version:
        if kind == "GitRepository" and not reference:
            api_version = OUR_API_VERSION
        elif kind in FLUX_KINDS or reference:
            api_version = f"{FLUX_GROUP}/v1"
        else:
            return SourceTarget(RefKind.PRODUCER, "", "", kind, problem=(
                f"sourceRef names kind {kind!r} without an apiVersion; a kind that is not a source kind "
                "is a producer, found through the ExternalArtifact that points back at it, and its "
                "apiVersion is needed to match it (e.g. apiVersion: example.com/v1)"))
    group, version = _split(api_version)
    if group == OUR_GROUP:
        if kind != "GitRepository" or version != "v1":
            return SourceTarget(RefKind.OURS, group, version, kind, problem=(
                f"sourceRef names {kind} {api_version}; the only source kind of {OUR_GROUP} is "
                "GitRepository (v1)"))
        return SourceTarget(RefKind.OURS, group, version, kind)
    if group == FLUX_GROUP and kind in FLUX_KINDS:
        if version not in FLUX_VERSIONS:
            return SourceTarget(RefKind.FLUX, group, version, kind, problem=(
                f"sourceRef names {kind} {api_version}; this controller reads Flux sources at "
                f"{' or '.join(FLUX_VERSIONS)}"))
        return SourceTarget(RefKind.FLUX, group, version, kind)
    return SourceTarget(RefKind.PRODUCER, group, version, kind)


def classify_raw(ref: Mapping[str, Any], default: DefaultSourceKind) -> SourceTarget:
    """:func:`classify` of a raw ``sourceRef`` map (from the watch cache)."""
    return classify(api_version=ref.get("apiVersion"), kind=ref.get("kind"), default=default)


# -- what a source object's status says --------------------------------------------------------

@dataclass(frozen=True)
class Artifact:
    url: str
    digest: str
    revision: str


@dataclass(frozen=True)
class NotUsable:
    """Why a source object's artifact cannot be used now."""

    ready: bool
    """``False``: the source is not Ready (``SourceNotReady``); ``True``: Ready without a usable
    artifact (``ArtifactNotFound``)."""
    reason: str
    message: str


def ready_condition(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition
    return None


def artifact_state(obj: Mapping[str, Any]) -> Artifact | NotUsable:
    """The artifact a Flux source object offers, or why it offers none (see the module)."""
    ready = ready_condition(obj)
    if ready is None or ready.get("status") != "True":
        if ready is None:
            return NotUsable(False, "", "it has no Ready condition yet")
        return NotUsable(False, str(ready.get("reason") or ""), str(ready.get("message") or ""))
    artifact = (obj.get("status") or {}).get("artifact") or {}
    if not isinstance(artifact, Mapping) or not artifact:
        return NotUsable(True, "", "it is Ready but has no status.artifact")
    url, digest = artifact.get("url"), artifact.get("digest")
    if not url or not isinstance(url, str):
        return NotUsable(True, "", "its status.artifact has no url")
    if not digest or not isinstance(digest, str):
        return NotUsable(True, "", "its status.artifact has no digest")
    revision = artifact.get("revision")
    return Artifact(url=url, digest=digest, revision=str(revision) if revision else digest)


_RUNBOOK = re.compile(r";?\s*runbook: \S+\s*$")


def failure_text(reason: str, message: str, *, limit: int = 1024) -> str:
    """``reason: message`` of a failed source, bounded (a source's message is someone else's text),
    without the runbook link our own conditions end with (the StageSet's message gets its own)."""
    message = _RUNBOOK.sub("", message).strip()
    text = f"{reason}: {message}" if reason and message else reason or message
    return text if len(text) <= limit else text[:limit] + "..."


def trigger(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What, when changed on a source object, calls for its StageSets to run: the artifact it
    offers and its readiness (a source that fails must be told in the StageSet's message)."""
    artifact = (obj.get("status") or {}).get("artifact") or {}
    ready = ready_condition(obj) or {}
    spec_ref = (obj.get("spec") or {}).get("sourceRef") or {}
    return (artifact.get("url") if isinstance(artifact, Mapping) else None,
            artifact.get("digest") if isinstance(artifact, Mapping) else None,
            artifact.get("revision") if isinstance(artifact, Mapping) else None,
            ready.get("status"), ready.get("reason"), ready.get("message"),
            tuple(sorted((str(k), str(v)) for k, v in spec_ref.items())) if isinstance(spec_ref, Mapping)
            else ())


def group_of(api_version: str | None) -> str:
    return _split(api_version or "")[0]


def points_at(external_artifact: Mapping[str, Any], *, group: str, kind: str, name: str,
              namespace: str) -> bool:
    """Does this ExternalArtifact's ``spec.sourceRef`` name the producer (group, kind, name)?  The
    version is not compared, so a producer may move to a new API version without breaking consumers."""
    ref = (external_artifact.get("spec") or {}).get("sourceRef") or {}
    if not isinstance(ref, Mapping):
        return False
    own = str((external_artifact.get("metadata") or {}).get("namespace") or "")
    return (ref.get("kind") == kind and ref.get("name") == name and group_of(ref.get("apiVersion")) == group
            and (ref.get("namespace") or own) == namespace)


def referenced(stageset: Mapping[str, Any], default: DefaultSourceKind) -> set[SourceObject]:
    """Every source object a StageSet's stages (and their ``job`` and ``apply`` actions) name (raw,
    from the watch cache): what, when it changes, requeues this StageSet.  A producer is named by its
    own key (its ExternalArtifact's events carry the producer's key too)."""
    namespace = str((stageset.get("metadata") or {}).get("namespace") or "")
    found: set[SourceObject] = set()
    for ref in _source_refs(stageset):
        if not isinstance(ref, Mapping) or not ref.get("name"):
            continue
        target = classify_raw(ref, default)
        if target.problem is None:
            found.add(SourceObject(target.group, target.name, str(ref.get("namespace") or namespace),
                                   str(ref["name"])))
    return found


def _source_refs(stageset: Mapping[str, Any]) -> list[Any]:
    """Every ``sourceRef`` of a raw StageSet: each stage's, and its ``job`` and ``apply`` actions'."""
    refs: list[Any] = []
    for stage in (stageset.get("spec") or {}).get("stages") or []:
        if not isinstance(stage, Mapping):
            continue
        refs.append(stage.get("sourceRef"))
        actions = stage.get("actions")
        for hook in ("pre", "post", "onFailure"):
            for action in (actions.get(hook) if isinstance(actions, Mapping) else None) or []:
                for verb in ("job", "apply"):
                    step = action.get(verb) if isinstance(action, Mapping) else None
                    if isinstance(step, Mapping):
                        refs.append(step.get("sourceRef"))
    return refs
