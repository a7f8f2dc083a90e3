"""The one render pipeline: what the controller applies is what ``stageset build`` and ``diff`` show.

The StageSet reconciler (:class:`~stageset.controller.stageset.rendering.Renderer`) and the CLI
(:mod:`stageset.cli.render`) both turn a stage into objects through :class:`RenderService`, so
they cannot silently disagree.  Shared, whoever calls:

- the stage's source object and its ``substituteFrom`` ConfigMaps/Secrets, read as the tenant by
  :class:`~stageset.controller.render.reads.TenantReads` (the same kinds, refusals and messages);
- whom the Git mirror serves the commit to: the GitRepository *by uid*
  (:attr:`Source.consumer <stageset.controller.render.reads.Source.consumer>`, from
  :func:`~stageset.controller.consumers.artifact_consumer`), never a name a recreated object could
  reuse;
- the build: :func:`~stageset.controller.render.cache.render_stage` — the build limits, the stage's
  ``patches``, SOPS files decrypted with the StageSet's keys, ``postBuild`` substitution, the
  render cache;
- the digests a pass records: the substitution digest and the action inputs
  (:mod:`~stageset.controller.render.digests`).

What differs is supplied by the caller:

- **where the files come from** (:class:`~stageset.controller.render.files.SourceFiles`): the
  controller reads its shared mirror (only commits fetched for the GitRepository) and its artifact
  store; the CLI fetches into a mirror on the user's machine, downloads artifacts, or reads a local
  checkout (``--source-dir``, a :class:`~stageset.controller.render.files.Checkout`: the source
  object is then not read at all);
- **how keys are read** (a :class:`~stageset.controller.render.cache.StageDecryption` per render):
  :class:`~stageset.controller.render.decryption.PassDecryption` in the controller and in a CLI
  that reads the cluster (the key Secret as the StageSet's ServiceAccount), or the CLI's local age
  key file;
- **what is read as the tenant, through which client** (:class:`StageReads`): :class:`ClusterReads`
  over a :class:`~stageset.controller.render.reads.Clients` — the controller's pool, or the CLI's
  session (which first checks the user may impersonate) — or, for a CLI build without a cluster,
  nothing.

Identity: the source object and ``substituteFrom`` are read as the ``identity`` handed to
:meth:`RenderService.render` (the stage's: :meth:`IdentityPolicy.for_stage
<stageset.controller.identity.IdentityPolicy.for_stage>`); the key Secret as the decryption reads
it.  Nothing here makes a request of its own.

Invariants: Secret values read on the way (and values decrypted) reach the ``redactor`` before
anything can fail with them; a failure is a :class:`~stageset.apply.errors.StageError` naming the
stage (a caller's file source may raise its own errors, which pass through).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from sources import RefNotFoundError, SourceError
from stageset.api import Stage
from stageset.api.vocabulary import Reason
from stageset.apply.errors import StageError
from stageset.build import BuildError, BuildLimits, KustomizeNotFoundError
from stageset.build.decrypt import DecryptionError
from stageset.controller.redact import Redactor
from stageset.controller.render.cache import RenderCache, StageDecryption, render_stage
from stageset.controller.render.digests import inputs_digest, substitution_digest
from stageset.controller.render.files import Files, SourceFiles
from stageset.controller.render.reads import ArtifactSource, Clients, Source, TenantReads
from stageset.controller.render.revisions import GitRevisions, RevisionContent
from stageset.kube.client import Identity
from stageset.kube.types import KubeObject

Variables = tuple[dict[str, str] | None, list[str]]
"""A stage's ``postBuild`` variables (``None``: no ``postBuild``) and the values that came from Secrets."""


class StageReads(Protocol):
    """What a stage's render reads as the tenant: its source object and its ``postBuild`` variables."""

    def source(self, stage: Stage, *, identity: Identity, namespace: str) -> Source | ArtifactSource: ...

    def variables(self, stage: Stage, *, identity: Identity, namespace: str) -> Variables: ...


class ClusterReads:
    """:class:`StageReads` from the cluster: :class:`TenantReads` through a client as ``identity``."""

    def __init__(self, *, clients: Clients, reads: TenantReads):
        self._clients = clients
        self._reads = reads

    def source(self, stage: Stage, *, identity: Identity, namespace: str) -> Source | ArtifactSource:
        return self._reads.source(self._clients.client(identity), stage, namespace)

    def variables(self, stage: Stage, *, identity: Identity, namespace: str) -> Variables:
        if stage.post_build is None:
            # Nothing to read, so no client is asked for: the CLI's impersonation check waits for
            # a read that needs it (a local checkout without variables impersonates no one).
            return None, []
        return self._reads.variables(self._clients.client(identity), stage, namespace)


