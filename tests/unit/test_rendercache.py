"""The render cache: keys, bounds, and that a stage is built again exactly when what it reads changes.

Kustomize layouts (a shared base used by some stages) are covered with the real builder in
tests/build/test_layouts.py; here plain paths keep the tests free of binaries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson
import pytest

from stageset.build import BuildError, BuildLimits
from stageset.controller.render.cache import RenderCache, SourceRoot, render_key, render_stage, source_key

URL = "https://git.example/x.git"
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\ndata: {v: '%s'}\n"


def key(tree: str = "t1", variables: dict[str, str] | None = None, ignore: str | None = None) -> str:
    return render_key(url=URL, tree=tree, ignore=ignore, variables=variables)


def test_key_changes_with_every_input_and_hides_values() -> None:
    base = key()
    assert key() == base
    assert key(tree="t2") != base
    assert key(ignore="*.md") != base
    assert key(variables={}) != base  # a postBuild with no variables is not "no postBuild"
    assert key(variables={"a": "1"}) != key(variables={"a": "2"})
    secret = key(variables={"token": "hunter2-secret"})
    assert "hunter2" not in secret
    assert len(secret) == 64  # a digest, not the values
    secret_vars = {"token": "hunter2-secret"}
    src = source_key(url=URL, commit="c1", ignore=None, path="./a", variables=secret_vars)
    assert "hunter2" not in src
    assert src != source_key(url=URL, commit="c1", ignore=None, path="./b", variables=secret_vars)


def test_least_recently_used_entries_go_first() -> None:
    cache = RenderCache(max_entries=2)
    cache.put("a", [{"kind": "A"}])
    cache.put("b", [{"kind": "B"}])
    assert cache.get("a") == [{"kind": "A"}]
    cache.put("c", [{"kind": "C"}])
    assert cache.get("b") is None
    assert cache.get("a") is not None
    assert cache.get("c") is not None
    assert (cache.hits, cache.misses) == (3, 1)


def test_rendered_objects_are_bounded_in_bytes_and_a_render_larger_than_the_bound_is_not_kept() -> None:
    def objects(count: int) -> list[dict[str, object]]:
        return [{"kind": "ConfigMap", "data": {"v": "x" * 100}} for _ in range(count)]

    one = len(orjson.dumps(objects(10))) * 7  # the estimate of ten objects
    cache = RenderCache(max_render_bytes=3 * one)
    cache.put("a", objects(10))
    cache.put("b", objects(10))
    cache.put("c", objects(10))
    assert cache.render_bytes == 3 * one
    cache.put("d", objects(10))  # a fourth pushes out the least recently used
    assert cache.get("a") is None
    assert [cache.get(k) is not None for k in "bcd"] == [True, True, True]
    assert cache.render_bytes == 3 * one
    cache.put("huge", objects(40))  # larger than the whole bound: served by the caller, not kept
    assert cache.get("huge") is None
    assert [cache.get(k) is not None for k in "bcd"] == [True, True, True]
    cache.put("b", objects(20))  # replaced: counted once, at its new size (c made room)
    assert cache.get("c") is None
    assert cache.get("d") is not None
    assert cache.render_bytes == len(orjson.dumps(objects(20))) * 7 + one


class Repo:
    """Commits of a repository, and a count of whole-tree reads."""

    def __init__(self) -> None:
        self.commits: dict[str, dict[str, bytes]] = {}
        self.reads = 0

    def commit(self, name: str, files: Mapping[str, str]) -> str:
        self.commits[name] = {path: content.encode() for path, content in files.items()}
        return name

    def reader(self, commit: str) -> Callable[[], SourceRoot]:
        def read() -> SourceRoot:
            self.reads += 1
            return SourceRoot(files=self.commits[commit])
        return read


def render(cache: RenderCache, repo: Repo, commit: str, path: str,
           variables: dict[str, str] | None = None) -> list[str]:
    objects = render_stage(cache, url=URL, commit=commit, ignore=None, path=path, variables=variables,
                           read_tree=repo.reader(commit), limits=BuildLimits())
    return [f"{o['metadata']['name']}={o['data']['v']}" for o in objects]


FILES = {"team-a/app.yaml": CM % ("a", "1"), "team-b/app.yaml": CM % ("b", "1"), "README.md": "# repo"}


def test_a_known_commit_is_neither_read_nor_built_again() -> None:
    cache, repo = RenderCache(), Repo()
    c1 = repo.commit("c1", FILES)
    assert render(cache, repo, c1, "./team-a") == ["a=1"]
    assert render(cache, repo, c1, "./team-a") == ["a=1"]
    assert (repo.reads, cache.builds) == (1, 1)


def test_stages_of_one_commit_share_one_read_and_a_change_elsewhere_builds_nothing() -> None:
    cache, repo = RenderCache(), Repo()
    c1 = repo.commit("c1", FILES)
    render(cache, repo, c1, "./team-a")
    render(cache, repo, c1, "./team-b")
    assert (repo.reads, cache.builds) == (1, 2)
    c2 = repo.commit("c2", {**FILES, "team-b/app.yaml": CM % ("b", "2"), "README.md": "# changed"})
    assert render(cache, repo, c2, "./team-a") == ["a=1"]
    assert render(cache, repo, c2, "./team-b") == ["b=2"]
    assert (repo.reads, cache.builds) == (2, 3)  # team-a read again, but not built again


def test_variables_are_part_of_what_a_stage_renders_from() -> None:
    cache, repo = RenderCache(), Repo()
    c1 = repo.commit("c1", {"a/app.yaml": CM % ("a", "${v}")})
    assert render(cache, repo, c1, "a", {"v": "x"}) == ["a=x"]
    assert render(cache, repo, c1, "a", {"v": "y"}) == ["a=y"]
    assert render(cache, repo, c1, "a", {"v": "x"}) == ["a=x"]
    assert cache.builds == 2


def test_a_failed_build_is_not_cached_and_reports_each_time() -> None:
    cache, repo = RenderCache(), Repo()
    c1 = repo.commit("c1", {"a/app.yaml": "kind: [unclosed"})
    for _ in range(2):
        with pytest.raises(BuildError, match=r"a/app\.yaml: not valid YAML"):
            render(cache, repo, c1, "a")
    assert repo.reads == 1  # the tree itself is still shared


def test_the_tree_cache_is_bounded_in_bytes() -> None:
    # Each file counts its path, its content and a fixed overhead (about 270 bytes for the
    # small tree here); the big tree's 200-byte blob pushes it past 500.
    cache, repo = RenderCache(max_tree_bytes=500), Repo()
    small = repo.commit("small", {"a/app.yaml": CM % ("a", "1")})
    big = repo.commit("big", {"a/app.yaml": CM % ("a", "1"), "blob.bin": "x" * 200})
    render(cache, repo, small, "a")
    render(cache, repo, small, "./a/")
    assert repo.reads == 1
    render(cache, repo, big, "a")
    render(cache, repo, big, "./a/")
    assert repo.reads == 3  # too big to keep: read per stage


def test_builds_run_at_most_max_builds_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod's memory limit is sized for one kustomize build per worker (docs/sizing.md), while
    each worker runs the independent stages of a StageSet concurrently: the cache holds builds to
    ``max_builds``, however many stages ask at once."""
    import threading

    import stageset.controller.render.cache as rendercache

    real = rendercache.render
    changed = threading.Condition()
    running, peak, target, finished = 0, 0, 0, 0

    def counting(*args: object, **kwargs: object) -> object:
        # The first builds wait (boundedly) until `target` run together, so the peak is reached
        # whatever the scheduling; a bound that let more through would show above it.
        nonlocal running, peak, finished
        with changed:
            running += 1
            peak = max(peak, running)
            changed.notify_all()
            changed.wait_for(lambda: running >= target or finished > 0, timeout=10)
        try:
            return real(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            with changed:
                running -= 1
                finished += 1
                changed.notify_all()

    monkeypatch.setattr(rendercache, "render", counting)
    repo = Repo()
    commit = repo.commit("c1", {f"s{i}/cm.yaml": CM % (f"s{i}", i) for i in range(8)})
    for bound, expected in ((2, 2), (None, 8)):
        cache, peak, target, finished = RenderCache(max_builds=bound), 0, expected, 0
        threads = [threading.Thread(target=render, args=(cache, repo, commit, f"./s{i}")) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert cache.builds == 8
        assert peak == expected, (bound, peak)


def path_reader(repo: Repo, commit: str, path: str, reads: list[str]) -> Callable[[], SourceRoot]:
    """The files under ``path`` only, keys relative to it (as ``MirrorStore.read_tree(path=...)``)."""
    prefix = path.strip("./") + "/"

    def read() -> SourceRoot:
        reads.append(path)
        return SourceRoot(files={p[len(prefix):]: c for p, c in repo.commits[commit].items()
                                 if p.startswith(prefix)})
    return read


@pytest.mark.parametrize(("files", "whole_root"), [
    ({"team-a/app.yaml": CM % ("a", "1"), "team-b/app.yaml": CM % ("b", "1")}, False),
    # A kustomization under the path may load anything of the root: the root is read.
    ({"team-a/app.yaml": CM % ("a", "1"), "team-a/kustomization.yaml": "resources: [app.yaml]\n"}, True),
])
def test_a_plain_path_reads_only_its_own_directory(files: dict[str, str], whole_root: bool) -> None:
    cache, repo, reads = RenderCache(), Repo(), []
    c1 = repo.commit("c1", files)
    objects = render_stage(cache, url=URL, commit=c1, ignore=None, path="./team-a", variables=None,
                           read_tree=repo.reader(c1), limits=BuildLimits(),
                           read_path=path_reader(repo, c1, "./team-a", reads))
    assert [o["metadata"]["name"] for o in objects] == ["a"]
    assert reads == ["./team-a"]
    assert repo.reads == (1 if whole_root else 0)
    # The same build either way: the render key is the whole root's.
    whole = RenderCache()
    render_stage(whole, url=URL, commit=c1, ignore=None, path="./team-a", variables=None,
                 read_tree=repo.reader(c1), limits=BuildLimits())
    assert whole.get(next(iter(whole._sources.values()))) == objects
