"""The store's cache of compiled ignore rules (sources.tree.IgnoreCache): bounded by the
patterns it holds compiled, not only by entries — a compiled RE2 set lives outside Python's
heap, so a tenant's large pattern file pushed in many commits must not pile up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sources.ignore import VCS_PATTERNS, default_matcher
from sources.tree import IgnoreCache, Limits, _Budget


@dataclass
class _Tree:
    """Stands in for a CommitTree: a root id and its .sourceignore files."""

    root: bytes
    sourceignore: str | None = None

    def sourceignore_files(self, _budget: Any) -> list[tuple[tuple[str, ...], str]]:
        return [((), self.sourceignore)] if self.sourceignore else []


def _patterns(count: int, tag: str) -> str:
    return "\n".join(f"{tag}{i}/*.yaml" for i in range(count)) + "\n"


def _get(cache: IgnoreCache, tree: _Tree, ignore: str | None = None) -> Any:
    return cache.matcher(tree, ignore=ignore, budget=_Budget(Limits()))  # type: ignore[arg-type]


def test_compiled_patterns_stay_within_the_bound_however_many_commits_arrive() -> None:
    cache = IgnoreCache(size=256, max_patterns=250)
    trees = [_Tree(root=bytes([i]) * 20, sourceignore=_patterns(100, "c")) for i in range(10)]
    kept = [_get(cache, tree) for tree in trees]
    assert all(m.size == 100 + len(VCS_PATTERNS) for m in kept)
    assert cache.held_patterns <= 250
    assert len(cache) == 2  # 104 + 104 fit, a third would not
    # The newest are kept: asking again for the last commit compiles nothing new.
    assert _get(cache, trees[-1]) is kept[-1]
    assert _get(cache, trees[0]) is not kept[0]


def test_one_entry_larger_than_the_bound_is_still_kept() -> None:
    cache = IgnoreCache(size=256, max_patterns=10)
    tree = _Tree(root=b"a" * 20, sourceignore=_patterns(50, "x"))
    first = _get(cache, tree)
    assert _get(cache, tree) is first
    assert len(cache) == 1


def test_sources_without_patterns_cost_nothing_and_share_one_matcher() -> None:
    cache = IgnoreCache(size=256, max_patterns=10)
    matchers = {id(_get(cache, _Tree(root=bytes([i]) * 20))) for i in range(100)}
    assert matchers == {id(default_matcher())}
    assert cache.held_patterns == 0
    assert len(cache) == 100
