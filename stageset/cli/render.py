"""Rendering a StageSet's stages on the user's machine, for ``build`` and ``diff``.

Where the files come from:

- ``--source-dir [NAME=]DIR``: a local checkout (the source's root); no Git, and with ``-f``
  no cluster at all;
- otherwise the GitRepository each stage names, at the revision in its status (what the
  controller last fetched), fetched into a mirror under ``~/.cache/stageset/cli-mirrors``;
- or, for a Flux source (or a producer's ExternalArtifact), the artifact its status names,
  downloaded from this machine into ``~/.cache/stageset/cli-artifacts`` and verified exactly as
  the controller verifies it (digest first, bounded unpacking, unsafe entries refused).  An
  artifact URL this machine cannot reach (source-controller serves it inside the cluster) fails
  with a message that says so; ``--source-dir NAME=DIR`` is the way out.

Identity — the controller's rules (:mod:`stageset.controller.identity`), so the output is what
the controller would render and apply:

- the GitRepository and ``substituteFrom`` ConfigMaps/Secrets are read as the **stage's
  ServiceAccount** (impersonated); a StageSet without one is read as the user (what a
  single-tenant controller would do);
- the GitRepository's ``secretRef`` is read as its ``serviceAccountName`` (else the user);
- Git is fetched from the user's machine with those credentials.

Impersonation needs the user's ``impersonate`` right on that ServiceAccount: it is checked
first (a SelfSubjectAccessReview), so a user without it gets one clear message, not an
``RBACDenied`` that blames the tenant.

SOPS-encrypted files (``spec.decryption``) are decrypted as the controller decrypts them, with
the key Secret read as the **StageSet's** ServiceAccount (the controller's rule; impersonated,
else the user), or with a local age identity file (``--sops-age-key-file``, which reads no
Secret); the ``stageset-sops`` helper runs on the user's machine, in memory.

Nothing of a Secret is printed unless asked: Secret ``data``/``stringData`` values are masked,
and so are values substituted from ``substituteFrom`` Secrets and values decrypted from SOPS
files, wherever they landed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import ValidationError

from sources import Credentials, Limits, MirrorStore, RefSelector, SourceError, UrlPolicy
from sources.addresses import AddressGuard
from sources.artifacts import ArtifactStore
from sources.digests import Digest
from sources.download import display
from sources.errors import TransferError
from stageset.api import GitRepository, Stage, StageSet
from stageset.apply.errors import StageError
from stageset.build import BuildError, Prepared, VariableSource, merge_variables, prepare, render
from stageset.build.decrypt import DecryptionKeys, decrypt
from stageset.build.sopsfiles import describe
from stageset.cli.session import CliError, Session
from stageset.controller.gitrepository import credentials_from, secret_values
from stageset.controller.identity import IdentityPolicy
from stageset.controller.manager import GITREPOSITORIES, STAGESETS
from stageset.controller.redact import MASK, Redactor
from stageset.controller.sourcekinds import DefaultSourceKind
from stageset.controller.stageset.actionplan import inputs_digest
from stageset.controller.stageset.reads import ArtifactSource, TenantReads
from stageset.controller.status import validation_message
from stageset.kube.client import ApiError, Identity, KubeClient
from stageset.kube.types import KubeObject

# The CLI acts as the user; with no ServiceAccount named, it reads and dry-runs as the user
# (what a single-tenant controller would do), never as anyone with more rights.
POLICY = IdentityPolicy(cluster_admin=True)
_LOCAL_LIMIT = 256 * 2**20


def read_directory(root: Path, unreadable: dict[str, str] | None = None) -> dict[str, bytes]:
    """A local checkout as the source root: every regular file but ``.git/``; symlinks are not
    followed (recorded in ``unreadable``: a build that loads one fails, as from Git)."""
    if not root.is_dir():
        raise CliError(f"--source-dir {root}: not a directory")
    files: dict[str, bytes] = {}
    total = 0
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != ".git" and not (Path(directory) / d).is_symlink())
        for name in sorted(names):
            full = Path(directory) / name
            if full.is_symlink() and unreadable is not None:
                unreadable[full.relative_to(root).as_posix()] = "a symlink (not followed in a local checkout)"
            if full.is_symlink() or not full.is_file():
                continue
            data = full.read_bytes()
            total += len(data)
            if total > _LOCAL_LIMIT:
                raise CliError(f"--source-dir {root}: more than {_LOCAL_LIMIT // 2**20} MiB of files")
            files[full.relative_to(root).as_posix()] = data
    return files


@dataclass(frozen=True)
class SourceDirs:
    """``--source-dir`` values: ``DIR`` (every source) or ``NAME=DIR`` (the source named NAME)."""

    default: Path | None = None
    named: Mapping[str, Path] = field(default_factory=dict)

    @classmethod
    def parse(cls, values: Iterable[str]) -> SourceDirs:
        default: Path | None = None
        named: dict[str, Path] = {}
        for value in values:
            name, sep, directory = value.partition("=")
            if sep and name and "/" not in name:
                named[name] = Path(directory)
            elif default is None:
                default = Path(value)
            else:
                raise click.BadParameter("give one --source-dir DIR, or NAME=DIR per source",
                                         param_hint="--source-dir")
        return cls(default=default, named=named)

    def __bool__(self) -> bool:
        return self.default is not None or bool(self.named)

    def for_source(self, name: str) -> Path | None:
        return self.named.get(name, self.default)


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
    (:func:`~stageset.controller.stageset.actionplan.inputs_digest`)."""


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


