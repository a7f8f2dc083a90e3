"""Reading what a StageSet names — its sources, ``substituteFrom`` objects, its dependencies — as the tenant.

Identity: every read here goes through the client handed in, bound by the caller to the
identity :mod:`stageset.controller.identity` picks (the stage's ServiceAccount for a
stage's source and variables, the StageSet's for ``spec.dependsOn``).  A 403 is
``RBACDenied`` naming only what the user wrote; a 404 is reported the same whether or not
the tenant could have read it, since the apiserver authorizes before it looks — so no
message tells a tenant whether something exists in a namespace it cannot read.

``--no-cross-namespace-refs`` is enforced here, before anything in another namespace is read:
a refused ``sourceRef`` is ``ResolveFailed``, a refused ``dependsOn`` ``DependencyNotReady``
(as the reference reports them; an entry of another kind too), each with a fixed text that names
nothing of the other namespace.

Label shards (``--watch-label-selector``): our GitRepository is fetched by the shard whose selector
its labels match; a StageSet naming one of another shard waits (``SourceNotReady``) with a message
that says so (:func:`~stageset.controller.sharding.foreign_source_message`).

Sources (:meth:`TenantReads.source`): what a ``sourceRef`` names is decided by
:mod:`stageset.controller.sourcekinds` (``--default-source-kind``); our GitRepository gives a
:class:`Source` (a commit of the shared Git mirror), a Flux source or a producer's
``ExternalArtifact`` an :class:`ArtifactSource` (a URL and the digest that proves its content).  A
producer is found by listing the ``ExternalArtifact`` objects of its namespace, as the tenant.  A
source that is not Ready says why in the stage's message — its own reason and message — unless it
lives in another namespace: then only the fixed text is shown, nothing of the other namespace.

A read that is denied or finds nothing is said as every tenant read says it
(:mod:`stageset.controller.accounts`: after a denial, whether the ServiceAccount exists).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Protocol

from sources import parse_revision
from stageset.api import Stage, StageSet
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.build import BuildError, VariableSource, merge_variables
from stageset.controller.accounts import AccountCheck, read_named, read_optional
from stageset.controller.conditions import ready_at_generation
from stageset.controller.consumers import artifact_consumer
from stageset.controller.sharding import LabelSelector, foreign_source_message
from stageset.controller.sourcekinds import (
    FLUX_GROUP,
    Artifact,
    DefaultSourceKind,
    NotUsable,
    RefKind,
    SourceObject,
    SourceTarget,
    artifact_state,
    classify,
    failure_text,
    points_at,
    ready_condition,
)
from stageset.kube.client import ApiError, Identity, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

CROSS_NAMESPACE_SOURCE = ("sourceRef names a source in another namespace, and this controller does not "
                          "allow cross-namespace references (--no-cross-namespace-refs); use a source in "
                          "the StageSet's own namespace")
CROSS_NAMESPACE_DEPENDENCY = ("dependsOn names a StageSet in another namespace, and this controller does not "
                              "allow cross-namespace references (--no-cross-namespace-refs); depend only on "
                              "StageSets of this namespace")
CROSS_NAMESPACE_OBJECT = ("dependsOn names an object in another namespace, and this controller does not "
                          "allow cross-namespace references (--no-cross-namespace-refs); depend only on "
                          "objects of this namespace (or cluster-scoped ones)")


class Clients(Protocol):
    """A client bound to an identity (:class:`~stageset.kube.client.ClientPool`, or the CLI's session)."""

    def client(self, identity: Identity) -> KubeClient: ...


@dataclass(frozen=True)
class Source:
    """A stage's GitRepository as its status and spec say: where to read the manifests."""

    url: str
    revision: str
    commit: str
    ignore: str | None
    consumer: str
    """Whom the shared mirror served this GitRepository's commits to (:func:`artifact_consumer`)."""
    name: str
    """``namespace/name`` of the GitRepository, as the StageSet wrote it."""


@dataclass(frozen=True)
class ArtifactSource:
    """A stage's Flux source (or its producer's ExternalArtifact), as the tenant read it."""

    what: str
    """How messages name it: ``OCIRepository shop/app`` (the object the artifact came from)."""
    origin: SourceObject
    """The object read (a producer's ExternalArtifact, not the producer)."""
    url: str
    digest: str
    revision: str
    cross_namespace: bool
    """In another namespace than the StageSet: messages say nothing of what the object holds."""


class NothingSaidYet(StageError):
    """Our GitRepository has said nothing yet (no Ready condition: its first fetch is queued or
    running).  Reported as before; :mod:`~stageset.controller.stageset.holding` waits longer for
    it, since its first conclusion, whatever it is, wakes this StageSet (a dependency's would not:
    only its turning Ready does)."""


def _not_usable(stage: Stage, what: str, state: NotUsable, *, cross: bool) -> StageError:
    """A source that is not Ready (``SourceNotReady``, with its own reason and message unless it is
    another namespace's) or Ready without an artifact (``ArtifactNotFound``)."""
    if not state.ready:
        why = "" if cross else failure_text(state.reason, state.message)
        return StageError(Reason.SOURCE_NOT_READY,
                          f"stage {stage.name!r}: {what} is not ready" + (f": {why}" if why else ""))
    detail = "has no usable artifact" if cross else state.message
    return StageError(Reason.ARTIFACT_NOT_FOUND, f"stage {stage.name!r}: {what}: {detail}")


class TenantReads:
    def __init__(self, *, stagesets: Resource, sources: Resource, no_cross_namespace_refs: bool,
                 accounts: AccountCheck | None = None,
                 default_source_kind: DefaultSourceKind = DefaultSourceKind.GIT_REPOSITORY,
                 shard: LabelSelector | None = None):
        self._stagesets = stagesets
        # --watch-label-selector: our GitRepositories outside it are fetched by another shard.
        self._shard = shard
        self._sources = sources
        self._no_cross = no_cross_namespace_refs
        self.accounts = accounts or AccountCheck(clients=None, controller_reads_accounts=False)
        self.default_source_kind = default_source_kind

    def target(self, stage: Stage) -> SourceTarget:
        """What the stage's ``sourceRef`` names under this controller's ``--default-source-kind``."""
        ref = stage.source_ref
        return classify(api_version=ref.api_version, kind=ref.kind, default=self.default_source_kind)

    def source(self, client: KubeClient, stage: Stage, namespace: str) -> Source | ArtifactSource:
        """The stage's source, read as the stage's identity: our GitRepository, or an artifact."""
        ref = stage.source_ref
        source_ns = ref.namespace or namespace
        if source_ns != namespace and self._no_cross:
            raise StageError(Reason.RESOLVE_FAILED, f"stage {stage.name!r}: {CROSS_NAMESPACE_SOURCE}")
        target = self.target(stage)
        if target.problem is not None:
            raise StageError(Reason.INVALID_SPEC, f"stage {stage.name!r}: {target.problem}")
        if target.kind is RefKind.OURS:
            return self._git_source(client, stage, source_ns, cross=source_ns != namespace)
        return self._artifact_source(client, stage, target, source_ns, cross=source_ns != namespace)

    def _git_source(self, client: KubeClient, stage: Stage, source_ns: str, *, cross: bool) -> Source:
        ref = stage.source_ref
        what = f"GitRepository {source_ns}/{ref.name}"
        found = read_named(client, self._sources.object_path(name=ref.name, namespace=source_ns),
                           what=f"{what} (stage {stage.name!r})", missing_reason=Reason.SOURCE_NOT_READY,
                           missing_message=f"stage {stage.name!r}: {what} not found", accounts=self.accounts)
        if self._shard is not None and not self._shard.matches(found.get("metadata", {}).get("labels")):
            # Another shard fetches it, into its own mirror: say so, rather than "not fetched yet".
            raise StageError(Reason.SOURCE_NOT_READY, f"stage {stage.name!r}: " + foreign_source_message(
                what=what, selector=self._shard, cross_namespace=cross))
        revision = ((found.get("status") or {}).get("artifact") or {}).get("revision")
        if not revision:
            ready = ready_condition(found) or {}
            if ready.get("status") == "False":
                # Failed, and nothing fetched before: say why, as the GitRepository's own status does.
                raise _not_usable(stage, what, NotUsable(False, str(ready.get("reason") or ""),
                                                         str(ready.get("message") or "")), cross=cross)
            message = f"stage {stage.name!r}: {what} has no artifact yet"
            if not ready:
                raise NothingSaidYet(Reason.SOURCE_NOT_READY, message)
            raise StageError(Reason.SOURCE_NOT_READY, message)
        _, commit = parse_revision(revision)
        return Source(url=str(found["spec"]["url"]), revision=revision, commit=commit,
                      ignore=found["spec"].get("ignore"), consumer=artifact_consumer(found["metadata"]),
                      name=f"{source_ns}/{ref.name}")

    def _artifact_source(self, client: KubeClient, stage: Stage, target: SourceTarget, source_ns: str, *,
                         cross: bool) -> ArtifactSource:
        ref = stage.source_ref
        if target.kind is RefKind.FLUX:
            what = f"{target.describe()} {source_ns}/{ref.name}"
            path = f"/apis/{target.api_version}/namespaces/{source_ns}/{target.plural}/{ref.name}"
            found = self._flux_object(client, stage, target, path, what)
            origin = SourceObject(FLUX_GROUP, target.name, source_ns, ref.name)
        else:
            found = self._producer_artifact(client, stage, target, source_ns)
            what = (f"ExternalArtifact {source_ns}/{found['metadata']['name']} "
                    f"(of {target.describe()} {ref.name})")
            origin = SourceObject(FLUX_GROUP, "ExternalArtifact", source_ns, str(found["metadata"]["name"]))
        state = artifact_state(found)
        if isinstance(state, NotUsable):
            raise _not_usable(stage, what, state, cross=cross)
        assert isinstance(state, Artifact)
        return ArtifactSource(what=what, origin=origin, url=state.url, digest=state.digest,
                              revision=state.revision, cross_namespace=cross)

    def _flux_object(self, client: KubeClient, stage: Stage, target: SourceTarget, path: str,
                     what: str) -> KubeObject:
        """The Flux source object; a 404 says whether the object or its kind (at that version) is missing."""
        try:
            return read_named(client, path, what=f"{what} (stage {stage.name!r})",
                              missing_reason=Reason.ARTIFACT_NOT_FOUND, accounts=self.accounts)
        except StageError as error:
            if error.reason is not Reason.ARTIFACT_NOT_FOUND:
                raise
        try:
            resources = client.get(f"/apis/{target.api_version}").get("resources") or []
            served = any(r.get("name") == target.plural for r in resources)
        except ApiError:
            served = False  # discovery answers every authenticated user: a 404 means not served
        if served:
            raise StageError(Reason.ARTIFACT_NOT_FOUND, f"stage {stage.name!r}: {what} not found")
        raise StageError(Reason.ARTIFACT_NOT_FOUND, f"stage {stage.name!r}: {what} not found: this cluster "
                         f"does not serve {target.api_version} (Flux's source CRDs are not installed, or "
                         f"serve another version: this controller reads v1 and v1beta2)")

    def _producer_artifact(self, client: KubeClient, stage: Stage, target: SourceTarget,
                           source_ns: str) -> KubeObject:
        """The one ExternalArtifact of ``source_ns`` whose ``spec.sourceRef`` names the producer, listed
        as the stage's identity."""
        ref = stage.source_ref
        producer = f"{target.describe()} {source_ns}/{ref.name}"
        path = f"/apis/{FLUX_GROUP}/v1/namespaces/{source_ns}/externalartifacts"
        try:
            items = client.get(path).get("items") or []
        except ApiError as error:
            if error.forbidden:
                why = self.accounts.explain(client)
                raise StageError(Reason.RBAC_DENIED, f"{client.identity.describe()} may not list "
                                 f"ExternalArtifacts in namespace {source_ns} (stage {stage.name!r}, the "
                                 f"artifact of {producer}){why}") from error
            if error.not_found:
                raise StageError(Reason.ARTIFACT_NOT_FOUND, f"stage {stage.name!r}: {producer} has no "
                                 "artifact: ExternalArtifacts are not served (Flux's source-controller "
                                 "CRDs are not installed)") from error
            raise
        matches: list[KubeObject] = [
            item for item in items
            if points_at(item, group=target.group, kind=target.name, name=ref.name, namespace=source_ns)]
        if not matches:
            raise StageError(Reason.ARTIFACT_NOT_FOUND, f"stage {stage.name!r}: {producer} has no artifact: "
                             f"no ExternalArtifact in namespace {source_ns} points at it (spec.sourceRef)")
        if len(matches) > 1:
            names = ", ".join(sorted(str(m["metadata"]["name"]) for m in matches))
            raise StageError(Reason.ARTIFACT_NOT_FOUND, f"stage {stage.name!r}: {producer} has "
                             f"{len(matches)} ExternalArtifacts pointing at it ({names}); which one to use "
                             "is undefined")
        return matches[0]

    def variables(self, client: KubeClient, stage: Stage, namespace: str) -> tuple[dict[str, str] | None,
                                                                                   list[str]]:
        """``postBuild`` variables, ``substituteFrom`` read as the stage's identity; and the values
        that came from Secrets (to be redacted from every message)."""
        if stage.post_build is None:
            return None, []
        sources: list[VariableSource] = []
        for ref in stage.post_build.substitute_from:
            plural = "configmaps" if ref.kind == "ConfigMap" else "secrets"
            # Only "not found" is tolerated (and only when optional): a denied read fails the stage.
            obj = read_optional(client, f"/api/v1/namespaces/{namespace}/{plural}/{ref.name}",
                                what=f"{ref.kind} {namespace}/{ref.name} (stage {stage.name!r})",
                                accounts=self.accounts)
            data: dict[str, str] | None = None if obj is None else (obj.get("data") or {})
            sources.append(VariableSource(ref.kind, ref.name, data, ref.optional))
        try:
            merged = merge_variables(stage.post_build.substitute, sources)
        except BuildError as error:
            raise StageError(Reason.STAGE_FAILED, f"stage {stage.name!r}: {error}") from error
        return merged, _secret_values(sources)

    def dependencies(self, client: KubeClient, stageset: StageSet) -> list[KubeObject]:
        """Every StageSet in ``spec.dependsOn`` (in spec order; entries of other kinds are not read
        here), read as the StageSet's identity (403: RBACDenied, 404: DependencyNotReady)."""
        namespace = str(stageset.metadata["namespace"])
        found: list[KubeObject] = []
        for ref in stageset.spec.depends_on:
            if not ref.names_stageset:
                continue  # an object of another kind: stageset.controller.stageset.objectdeps
            ref_ns = ref.namespace or namespace
            found.append(read_named(client, self._stagesets.object_path(name=ref.name, namespace=ref_ns),
                                    what=f"StageSet {ref_ns}/{ref.name} (spec.dependsOn)",
                                    missing_reason=Reason.DEPENDENCY_NOT_READY, accounts=self.accounts))
        return found

    @staticmethod
    def require_ready(dependencies: list[KubeObject]) -> None:
        for other in dependencies:
            if not ready_at_generation(other):
                meta = other["metadata"]
                raise StageError(Reason.DEPENDENCY_NOT_READY,
                                 f"StageSet {meta['namespace']}/{meta['name']} is not Ready")

    def refuse_cross_namespace(self, stageset: StageSet) -> None:
        """Under ``--no-cross-namespace-refs``: refuse ``spec.dependsOn`` into other namespaces
        before anything (even the dependency index) is consulted about them."""
        if not self._no_cross:
            return
        namespace = str(stageset.metadata["namespace"])
        for ref in stageset.spec.depends_on:
            if (ref.namespace or namespace) != namespace:
                raise StageError(Reason.DEPENDENCY_NOT_READY, CROSS_NAMESPACE_DEPENDENCY if ref.names_stageset
                                 else CROSS_NAMESPACE_OBJECT)


def _secret_values(sources: list[VariableSource]) -> list[str]:
    """Every value of every ``substituteFrom`` Secret (decoded), whether or not a later entry won."""
    values: set[str] = set()
    for source in sources:
        if source.kind != "Secret":
            continue
        for encoded in (source.data or {}).values():
            try:
                values.add(base64.b64decode(encoded).decode())
            except ValueError:
                continue  # not valid base64/UTF-8: merge_variables already refused it
    return sorted(v for v in values if v)
