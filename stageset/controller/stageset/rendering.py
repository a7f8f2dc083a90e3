"""Rendering one stage: its source read as the tenant, built (cached by content), identified.

Identity: the source object (our GitRepository, a Flux source, a producer's ExternalArtifact)
and the ``substituteFrom`` ConfigMaps/Secrets are read as the stage's identity (through
:class:`~stageset.controller.stageset.reads.TenantReads`); the manifests come from the
controller's shared Git mirror, which holds only commits the GitRepository's own credentials
fetched, or from the artifact store, which hands out only the digest the tenant's own read of
the source object named (:mod:`stageset.controller.artifacts`).  Discovery (namespace
defaulting) is the target's (controller identity, or the remote kubeconfig's).

An artifact renders under the key ``("artifact", <digest>)``: a digest fixes every byte, so every
stage naming it shares one build per path and variables, and an unchanged artifact is never
built again.

A build starts at the stage's path but may load any file of the source root (``../``
bases, components); :func:`~stageset.controller.rendercache.render_stage` reads the whole
root at most once per commit and keys the render on exactly the files the build loads, so a
change in a shared base re-renders every stage that uses it and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from sources import RefNotFoundError, SourceError
from stageset.api import Stage
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.apply.inventory import ObjectId, object_id
from stageset.build import BuildError, BuildLimits, KustomizeNotFoundError
from stageset.build.decrypt import DecryptionError
from stageset.controller.redact import Redactor
from stageset.controller.rendercache import RenderCache, SourceRoot, StageDecryption, render_stage
from stageset.controller.stageset.actionplan import inputs_digest
from stageset.controller.stageset.reads import ArtifactSource, Source, TenantReads, service_account_of
from stageset.controller.stageset.revisions import GitRevisions, RevisionContent
from stageset.controller.stageset.rollback import substitution_digest
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


ARTIFACT_URL = "artifact:"
"""The render cache's URL for artifacts: the digest alone names the content."""


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


