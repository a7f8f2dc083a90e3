"""The StageSet reconciler's renderer: the one render service over the controller's own sources.

Rendering itself — the tenant's reads, the build, SOPS, substitution, the render cache — is
:class:`~stageset.controller.render.service.RenderService`, the pipeline ``stageset build``
and ``diff`` call too (:mod:`stageset.controller.render`).  What this module adds is the pass's
side of it:

- the render service over the controller's files
  (:class:`~stageset.controller.render.files.MirrorFiles`: the shared Git mirror and the artifact
  store), reading as the tenant through its client pool;
- each object's identity on the target (:func:`identify`), carried by :class:`Rendered` with the
  stage's identity and target.

Identity: the source object (our GitRepository, a Flux source, a producer's ExternalArtifact)
and the ``substituteFrom`` ConfigMaps/Secrets are read as the stage's identity (through
:class:`~stageset.controller.render.reads.TenantReads`); the key Secret as the StageSet's
(:mod:`stageset.controller.render.decryption`).  Discovery (namespace defaulting) is the
target's (controller identity, or the remote kubeconfig's).

An artifact renders under the key ``("artifact", <digest>)``: a digest fixes every byte, so every
stage naming it shares one build per path and variables, and an unchanged artifact is never
built again.

A build starts at the stage's path but may load any file of the source root (``../``
bases, components); :func:`~stageset.controller.render.cache.render_stage` reads the whole
root at most once per commit and keys the render on exactly the files the build loads, so a
change in a shared base re-renders every stage that uses it and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stageset.api import Stage
from stageset.apply.inventory import ObjectId, object_id
from stageset.build import BuildLimits
from stageset.controller.accounts import service_account_of
from stageset.controller.redact import Redactor
from stageset.controller.render.cache import RenderCache, StageDecryption
from stageset.controller.render.reads import Source, TenantReads
from stageset.controller.render.revisions import RevisionContent
from stageset.controller.render.service import ClusterReads, RenderService
from stageset.controller.render.stores import ArtifactTrees, MirrorFiles, SourceTrees
from stageset.controller.targets.clusters import Target
from stageset.kube.client import ClientPool, Identity
from stageset.kube.types import KubeObject


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
    """A digest of the stage's ``postBuild`` variables
    (:func:`~stageset.controller.render.digests.substitution_digest`)."""
    pinned: bool = False
    """Rendered at a recorded revision rather than the source's current one."""
    action_inputs: str = ""
    """What else the stage builds from besides its revision, as a digest: with the revision, what its
    actions run once for (:func:`~stageset.controller.render.digests.inputs_digest`)."""

    @property
    def account(self) -> str | None:
        """The ServiceAccount the stage acts as, as its inventory records it (``None``: the controller)."""
        found = service_account_of(self.identity)
        return found[1] if found is not None else None


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
