"""Where ``stageset build`` and ``diff`` take a stage's files from, on the user's machine.

The CLI's :class:`~stageset.controller.render.files.SourceFiles` (the render service
reads the source object and variables, builds, decrypts and substitutes exactly as the
controller does; only the files come from elsewhere):

- ``--source-dir [NAME=]DIR``: a local checkout stands in for the source (a
  :class:`~stageset.controller.render.files.Checkout`: the source object is not read;
  with ``-f``, no cluster at all);
- a GitRepository: the commit in its status (what the controller last fetched), fetched into a
  mirror under ``~/.cache/stageset/cli-mirrors`` as the **controller's consumer** — the
  GitRepository by uid (:attr:`Source.consumer <stageset.controller.render.reads.Source.consumer>`)
  — and read back only as that consumer;
- a Flux source (or a producer's ExternalArtifact): the artifact its status names, downloaded
  from this machine into ``~/.cache/stageset/cli-artifacts`` and verified exactly as the
  controller verifies it (digest first, bounded unpacking, unsafe entries refused).  A URL this
  machine cannot reach (source-controller serves it inside the cluster) fails with a message
  that says so; ``--source-dir NAME=DIR`` is the way out.

Identity: the GitRepository's ``secretRef`` is read as its ``serviceAccountName`` (impersonated;
else the user), through the CLI's clients, which first check that the user may impersonate; Git
and artifact URLs are fetched from the user's machine with those credentials.  Values of that
Secret go to the redactor before anything can show them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import click
from pydantic import ValidationError

from sources import Credentials, Limits, MirrorStore, RefSelector, Snapshot, SourceError, UrlPolicy
from sources.addresses import AddressGuard
from sources.artifacts import ArtifactStore
from sources.digests import Digest
from sources.download import display
from sources.errors import TransferError
from stageset.api import GitRepository, Stage
from stageset.cli.session import CliError
from stageset.controller.gitrepository import credentials_from, secret_values
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import GITREPOSITORIES
from stageset.controller.redact import Redactor
from stageset.controller.render.cache import SourceRoot
from stageset.controller.render.files import ARTIFACT_URL, Checkout, Files, mirror_files
from stageset.controller.render.reads import ArtifactSource, Clients, Source
from stageset.controller.status import validation_message
from stageset.kube.client import ApiError, Identity

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


class GitMirror(Protocol):
    """What the CLI needs of a Git mirror (:class:`sources.MirrorStore`)."""

    def fetch(self, url: str, *, ref: RefSelector | None = None, credentials: Credentials | None = None,
              timeout: float = 60.0, consumer: str | None = None) -> Snapshot: ...

    def read_tree(self, url: str, *, commit: str, path: str = "./", ignore: str | None = None,
                  consumer: str | None = None, unreadable: dict[str, str] | None = None
                  ) -> dict[str, bytes]: ...


class CliFiles:
    """The CLI's files: local checkouts, its own Git mirror, downloaded artifacts (see the module)."""

    def __init__(self, *, clients: Clients | None, policy: IdentityPolicy, dirs: SourceDirs, cache_dir: Path,
                 redactor: Redactor, mirror: GitMirror | None = None):
        self._clients = clients
        self._policy = policy
        self._dirs = dirs
        self._cache_dir = cache_dir
        self._redactor = redactor
        self._mirror = mirror
        self._artifacts: ArtifactStore | None = None

    def checkout(self, stage: Stage) -> Checkout | None:
        local = self._dirs.for_source(stage.source_ref.name)
        if local is None:
            return None

        def read_root() -> SourceRoot:
            unreadable: dict[str, str] = {}
            return SourceRoot(files=read_directory(local, unreadable), unreadable=unreadable)

        # Keyed by the directory only: one run reads each checkout once, whatever stages use it.
        return Checkout(revision=f"local:{local}", files=Files(url=f"local:{local}", commit="",
                                                               read_root=read_root))

    def git(self, source: Source, *, stage: Stage, identity: Identity, pinned: bool) -> Files:
        del pinned  # the CLI renders the current revision only
        url, commit, ignore, consumer = source.url, source.commit, source.ignore, source.consumer
        mirror = self.mirror()
        try:
            credentials = self._credentials(source, stage, identity)
            mirror.fetch(url, ref=RefSelector(commit=commit), credentials=credentials, timeout=120,
                         consumer=consumer)
        except SourceError as error:
            raise CliError(f"stage {stage.name!r}: {error}") from None

        return mirror_files(mirror, url=url, commit=commit, ignore=ignore, consumer=consumer,
                            stage_path=stage.path)

    def artifact(self, source: ArtifactSource, *, stage: Stage, namespace: str) -> Files:
        """The artifact, downloaded from this machine and verified as the controller does."""
        del namespace  # the CLI's store is the user's own
        try:
            digest = Digest.parse(source.digest)
            store = self._artifact_store()
            store.fetch(source.url, digest, timeout=120)
            tree = store.read(digest, url=source.url)
        except TransferError as error:
            raise CliError(
                f"stage {stage.name!r}: {source.what}: cannot download its artifact from this machine "
                f"({error}); {display(source.url)} is probably reachable only inside the cluster (Flux's "
                f"source-controller serves it there): build from a checkout with --source-dir "
                f"{stage.source_ref.name}=DIR") from None
        except SourceError as error:
            raise CliError(f"stage {stage.name!r}: {source.what}: {error}") from None
        root = SourceRoot(files=tree, unreadable=dict(tree.unreadable), on_disk=True)  # read a file at a time
        return Files(url=ARTIFACT_URL, commit=source.digest, read_root=lambda: root)

    def mirror(self) -> GitMirror:
        if self._mirror is None:
            # An artifact in status means the controller's URL policy admitted the URL already;
            # file:// would name the controller's disk, which this machine cannot see.
            self._mirror = MirrorStore(root=self._cache_dir / "cli-mirrors",
                                       policy=UrlPolicy(allow_http=True), limits=Limits())
        return self._mirror

    def _artifact_store(self) -> ArtifactStore:
        if self._artifacts is None:
            # From the user's machine: any address the user can reach (a port-forward on loopback
            # included); the digest, the bounds and the archive checks are the controller's.
            self._artifacts = ArtifactStore(root=self._cache_dir / "cli-artifacts",
                                            guard=AddressGuard(allow_insecure=True), max_bytes=2**30)
        return self._artifacts

    def _credentials(self, source: Source, stage: Stage, identity: Identity) -> Credentials | None:
        """The GitRepository's ``secretRef``, read as its ``serviceAccountName`` (else the user)."""
        if self._clients is None:
            return None
        namespace, _, name = source.name.partition("/")
        raw = self._clients.client(identity).get(GITREPOSITORIES.object_path(name=name, namespace=namespace))
        try:
            repo = GitRepository.model_validate({**raw, "status": None})
        except ValidationError as error:
            raise CliError(f"stage {stage.name!r}: GitRepository {name}: "
                           f"{validation_message(error)}") from None
        if repo.spec.secret_ref is None:
            return None
        secret = repo.spec.secret_ref.name
        client = self._clients.client(self._policy.for_gitrepository(repo))
        try:
            found = client.get(f"/api/v1/namespaces/{namespace}/secrets/{secret}")
        except ApiError as error:
            raise CliError(f"GitRepository {namespace}/{name}: reading secretRef {secret} as "
                           f"{client.identity.describe()}: {error.message}") from None
        data: dict[str, str] = found.get("data") or {}
        self._redactor.add(secret_values(data))
        return credentials_from(data)