class Renderer:
    def __init__(self, *, clients: ClientPool, store: SourceTrees, reads: TenantReads, limits: BuildLimits,
                 cache: RenderCache | None = None, artifacts: ArtifactTrees | None = None,
                 revisions: RevisionContent | None = None):
        self._clients = clients
        self._store = store
        self._artifacts = artifacts
        self._reads = reads
        self._limits = limits
        self._cache = cache or RenderCache()
        self.revisions: RevisionContent = revisions or GitRevisions(None)

    def render(self, *, stage: Stage, identity: Identity, namespace: str, target: Target,
               redactor: Redactor, decryption: StageDecryption | None = None, revision: str | None = None,
               salt: str = "") -> Rendered:
        """Raises :class:`StageError`; Secret values read on the way (and values decrypted with
        ``decryption``, the StageSet's ``spec.decryption``) are added to ``redactor`` before
        anything can fail with them.  ``revision``: render at this recorded revision instead of the
        source's current one (``PreviousRevisionUnavailable`` when it is gone)."""
        client = self._clients.client(identity)
        source = self._reads.source(client, stage, namespace)
        pinned = revision is not None and revision != source.revision
        if isinstance(source, ArtifactSource):
            if pinned:
                # The artifact store keeps content by digest while it has room, but no record maps an
                # earlier revision back to its digest and URL: the restore is refused, nothing touched.
                raise StageError(Reason.PREVIOUS_REVISION_UNAVAILABLE,
                                 f"stage {stage.name!r}: {source.what}: revision {revision} cannot be "
                                 "restored: the controller keeps no earlier Flux artifact")
            variables, secret_values = self._reads.variables(client, stage, namespace)
            redactor.add(secret_values)
            return replace(self._render_artifact(source, stage=stage, identity=identity, namespace=namespace,
                                                 target=target, variables=variables, decryption=decryption,
                                                 salt=salt),
                           action_inputs=inputs_digest(stage, variables, secret_values))
        if pinned:
            assert revision is not None
            source = self.revisions.at(source, revision)
        variables, secret_values = self._reads.variables(client, stage, namespace)
        redactor.add(secret_values)
        url, commit, ignore = source.url, source.commit, source.ignore
        if pinned and not self._store.is_served(url, commit=commit, consumer=source.consumer):
            raise StageError(Reason.PREVIOUS_REVISION_UNAVAILABLE, f"stage {stage.name!r}: GitRepository "
                             f"{source.name}: revision {source.revision} is no longer in the controller's "
                             "Git mirror")
        if not self._store.is_served(url, commit=commit, consumer=source.consumer):
            # Only what this GitRepository was served, never another commit of a shared mirror
            # (a status a tenant wrote, or a commit another tenant's credentials fetched).
            raise StageError(Reason.ARTIFACT_NOT_FOUND, f"stage {stage.name!r}: GitRepository "
                             f"{source.name}: revision {source.revision} has not been "
                             "fetched for it (yet)")

        def read_root() -> SourceRoot:
            # The whole root, as the GitRepository was served it; a submodule or a link leaving
            # the root fails only a build that loads it.
            unreadable: dict[str, str] = {}
            files = self._store.read_tree(url, commit=commit, path="./", ignore=ignore,
                                          consumer=source.consumer, unreadable=unreadable)
            return SourceRoot(files=files, unreadable=unreadable)

        def read_path() -> SourceRoot:
            # Only the stage's own directory: enough for a plain path (no kustomization).
            unreadable: dict[str, str] = {}
            files = self._store.read_tree(url, commit=commit, path=stage.path, ignore=ignore,
                                          consumer=source.consumer, unreadable=unreadable)
            return SourceRoot(files=files, unreadable=unreadable)

        try:
            with build_failures(stage):
                objects = render_stage(self._cache, url=url, commit=commit, ignore=ignore, path=stage.path,
                                       variables=variables, read_tree=read_root, limits=self._limits,
                                       patches=kustomize_patches(stage), decryption=decryption,
                                       read_path=read_path)
        except RefNotFoundError as error:
            # Not in this controller's mirror (yet): the GitRepository will fetch it.  A recorded
            # revision is not fetched again: it is gone.
            raise StageError(Reason.PREVIOUS_REVISION_UNAVAILABLE if pinned else Reason.ARTIFACT_NOT_FOUND,
                             f"stage {stage.name!r}: {error}") from error
        except SourceError as error:
            raise StageError(Reason.STAGE_FAILED, f"stage {stage.name!r}: {error}") from error
        return Rendered(stage=stage, identity=identity, revision=source.revision, objects=objects,
                        target=target, ids={identify(obj, namespace, target) for obj in objects},
                        source=source, inputs=substitution_digest(variables, salt=salt), pinned=pinned,
                        action_inputs=inputs_digest(stage, variables, secret_values))

    def _render_artifact(self, source: ArtifactSource, *, stage: Stage, identity: Identity, namespace: str,
                         target: Target, variables: dict[str, str] | None,
                         decryption: StageDecryption | None, salt: str) -> Rendered:
        if self._artifacts is None:
            raise StageError(Reason.STAGE_FAILED, f"stage {stage.name!r}: {source.what}: this controller "
                             "does not read artifacts")
        artifacts = self._artifacts

        def read_root() -> SourceRoot:
            return artifacts.tree(source, stage=stage.name, requester=namespace)

        # Asked before the render cache: a digest the store cannot serve (not downloaded yet, or
        # refused) says so even when another stage rendered it once.  Reading it waits for a miss.
        artifacts.require(source, stage=stage.name, requester=namespace)
        with build_failures(stage):
            objects = render_stage(self._cache, url=ARTIFACT_URL, commit=source.digest, ignore=None,
                                   path=stage.path, variables=variables, read_tree=read_root,
                                   limits=self._limits, patches=kustomize_patches(stage),
                                   decryption=decryption)
        # No source to keep: an earlier artifact cannot be restored (see render).
        return Rendered(stage=stage, identity=identity, revision=source.revision, objects=objects,
                        target=target, ids={identify(obj, namespace, target) for obj in objects},
                        inputs=substitution_digest(variables, salt=salt))


@contextmanager
def build_failures(stage: Stage) -> Iterator[None]:
    """A failed build as the stage's ``StageFailed``."""
    try:
        yield
    except KustomizeNotFoundError as error:
        raise StageError(Reason.STAGE_FAILED, f"stage {stage.name!r}: this controller cannot build "
                         f"kustomizations: {error}") from error
    except DecryptionError as error:
        raise StageError(Reason.STAGE_FAILED, f"stage {stage.name!r}: decryption: {error}") from error
    except BuildError as error:
        raise StageError(Reason.STAGE_FAILED, f"stage {stage.name!r}: {error}") from error


def kustomize_patches(stage: Stage) -> list[dict[str, Any]]:
    """``stage.patches`` as kustomize ``Patch`` entries: a ``json6902`` list becomes JSON patch text."""
    entries: list[dict[str, Any]] = []
    for patch in stage.patches:
        text = patch.patch if patch.patch is not None else json.dumps(
            [op.model_dump(mode="json", by_alias=True, exclude_none=True) for op in patch.json6902 or []])
        entry: dict[str, Any] = {"patch": text}
        if patch.target is not None:
            entry["target"] = patch.target.model_dump(mode="json", by_alias=True, exclude_none=True)
        entries.append(entry)
    return entries


def identify(obj: KubeObject, namespace: str, target: Target) -> ObjectId:
    """The object's identity after namespace defaulting (a kind not served yet — its CRD is in
    the same stage — is taken as namespaced, the common case for custom resources)."""
    manifest, resource = target.applier.resolve(obj, namespace)
    if resource is None and not manifest["metadata"].get("namespace"):
        manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
    return object_id(manifest)