class Renderer:
    """Renders every stage of one StageSet, as :mod:`stageset.controller.stageset.rendering` would."""

    def __init__(self, *, session: Session | None, sources: SourceDirs, mirror_dir: Path,
                 warn: Callable[[str], None],
                 default_source_kind: DefaultSourceKind = DefaultSourceKind.GIT_REPOSITORY,
                 age_key_file: Path | None = None):
        self._session = session
        self._age_key_file = age_key_file
        self._keys: DecryptionKeys | None = None
        self._sources = sources
        self._mirror_dir = mirror_dir
        self._warn = warn
        self._store: MirrorStore | None = None
        self._artifacts: ArtifactStore | None = None
        self._checked: set[Identity] = set()
        self._reads = TenantReads(stagesets=STAGESETS, sources=GITREPOSITORIES, no_cross_namespace_refs=False,
                                  default_source_kind=default_source_kind)
        self.redactor = Redactor()

    def client(self, identity: Identity) -> KubeClient:
        assert self._session is not None
        _impersonation_check(self._session.client(), identity, self._checked)
        return self._session.client(identity)

    def render(self, stageset: StageSet) -> list[RenderedStage]:
        return [self._render_stage(stageset, stage) for stage in stageset.spec.stages]

    def _render_stage(self, stageset: StageSet, stage: Stage) -> RenderedStage:
        namespace = str(stageset.metadata["namespace"])
        identity = POLICY.for_stage(stageset, stage)
        rendered = RenderedStage(stage=stage, identity=identity, revision="")
        try:
            unreadable: dict[str, str] = {}
            root, rendered.revision = self._root(stageset, stage, unreadable)
            variables, secrets = self._variables(stage, namespace, identity)
            rendered.inputs = inputs_digest(stage, variables, secrets)
            prepared = prepare(root, path=stage.path, unreadable=unreadable)
            rendered.objects = render(self._decrypted(stageset, prepared), variables=variables)
        except StageError as error:
            rendered.error = error
        except CliError as error:
            rendered.error = error
        except BuildError as error:
            rendered.error = CliError(f"stage {stage.name!r}: {error}")
        except SourceError as error:
            rendered.error = CliError(f"stage {stage.name!r}: {error}")
        return rendered

    def _decrypted(self, stageset: StageSet, prepared: Prepared) -> Prepared:
        """``prepared`` reading its SOPS files decrypted (their values added to the redactor)."""
        found, withheld = prepared.sops_files()
        if not found:
            return prepared.with_decrypted({}, withheld) if withheld else prepared
        keys = self._decryption_keys(stageset, found)
        opened = decrypt({name: prepared.tree.files[name] for name in found}, found, keys=keys,
                         limits=prepared.limits)
        self.redactor.add(opened.values)
        return prepared.with_decrypted(opened.files, withheld)

    def _decryption_keys(self, stageset: StageSet, found: Mapping[str, str]) -> DecryptionKeys:
        if self._keys is not None:
            return self._keys
        if self._age_key_file is not None:
            self._keys = DecryptionKeys.from_age_file(self._age_key_file)
            return self._keys
        ref = stageset.spec.decryption.secret_ref if stageset.spec.decryption else None
        if ref is None:
            raise CliError(f"{describe(found)}: SOPS-encrypted, and the StageSet has no spec.decryption; "
                           "give --sops-age-key-file to decrypt with a local age key")
        if self._session is None:
            raise CliError(f"{describe(found)}: SOPS-encrypted: a local build reads no cluster, so give "
                           f"--sops-age-key-file (spec.decryption names Secret {ref.name})")
        namespace = str(stageset.metadata["namespace"])
        what = f"spec.decryption.secretRef {namespace}/{ref.name}"
        client = self.client(POLICY.for_stageset(stageset, what=f"reading {what}"))
        try:
            secret = client.get(f"/api/v1/namespaces/{namespace}/secrets/{ref.name}")
        except ApiError as error:
            raise CliError(f"reading {what} as {client.identity.describe()}: {error.message}") from None
        try:
            self._keys = DecryptionKeys.from_secret_data(f"{namespace}/{ref.name}", secret.get("data") or {})
        except BuildError as error:
            raise CliError(str(error)) from None
        return self._keys

    def _root(self, stageset: StageSet, stage: Stage, unreadable: dict[str, str]
              ) -> tuple[dict[str, bytes], str]:
        local = self._sources.for_source(stage.source_ref.name)
        if local is not None:
            return read_directory(local, unreadable), f"local:{local}"
        if self._session is None:
            raise CliError(f"stage {stage.name!r}: no --source-dir for source {stage.source_ref.name!r}")
        namespace = str(stageset.metadata["namespace"])
        client = self.client(POLICY.for_stage(stageset, stage))
        source = self._reads.source(client, stage, namespace)
        if isinstance(source, ArtifactSource):
            return self._artifact_root(stage, source, unreadable), source.revision
        raw = client.get(GITREPOSITORIES.object_path(name=stage.source_ref.name,
                                                     namespace=stage.source_ref.namespace or namespace))
        try:
            repo = GitRepository.model_validate({**raw, "status": None})
        except ValidationError as error:
            raise CliError(f"stage {stage.name!r}: GitRepository {stage.source_ref.name}: "
                           f"{validation_message(error)}") from None
        store = self._mirror()
        # Served only to this GitRepository, once its own credentials proved the commit readable.
        consumer = f"{repo.metadata['namespace']}/{repo.metadata['name']}"
        store.fetch(source.url, ref=RefSelector(commit=source.commit), credentials=self._credentials(repo),
                    timeout=120, consumer=consumer)
        return store.read_tree(source.url, commit=source.commit, path="./", ignore=source.ignore,
                               consumer=consumer, unreadable=unreadable), source.revision

    def _artifact_root(self, stage: Stage, source: ArtifactSource,
                       unreadable: dict[str, str]) -> dict[str, bytes]:
        """The artifact, downloaded from this machine and verified as the controller does."""
        try:
            digest = Digest.parse(source.digest)
            store = self._artifact_store()
            store.fetch(source.url, digest, timeout=120)
            tree = store.read(digest)
        except TransferError as error:
            raise CliError(
                f"stage {stage.name!r}: {source.what}: cannot download its artifact from this machine "
                f"({error}); {display(source.url)} is probably reachable only inside the cluster (Flux's "
                f"source-controller serves it there): build from a checkout with --source-dir "
                f"{stage.source_ref.name}=DIR") from None
        except SourceError as error:
            raise CliError(f"stage {stage.name!r}: {source.what}: {error}") from None
        unreadable.update(tree.unreadable)
        return dict(tree.files)

    def _artifact_store(self) -> ArtifactStore:
        if self._artifacts is None:
            # From the user's machine: any address the user can reach (a port-forward on loopback
            # included); the digest, the bounds and the archive checks are the controller's.
            self._artifacts = ArtifactStore(root=self._mirror_dir.parent / "cli-artifacts",
                                            guard=AddressGuard(allow_insecure=True), max_bytes=2**30)
        return self._artifacts

    def _mirror(self) -> MirrorStore:
        if self._store is None:
            # An artifact in status means the controller's URL policy admitted the URL already;
            # file:// would name the controller's disk, which this machine cannot see.
            self._store = MirrorStore(root=self._mirror_dir, policy=UrlPolicy(allow_http=True),
                                      limits=Limits())
        return self._store

    def _credentials(self, repo: GitRepository) -> Credentials | None:
        if repo.spec.secret_ref is None:
            return None
        namespace = str(repo.metadata["namespace"])
        name = repo.spec.secret_ref.name
        client = self.client(POLICY.for_gitrepository(repo))
        try:
            secret = client.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except ApiError as error:
            raise CliError(f"GitRepository {namespace}/{repo.metadata['name']}: reading secretRef {name} as "
                           f"{client.identity.describe()}: {error.message}") from None
        data: dict[str, str] = secret.get("data") or {}
        self.redactor.add(secret_values(data))
        return credentials_from(data)

    def _variables(self, stage: Stage, namespace: str, identity: Identity
                   ) -> tuple[dict[str, str] | None, list[str]]:
        """The stage's variables, and the values that came from Secrets."""
        if stage.post_build is None:
            return None, []
        if self._session is None:
            if stage.post_build.substitute_from:
                names = ", ".join(f"{r.kind}/{r.name}" for r in stage.post_build.substitute_from)
                self._warn(f"stage {stage.name!r}: substituteFrom ({names}) not read: a local build reads no "
                           "cluster; only postBuild.substitute and ${var:=default} apply")
            sources = [VariableSource(r.kind, r.name, None, True) for r in stage.post_build.substitute_from]
            try:
                return merge_variables(stage.post_build.substitute, sources), []
            except BuildError as error:
                raise CliError(f"stage {stage.name!r}: {error}") from None
        variables, secrets = self._reads.variables(self.client(identity), stage, namespace)
        self.redactor.add(secrets)
        return variables, secrets


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
