"""Rendering a StageSet's stages on the user's machine, for ``build`` and ``diff``: the controller's pipeline.

Every stage goes through the controller's own render service
(:class:`~stageset.controller.render.service.RenderService`): the same source and
``substituteFrom`` reads, the same Git mirror consumer (the GitRepository by uid), the same build
limits, stage ``patches``, SOPS decryption and substitution, the same error messages — so
``build`` and ``diff`` show what the controller would render and apply.  This module supplies
only what differs on the user's machine:

- **where the files come from**: :class:`~stageset.cli.sourcefiles.CliFiles` (``--source-dir``
  checkouts, a mirror and an artifact store under ``~/.cache/stageset``);
- **how a client is had**: :class:`SessionClients`, the user's kubeconfig, impersonating;
  ``None`` for ``build -f ... --source-dir ...``, which reads no cluster (:class:`OfflineReads`:
  only ``postBuild.substitute`` and ``${var:=default}`` apply);
- **how keys are read**: the controller's
  :class:`~stageset.controller.render.decryption.PassDecryption` over the session, or a local
  age identity file (``--sops-age-key-file``, :class:`KeyFileDecryption`, which reads no Secret).

Identity — the controller's rules (:mod:`stageset.controller.identity`), so the output is what
the controller would render and apply:

- the source object and ``substituteFrom`` ConfigMaps/Secrets are read as the **stage's
  ServiceAccount** (impersonated); a StageSet without one is read as the user (what a
  single-tenant controller would do);
- the GitRepository's ``secretRef`` is read as its ``serviceAccountName`` (else the user);
- the SOPS key Secret (``spec.decryption``) as the **StageSet's** ServiceAccount;
- Git and artifacts are fetched from the user's machine with those credentials.

Impersonation needs the user's ``impersonate`` right on that ServiceAccount: it is checked
first (a SelfSubjectAccessReview), so a user without it gets one clear message, not an
``RBACDenied`` that blames the tenant.

Nothing of a Secret is printed unless asked: Secret ``data``/``stringData`` values are masked,
and so are values substituted from ``substituteFrom`` Secrets and values decrypted from SOPS
files, wherever they landed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import ValidationError

from stageset.api import Stage, StageSet
from stageset.apply.errors import StageError
from stageset.build import BuildError, BuildLimits, VariableSource, merge_variables
from stageset.build.decrypt import DecryptionKeys
from stageset.cli.session import CliError, Session
from stageset.cli.sourcefiles import CliFiles, GitMirror, SourceDirs
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.redact import MASK, Redactor
from stageset.controller.render.cache import StageDecryption
from stageset.controller.render.decryption import PassDecryption
from stageset.controller.render.reads import ArtifactSource, Clients, Source, TenantReads
from stageset.controller.render.service import (
    ClusterReads,
    RenderService,
    StageReads,
    Variables,
)
from stageset.controller.sourcekinds import DefaultSourceKind
from stageset.controller.status import validation_message
from stageset.kube.client import Identity, KubeClient
from stageset.kube.types import KubeObject

__all__ = ["POLICY", "RenderedStage", "Renderer", "SessionClients", "SourceDirs", "mask_secret",
           "parse_stageset", "redact_strings", "stageset_from_file"]

# The CLI acts as the user; with no ServiceAccount named, it reads and dry-runs as the user
# (what a single-tenant controller would do), never as anyone with more rights.
POLICY = IdentityPolicy(cluster_admin=True)


# -- the StageSet ---------------------------------------------------------------------------------

def parse_stageset(raw: KubeObject, *, where: str) -> StageSet:
    try:
        return StageSet.model_validate({**raw, "status": None})
    except ValidationError as error:
        raise CliError(f"{where}: not a valid StageSet: {validation_message(error)}") from None


def stageset_from_file(path: Path, *, name: str | None, namespace: str) -> StageSet:
    """The StageSet in a YAML file (which may hold other documents, e.g. its GitRepository)."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    except (OSError, yaml.YAMLError) as error:
        raise CliError(f"{path}: {error}") from None
    found = [d for d in documents if d.get("kind") == "StageSet"
             and (name is None or (d.get("metadata") or {}).get("name") == name)]
    if len(found) != 1:
        what = f"a StageSet named {name!r}" if name else "exactly one StageSet"
        raise click.UsageError(f"{path} holds {len(found)} matching StageSets; name {what}"
                               + ("" if name else " with NAME"))
    raw = found[0]
    meta = {**(raw.get("metadata") or {})}
    meta.setdefault("namespace", namespace)
    return parse_stageset({**raw, "metadata": meta}, where=str(path))


