"""Stages rendered from a real Git server through the shared mirror, as the controller reads them.

The build reads the whole source root (``MirrorStore.read_tree(url, commit=..., path="./")``);
what a symlink may point to is the source's rule (inside the repository only), what a
kustomization may load is the build's (inside the same tree).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from sources import Limits, MirrorStore, RefSelector, UrlPolicy
from stageset.build import BuildError, BuildLimits
from stageset.controller.render.cache import RenderCache, SourceRoot, render_stage
from tests.gitserver import FileValue, GitServer, Submodule, Symlink

CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\ndata: {v: '%s'}\n"


@pytest.fixture
def git_server() -> Iterator[GitServer]:
    with GitServer() as server:
        yield server


@pytest.fixture
def store(tmp_path: Path) -> MirrorStore:
    return MirrorStore(root=tmp_path / "mirrors", policy=UrlPolicy(allow_http=True), limits=Limits())


class Source:
    def __init__(self, server: GitServer, store: MirrorStore, files: Mapping[str, FileValue]):
        self.server, self.store = server, store
        self.url = server.create_repo("app", files)
        self.cache = RenderCache()
        self.commit = self.fetch()

    def fetch(self) -> str:
        self.commit = self.store.fetch(self.url, ref=RefSelector(branch="main")).commit
        return self.commit

    def change(self, files: Mapping[str, FileValue | None]) -> None:
        self.server.commit("app", files)
        self.fetch()

    def root(self) -> SourceRoot:
        unreadable: dict[str, str] = {}
        files = self.store.read_tree(self.url, commit=self.commit, path="./", unreadable=unreadable)
        return SourceRoot(files=files, unreadable=unreadable)

    def render(self, path: str, builder: Path) -> list[str]:
        objects = render_stage(
            self.cache, url=self.url, commit=self.commit, ignore=None, path=path, variables=None,
            read_tree=self.root, limits=BuildLimits(), kustomize=builder)
        return [f"{o['metadata']['name']}={o['data']['v']}" for o in objects]


def test_an_overlay_loads_a_base_above_its_path_from_the_mirror(
        git_server: GitServer, store: MirrorStore, builder_binary: Path) -> None:
    source = Source(git_server, store, {
        "deploy/bases/backend/kustomization.yaml": "resources: [cm.yaml]\n",
        "deploy/bases/backend/cm.yaml": CM % ("backend", "1"),
        "deploy/overlays/prod/kustomization.yaml": "resources: [../../bases/backend]\nnameSuffix: -prod\n",
    })
    assert source.render("./deploy/overlays/prod", builder_binary) == ["backend-prod=1"]


def test_a_symlinked_base_is_rebuilt_when_its_target_changes(
        git_server: GitServer, store: MirrorStore, builder_binary: Path) -> None:
    """A symlink does not change when its target does; the key hashes what was read."""
    source = Source(git_server, store, {
        "shared/base/kustomization.yaml": "resources: [cm.yaml]\n",
        "shared/base/cm.yaml": CM % ("app", "1"),
        "apps/prod/kustomization.yaml": "resources: [base]\n",
        "apps/prod/base": Symlink("../../shared/base"),
    })
    assert source.render("apps/prod", builder_binary) == ["app=1"]
    source.change({"shared/base/cm.yaml": CM % ("app", "2")})
    assert source.render("apps/prod", builder_binary) == ["app=2"]
    assert source.cache.builds == 2


@pytest.mark.parametrize(("link", "message"), [
    ("/var/run/secrets/kubernetes.io/serviceaccount", r"symlink 'apps/prod/token' -> .* is absolute"),
    ("../../../../etc", r"symlink 'apps/prod/token' -> .* leaves the repository"),
])
def test_a_symlink_leaving_the_root_fails_the_stage_naming_it(
        git_server: GitServer, store: MirrorStore, builder_binary: Path, link: str, message: str) -> None:
    source = Source(git_server, store, {
        "apps/prod/kustomization.yaml": "resources: [cm.yaml, token]\n",
        "apps/prod/cm.yaml": CM % ("app", "1"),
        "apps/prod/token": Symlink(link),
    })
    with pytest.raises(BuildError, match=r"apps/prod/kustomization\.yaml: resources: 'token' cannot be read: "
                       + message):
        source.render("apps/prod", builder_binary)


def test_a_submodule_or_stray_link_elsewhere_fails_only_the_builds_that_load_it(
        git_server: GitServer, store: MirrorStore, builder_binary: Path) -> None:
    # A monorepo with a submodule and a link out of the repository in one team's corner.
    source = Source(git_server, store, {
        "apps/prod/kustomization.yaml": "resources: [cm.yaml]\n",
        "apps/prod/cm.yaml": CM % ("app", "1"),
        "legacy/vendor": Submodule(),
        "legacy/plain/cm.yaml": CM % ("legacy", "1"),
        "legacy/plain/hosts": Symlink("/etc/hosts"),
        "uses-legacy/kustomization.yaml": "resources: [../legacy/vendor]\n",
    })
    assert source.render("apps/prod", builder_binary) == ["app=1"]
    with pytest.raises(BuildError,
                       match=r"path 'legacy/plain': symlink 'legacy/plain/hosts' -> .* is absolute"):
        source.render("legacy/plain", builder_binary)
    with pytest.raises(BuildError,
                       match=r"resources: '\.\./legacy/vendor' cannot be read: .* is a submodule"):
        source.render("uses-legacy", builder_binary)


def test_a_reference_to_a_file_the_commit_does_not_hold_is_not_found_in_artifact(
        git_server: GitServer, store: MirrorStore, builder_binary: Path) -> None:
    source = Source(git_server, store, {"apps/prod/kustomization.yaml": "resources: [../base]\n",
                                        "apps/prod/README.md": "x"})
    with pytest.raises(BuildError, match=r"^apps/prod/kustomization\.yaml: resources: '\.\./base' "
                                         r"not found in artifact \(looked for 'apps/base'\)$"):
        source.render("apps/prod", builder_binary)
