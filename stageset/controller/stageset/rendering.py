"""The StageSet reconciler's renderer: the one render service over the controller's own sources.

Rendering itself — the tenant's reads, the build, SOPS, substitution, the render cache — is
:class:`~stageset.controller.stageset.renderservice.RenderService`, the pipeline ``stageset build``
and ``diff`` call too.  What this module adds is the controller's side of it:

- where the files come from (:class:`MirrorFiles`): the controller's shared Git mirror, which
  holds only commits the GitRepository's own credentials fetched and serves a GitRepository only
  those (its uid-qualified consumer), or the artifact store, which hands out only the digest the
  tenant's own read of the source object named (:mod:`stageset.controller.artifacts`);
- the client pool the tenant's reads go through (:class:`ClusterReads`);
- each object's identity on the target (:func:`identify`), carried by :class:`Rendered`.

Identity: the source object (our GitRepository, a Flux source, a producer's ExternalArtifact)
and the ``substituteFrom`` ConfigMaps/Secrets are read as the stage's identity (through
:class:`~stageset.controller.stageset.reads.TenantReads`); the key Secret as the StageSet's
(:mod:`stageset.controller.stageset.decryption`).  Discovery (namespace defaulting) is the
target's (controller identity, or the remote kubeconfig's).

An artifact renders under the key ``("artifact", <digest>)``: a digest fixes every byte, so every
stage naming it shares one build per path and variables, and an unchanged artifact is never
built again.

A build starts at the stage's path but may load any file of the source root (``../``
bases, components); :func:`~stageset.controller.rendercache.render_stage` reads the whole
root at most once per commit and keys the render on exactly the files the build loads, so a
change in a shared base re-renders every stage that uses it and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from stageset.api import Stage
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.apply.inventory import ObjectId, object_id
from stageset.build import BuildLimits
from stageset.controller.redact import Redactor
from stageset.controller.rendercache import RenderCache, SourceRoot, StageDecryption
from stageset.controller.stageset.reads import ArtifactSource, Source, TenantReads, service_account_of
from stageset.controller.stageset.renderservice import (
    ARTIFACT_URL,
    Checkout,
    ClusterReads,
    Files,
    RenderService,
    mirror_files,
)
from stageset.controller.stageset.revisions import RevisionContent
from stageset.controller.stageset.targets import Target
from stageset.kube.client import ClientPool, Identity
from stageset.kube.types import KubeObject


class SourceTrees(Protocol):
    """What rendering needs of the Git mirror (:class:`sources.MirrorStore`)."""

    def tree_hash(self, url: str, *, commit: str, path: str = "./") -> str: ...

    def is_served(self, url: str, *, commit: str, consumer: str) -> bool: ...

    def read_tree(self, url: str, *, commit: str, path: str = "./", ignore: str | None = None,
                  consumer: str | None = None, unreadable: dict[str, str] | None = None
                  ) -> dict[str, bytes]: ...


class ArtifactTrees(Protocol):
    """What rendering needs of artifacts (:class:`stageset.controller.artifacts.ArtifactFetcher`)."""

    def require(self, source: ArtifactSource, *, stage: str, requester: str) -> object: ...

    def tree(self, source: ArtifactSource, *, stage: str, requester: str) -> SourceRoot: ...


@dataclass
class Rendered:
    """One stage, rendered and ready to apply."""

    stage: Stage
    identity: Identity
    revision: str
    objects: list[KubeObject]
    target: Target
    ids: set[ObjectId] = field(default_factory=set)
    source: Source | None = None
    """The source as read (at :attr:`revision`)."""
    inputs: str | None = None
    """A digest of the stage's ``postBuild`` variables (:func:`rollback.substitution_digest`)."""
    pinned: bool = False
    """Rendered at a recorded revision rather than the source's current one."""
    action_inputs: str = ""
    """What else the stage builds from besides its revision, as a digest: with the revision, what its
    actions run once for (:func:`~stageset.controller.stageset.actionplan.inputs_digest`)."""

    @property
    def account(self) -> str | None:
        """The ServiceAccount the stage acts as, as its inventory records it (``None``: the controller)."""
        found = service_account_of(self.identity)
        return found[1] if found is not None else None