# -- rendering ------------------------------------------------------------------------------------

@dataclass
class RenderedStage:
    stage: Stage
    identity: Identity
    revision: str
    objects: list[KubeObject] = field(default_factory=list)
    error: StageError | CliError | None = None
    inputs: str = ""
    """What else the stage builds from, as the controller's actions ledger keys it
    (:func:`~stageset.controller.render.digests.inputs_digest`)."""


def _impersonation_check(client: KubeClient, identity: Identity, checked: set[Identity]) -> None:
    """Refuse early, and clearly, when the user may not act as the stage's ServiceAccount."""
    if identity.user is None or identity in checked:
        return
    _, _, rest = identity.user.partition("system:serviceaccount:")
    namespace, _, name = rest.partition(":")
    review = client.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "impersonate", "resource": "serviceaccounts",
                                        "namespace": namespace, "name": name}}})
    if not (review.get("status") or {}).get("allowed"):
        raise CliError(
            f"you may not impersonate {identity.user}: build and diff read and dry-run as the "
            f"StageSet's ServiceAccount, as the controller does. Ask for `impersonate` on "
            f"serviceaccounts/{name} in namespace {namespace} (see docs/cli.md), or use build with "
            "-f and --source-dir, which needs no cluster")
    checked.add(identity)


class SessionClients:
    """The CLI's clients for the render service: the user's session, impersonating an identity only
    after checking (once per identity) that the user may."""

    def __init__(self, session: Session):
        self._session = session
        self._checked: set[Identity] = set()

    def client(self, identity: Identity) -> KubeClient:
        _impersonation_check(self._session.client(), identity, self._checked)
        return self._session.client(identity)


class OfflineReads:
    """What a build without a cluster reads as the tenant: nothing.  A stage needs a ``--source-dir``;
    ``substituteFrom`` is not read (said once per stage), so only ``postBuild.substitute`` and
    ``${var:=default}`` apply."""

    def __init__(self, warn: Callable[[str], None]):
        self._warn = warn

    def source(self, stage: Stage, *, identity: Identity, namespace: str) -> Source | ArtifactSource:
        del identity, namespace  # nothing is read
        raise CliError(f"stage {stage.name!r}: no --source-dir for source {stage.source_ref.name!r}")

    def variables(self, stage: Stage, *, identity: Identity, namespace: str) -> Variables:
        del identity, namespace  # nothing is read
        if stage.post_build is None:
            return None, []
        if stage.post_build.substitute_from:
            names = ", ".join(f"{r.kind}/{r.name}" for r in stage.post_build.substitute_from)
            self._warn(f"stage {stage.name!r}: substituteFrom ({names}) not read: a local build reads no "
                       "cluster; only postBuild.substitute and ${var:=default} apply")
        sources = [VariableSource(r.kind, r.name, None, True) for r in stage.post_build.substitute_from]
        try:
            return merge_variables(stage.post_build.substitute, sources), []
        except BuildError as error:
            raise CliError(f"stage {stage.name!r}: {error}") from None


class KeyFileDecryption:
    """A StageSet's keys from a local age identity file (``--sops-age-key-file``): no Secret is read.
    Decrypted values go to the redactor, as the controller's go to the StageSet's."""

    def __init__(self, *, path: Path, scope: str, redactor: Redactor):
        self._path = path
        self._scope = scope
        self._redactor = redactor
        self._keys: DecryptionKeys | None = None

    @property
    def scope(self) -> str:
        return self._scope

    def keys(self) -> DecryptionKeys:
        if self._keys is None:
            self._keys = DecryptionKeys.from_age_file(self._path)
        return self._keys

    def reveal(self, values: frozenset[str]) -> None:
        self._redactor.add(values)


class UnreadKeys:
    """``spec.decryption`` in a build that reads no cluster: a stage with a SOPS file fails, saying why."""

    def __init__(self, *, scope: str, secret: str):
        self._scope = scope
        self._secret = secret

    @property
    def scope(self) -> str:
        return self._scope

    def keys(self) -> DecryptionKeys:
        raise BuildError(f"SOPS-encrypted files, and a local build reads no cluster, so give "
                         f"--sops-age-key-file (spec.decryption names Secret {self._secret})")

    def reveal(self, values: frozenset[str]) -> None:
        del values  # keys() never returns: nothing is decrypted