@dataclass(frozen=True)
class StageRender:
    """One stage, rendered: its objects and what the pass records of how."""

    stage: Stage
    identity: Identity
    revision: str
    objects: list[KubeObject]
    source: Source | None
    """The Git source as read (at :attr:`revision`); ``None`` for an artifact (no earlier one can be
    restored) or a checkout."""
    inputs: str | None
    """A digest of the ``postBuild`` variables
    (:func:`~stageset.controller.render.digests.substitution_digest`)."""
    pinned: bool
    """Rendered at a recorded revision rather than the source's current one."""
    action_inputs: str
    """What else the stage builds from besides its revision (:func:`inputs_digest`)."""


class RenderService:
    """Renders one stage: reads as the tenant, files from the caller's :class:`SourceFiles`, one build."""

    def __init__(self, *, reads: StageReads, files: SourceFiles, limits: BuildLimits,
                 cache: RenderCache | None = None, revisions: RevisionContent | None = None):
        self._reads = reads
        self._files = files
        self._limits = limits
        self.cache = cache or RenderCache()
        self.revisions: RevisionContent = revisions or GitRevisions(None)

    def render(self, *, stage: Stage, identity: Identity, namespace: str, redactor: Redactor,
               decryption: StageDecryption | None = None, revision: str | None = None,
               salt: str = "") -> StageRender:
        """Raises :class:`StageError`.  ``decryption`` is the StageSet's keys (``None``: a SOPS file
        fails the build); ``revision``: render at this recorded revision instead of the source's
        current one (``PreviousRevisionUnavailable`` when it is gone); ``salt``: the StageSet's uid,
        for the substitution digest."""
        checkout = self._files.checkout(stage)
        if checkout is not None:
            variables, secrets = self._variables(stage, identity, namespace, redactor)
            objects = self._build(stage, checkout.files, variables, decryption)
            return StageRender(stage=stage, identity=identity, revision=checkout.revision, objects=objects,
                               source=None, inputs=substitution_digest(variables, salt=salt), pinned=False,
                               action_inputs=inputs_digest(stage, variables, secrets))
        source = self._reads.source(stage, identity=identity, namespace=namespace)
        pinned = revision is not None and revision != source.revision
        if isinstance(source, ArtifactSource):
            if pinned:
                # The artifact store keeps content by digest while it has room, but no record maps an
                # earlier revision back to its digest and URL: the restore is refused, nothing touched.
                raise StageError(Reason.PREVIOUS_REVISION_UNAVAILABLE,
                                 f"stage {stage.name!r}: {source.what}: revision {revision} cannot be "
                                 "restored: the controller keeps no earlier Flux artifact")
            variables, secrets = self._variables(stage, identity, namespace, redactor)
            files = self._files.artifact(source, stage=stage, namespace=namespace)
            objects = self._build(stage, files, variables, decryption)
            return StageRender(stage=stage, identity=identity, revision=source.revision, objects=objects,
                               source=None, inputs=substitution_digest(variables, salt=salt), pinned=False,
                               action_inputs=inputs_digest(stage, variables, secrets))
        if pinned:
            assert revision is not None
            source = self.revisions.at(source, revision)
        variables, secrets = self._variables(stage, identity, namespace, redactor)
        files = self._files.git(source, stage=stage, identity=identity, pinned=pinned)
        try:
            objects = self._build(stage, files, variables, decryption)
        except RefNotFoundError as error:
            # Not in the mirror (yet): the GitRepository will fetch it.  A recorded revision is not
            # fetched again: it is gone.
            raise StageError(Reason.PREVIOUS_REVISION_UNAVAILABLE if pinned else Reason.ARTIFACT_NOT_FOUND,
                             f"stage {stage.name!r}: {error}") from error
        except SourceError as error:
            raise StageError(Reason.STAGE_FAILED, f"stage {stage.name!r}: {error}") from error
        return StageRender(stage=stage, identity=identity, revision=source.revision, objects=objects,
                           source=source, inputs=substitution_digest(variables, salt=salt), pinned=pinned,
                           action_inputs=inputs_digest(stage, variables, secrets))

    def _variables(self, stage: Stage, identity: Identity, namespace: str, redactor: Redactor) -> Variables:
        variables, secrets = self._reads.variables(stage, identity=identity, namespace=namespace)
        redactor.add(secrets)  # before anything can fail with them
        return variables, secrets

    def _build(self, stage: Stage, files: Files, variables: dict[str, str] | None,
               decryption: StageDecryption | None) -> list[KubeObject]:
        with build_failures(stage):
            return render_stage(self.cache, url=files.url, commit=files.commit, ignore=files.ignore,
                                path=stage.path, variables=variables, read_tree=files.read_root,
                                limits=self._limits, patches=kustomize_patches(stage), decryption=decryption,
                                read_path=files.read_path)


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