class MirrorFiles:
    """The controller's :class:`~stageset.controller.stageset.renderservice.SourceFiles`: the shared
    Git mirror (a GitRepository is served only the commits fetched with its own credentials) and
    the artifact store (only the digest the tenant's read of the source named)."""

    def __init__(self, *, store: SourceTrees, artifacts: ArtifactTrees | None = None):
        self._store = store
        self._artifacts = artifacts

    def checkout(self, stage: Stage) -> Checkout | None:
        del stage
        return None  # the controller always reads the stage's source

    def git(self, source: Source, *, stage: Stage, identity: Identity, pinned: bool) -> Files:
        del identity  # the mirror is this process's; what it serves is decided by the consumer
        url, commit, ignore, consumer = source.url, source.commit, source.ignore, source.consumer
        if pinned and not self._store.is_served(url, commit=commit, consumer=consumer):
            raise StageError(Reason.PREVIOUS_REVISION_UNAVAILABLE, f"stage {stage.name!r}: GitRepository "
                             f"{source.name}: revision {source.revision} is no longer in the controller's "
                             "Git mirror")
        if not self._store.is_served(url, commit=commit, consumer=consumer):
            # Only what this GitRepository was served, never another commit of a shared mirror
            # (a status a tenant wrote, or a commit another tenant's credentials fetched).
            raise StageError(Reason.ARTIFACT_NOT_FOUND, f"stage {stage.name!r}: GitRepository "
                             f"{source.name}: revision {source.revision} has not been "
                             "fetched for it (yet)")
        store = self._store

        return mirror_files(store, url=url, commit=commit, ignore=ignore, consumer=consumer,
                            stage_path=stage.path)

    def artifact(self, source: ArtifactSource, *, stage: Stage, namespace: str) -> Files:
        if self._artifacts is None:
            raise StageError(Reason.STAGE_FAILED, f"stage {stage.name!r}: {source.what}: this controller "
                             "does not read artifacts")
        artifacts = self._artifacts
        # Asked before the render cache: a digest the store cannot serve (not downloaded yet, or
        # refused) says so even when another stage rendered it once.  Reading it waits for a miss.
        artifacts.require(source, stage=stage.name, requester=namespace)
        return Files(url=ARTIFACT_URL, commit=source.digest,
                     read_root=lambda: artifacts.tree(source, stage=stage.name, requester=namespace))


class Renderer:
    """The one :class:`RenderService` over :class:`MirrorFiles`, reading as the tenant through the
    controller's client pool; each render is identified on its target."""

    def __init__(self, *, clients: ClientPool, store: SourceTrees, reads: TenantReads, limits: BuildLimits,
                 cache: RenderCache | None = None, artifacts: ArtifactTrees | None = None,
                 revisions: RevisionContent | None = None):
        self._service = RenderService(reads=ClusterReads(clients=clients, reads=reads),
                                      files=MirrorFiles(store=store, artifacts=artifacts), limits=limits,
                                      cache=cache, revisions=revisions)

    @property
    def cache(self) -> RenderCache:
        return self._service.cache

    @property
    def revisions(self) -> RevisionContent:
        """Sources at recorded revisions (rollback, held updates), and keeping them readable."""
        return self._service.revisions

    def render(self, *, stage: Stage, identity: Identity, namespace: str, target: Target,
               redactor: Redactor, decryption: StageDecryption | None = None, revision: str | None = None,
               salt: str = "") -> Rendered:
        """Raises :class:`StageError`; Secret values read on the way (and values decrypted with
        ``decryption``, the StageSet's ``spec.decryption``) are added to ``redactor`` before
        anything can fail with them.  ``revision``: render at this recorded revision instead of the
        source's current one (``PreviousRevisionUnavailable`` when it is gone)."""
        done = self._service.render(stage=stage, identity=identity, namespace=namespace, redactor=redactor,
                                    decryption=decryption, revision=revision, salt=salt)
        return Rendered(stage=stage, identity=identity, revision=done.revision, objects=done.objects,
                        target=target, ids={identify(obj, namespace, target) for obj in done.objects},
                        source=done.source, inputs=done.inputs, pinned=done.pinned,
                        action_inputs=done.action_inputs)


def identify(obj: KubeObject, namespace: str, target: Target) -> ObjectId:
    """The object's identity after namespace defaulting (a kind not served yet — its CRD is in
    the same stage — is taken as namespaced, the common case for custom resources)."""
    manifest, resource = target.applier.resolve(obj, namespace)
    if resource is None and not manifest["metadata"].get("namespace"):
        manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
    return object_id(manifest)