class Renderer:
    """Renders every stage of one StageSet through the controller's render service."""

    def __init__(self, *, clients: Clients | None, sources: SourceDirs, cache_dir: Path,
                 warn: Callable[[str], None],
                 default_source_kind: DefaultSourceKind = DefaultSourceKind.GIT_REPOSITORY,
                 age_key_file: Path | None = None, mirror: GitMirror | None = None):
        """``clients``: ``None`` reads no cluster (``build -f ... --source-dir ...``); ``mirror``:
        the Git mirror (default: one under ``cache_dir``)."""
        self._clients = clients
        self._age_key_file = age_key_file
        self.redactor = Redactor()
        self._reads = TenantReads(stagesets=STAGESETS, sources=GITREPOSITORIES, no_cross_namespace_refs=False,
                                  default_source_kind=default_source_kind)
        reads: StageReads = (OfflineReads(warn) if clients is None
                             else ClusterReads(clients=clients, reads=self._reads))
        files = CliFiles(clients=clients, policy=POLICY, dirs=sources, cache_dir=cache_dir,
                         redactor=self.redactor, mirror=mirror)
        # The controller's default build limits; builds are not bounded in number (one user, one run).
        self._service = RenderService(reads=reads, files=files, limits=BuildLimits())

    def client(self, identity: Identity) -> KubeClient:
        assert self._clients is not None
        return self._clients.client(identity)

    def render(self, stageset: StageSet) -> list[RenderedStage]:
        decryption = self._decryption(stageset)
        return [self._render_stage(stageset, stage, decryption) for stage in stageset.spec.stages]

    def render_stage(self, stageset: StageSet, stage: Stage) -> RenderedStage:
        """One stage, as :meth:`render` renders each (the dashboard's object diff)."""
        return self._render_stage(stageset, stage, self._decryption(stageset))

    def _render_stage(self, stageset: StageSet, stage: Stage, decryption: StageDecryption | None
                      ) -> RenderedStage:
        identity = POLICY.for_stage(stageset, stage)
        rendered = RenderedStage(stage=stage, identity=identity, revision="")
        try:
            done = self._service.render(stage=stage, identity=identity,
                                        namespace=str(stageset.metadata["namespace"]), redactor=self.redactor,
                                        decryption=decryption, salt=str(stageset.metadata.get("uid", "")))
        except (StageError, CliError) as error:
            rendered.error = error
            return rendered
        rendered.revision, rendered.objects, rendered.inputs = done.revision, done.objects, done.action_inputs
        return rendered

    def _decryption(self, stageset: StageSet) -> StageDecryption | None:
        """How this StageSet's SOPS keys are read: the local age file, else the controller's way (the
        key Secret as the StageSet's ServiceAccount); ``None`` without ``spec.decryption``."""
        scope = f"{stageset.metadata['namespace']}/{stageset.metadata['name']}"
        if self._age_key_file is not None:
            return KeyFileDecryption(path=self._age_key_file, scope=scope, redactor=self.redactor)
        ref = stageset.spec.decryption.secret_ref if stageset.spec.decryption else None
        if ref is None:
            return None
        if self._clients is None:
            return UnreadKeys(scope=scope, secret=ref.name)
        return PassDecryption(stageset=stageset, policy=POLICY, clients=self._clients,
                              accounts=self._reads.accounts, redactor=self.redactor)


# -- what may be shown ----------------------------------------------------------------------------

def mask_secret(obj: KubeObject, *, before: KubeObject | None = None) -> KubeObject:
    """A Secret with its values masked; against ``before``, a changed value reads ``*** (changed)``."""
    if obj.get("kind") != "Secret" or str(obj.get("apiVersion")) != "v1":
        return obj
    masked = dict(obj)
    for key in ("data", "stringData"):
        values = obj.get(key)
        if not isinstance(values, dict):
            continue
        old = (before or {}).get(key) or {}
        masked[key] = {name: MASK if before is None or old.get(name) == value
                       else (f"{MASK} (changed)" if name in old else f"{MASK} (new)")
                       for name, value in values.items()}
    return masked


def redact_strings(value: Any, redact: Callable[[str], str]) -> Any:
    """Every string in a JSON value through ``redact`` (substituted Secret values, wherever they are)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_strings(item, redact) for item in value]
    if isinstance(value, dict):
        return {key: redact_strings(item, redact) for key, item in value.items()}
    return value
