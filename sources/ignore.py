"""Which files of a source are left out: Flux's default exclusions, ``.sourceignore`` files and
``spec.ignore``, matched in linear time.

Identity: none — pure functions over pattern text and paths.

The rule is Flux source-controller's (``fluxcd/pkg/sourceignore`` and its archive filter),
so repository clutter never reaches a build and a Flux user's ``.sourceignore`` keeps
working:

1. **Patterns** are collected from every ``.sourceignore`` file in the source (each one
   applies to the directory it is in and below; a parent directory's file comes before its
   children's), then from the GitRepository's ``spec.ignore`` (which applies from the
   root), in that order.
2. With **no** patterns at all, the defaults apply: :data:`VCS_PATTERNS` (``.git/``,
   ``.gitignore``, ``.gitmodules``, ``.gitattributes``) and :data:`DEFAULT_PATTERNS`
   (images and archives ``*.jpg *.jpeg *.gif *.png *.wmv *.flv *.tar.gz *.zip``; CI
   configuration ``.github/ .circleci/ .travis.yml .gitlab-ci.yml appveyor.yml
   .drone.yml cloudbuild.yaml codeship-services.yml codeship-steps.yml``; and
   ``**/.goreleaser.yml **/.sops.yaml **/.flux.yaml``).
3. With **any** patterns, only :data:`VCS_PATTERNS` and those patterns apply: writing
   ``spec.ignore`` or adding a ``.sourceignore`` replaces the defaults (repeat the ones you
   want to keep).  An empty ``spec.ignore`` is no pattern.
4. A path is left out when the **last** pattern that matches it excludes it; a pattern
   starting with ``!`` re-includes (it may re-include a file inside an excluded directory,
   as in Flux, unlike ``git``).

Pattern syntax is ``.gitignore``'s, as Flux reads it: blank lines and lines starting with
``#`` are skipped; trailing spaces are dropped unless escaped (``\\ ``); a trailing ``/``
matches directories only (and so everything in them); a pattern **without** a ``/`` (other
than a trailing one) matches a file or directory of that name at any depth, and everything
under a directory it matches; a pattern **with** a ``/`` is anchored at the directory of
the file that holds it (the root for ``spec.ignore``) and matches that path and everything
under it; ``*`` matches within one path component, ``?`` one character, ``[a-z]``,
``[!a]``/``[^a]`` classes, ``\\`` escapes; ``**`` as a whole component matches any number
of directories.  Differences from Flux (whose go-git matcher is greedy): ``**`` is matched
exactly, so ``**/a/b`` also matches ``a/a/b``; ``**`` inside a component (``a**b``) is
treated as ``*`` (go-git never matches such a pattern); a malformed pattern (an unclosed
``[``) matches nothing, as in Flux.

Why RE2: patterns are tenant input and paths are repository content.  A backtracking
matcher (Python's ``re``, ``fnmatch``, dulwich's ignore filter) takes exponential time on
patterns like ``*a*a*a*a*a*a*a*a*a*a*a*a b`` and holds the interpreter lock while it does —
freezing every other tenant's work.  Each pattern is translated to an RE2 expression and
all of them are matched together with one ``RE2::Set`` pass per path, in time linear in
the path's length.  :data:`MAX_PATTERNS` and :data:`MAX_PATTERN_BYTES` bound the set.

Memory: a compiled ``RE2::Set`` lives outside Python's heap (about 22 KiB for the defaults, so
the store's cache of 256 matchers held 5.6 MiB that no Python-side bound saw).  A source with
no patterns of its own — nearly all of them — gets one matcher shared by the whole process
(:func:`default_matcher`); a :class:`Matcher` never changes once built, so sharing it is safe.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import re2

from sources.errors import LimitExceededError

IGNORE_FILE = ".sourceignore"
VCS_PATTERNS = (".git/", ".gitignore", ".gitmodules", ".gitattributes")
DEFAULT_PATTERNS = (
    "*.jpg", "*.jpeg", "*.gif", "*.png", "*.wmv", "*.flv", "*.tar.gz", "*.zip",
    ".github/", ".circleci/", ".travis.yml", ".gitlab-ci.yml", "appveyor.yml", ".drone.yml",
    "cloudbuild.yaml", "codeship-services.yml", "codeship-steps.yml",
    "**/.goreleaser.yml", "**/.sops.yaml", "**/.flux.yaml",
)
MAX_PATTERNS = 10_000
"""Patterns in one source (``.sourceignore`` files and ``spec.ignore`` together)."""
MAX_PATTERN_BYTES = 1024 * 1024
"""Bytes of ``.sourceignore`` files and ``spec.ignore`` together."""

_DIRS = "(?:[^/]*/)*"
"""Zero or more whole directories."""

Parts = tuple[str, ...]


@dataclass(frozen=True)
class Pattern:
    """One parsed pattern: where it applies, whether it excludes, and its RE2 expression
    over the path relative to the root (a directory's path ends with ``/``); ``regex`` is
    None for a malformed pattern, which matches nothing."""

    text: str
    domain: Parts
    exclude: bool
    regex: str | None


# Complexity above the limit (15) on purpose: one scanner over a bracket expression; each branch is one piece
# of glob class syntax.
def _class(glob: str, start: int) -> tuple[str, int] | None:  # noqa: C901
    """The RE2 class for the ``[...]`` at ``start``; (expression, index after it) or None."""
    i = start + 1
    negate = i < len(glob) and glob[i] in "!^"
    if negate:
        i += 1
    items: list[tuple[str, str]] = []
    while True:
        if i >= len(glob):
            return None
        char = glob[i]
        if char == "]" and items:
            i += 1
            break
        if char == "\\":
            i += 1
            if i >= len(glob):
                return None
            char = glob[i]
        low = char
        i += 1
        high = low
        if i + 1 < len(glob) and glob[i] == "-" and glob[i + 1] != "]":
            i += 1
            high = glob[i]
            if high == "\\":
                i += 1
                if i >= len(glob):
                    return None
                high = glob[i]
            i += 1
            if high < low:
                return None
        items.append((low, high))
    ranges: list[str] = []
    for low, high in items:
        # A class never matches '/': split any range around it.
        for lo, hi in ((low, min(high, ".")), (max(low, "0"), high)) if low <= "/" <= high else (
                (low, high),):
            if lo <= hi:
                ranges.append(_class_char(lo) if lo == hi else
                              f"{_class_char(lo)}-{_class_char(hi)}")
    if negate:
        return "[^/" + "".join(ranges) + "]", i
    if not ranges:
        return "[^\\x00-\\x{10FFFF}]", i  # matches nothing
    return "[" + "".join(ranges) + "]", i


def _class_char(char: str) -> str:
    return f"\\x{{{ord(char):x}}}"


def _component(glob: str) -> str | None:
    """RE2 for one path component matched by ``glob`` (no ``/`` in it); None if malformed."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if char == "*":
            while i < len(glob) and glob[i] == "*":
                i += 1
            out.append("[^/]*")
            continue
        if char == "?":
            out.append("[^/]")
        elif char == "[":
            parsed = _class(glob, i)
            if parsed is None:
                return None
            expression, i = parsed
            out.append(expression)
            continue
        elif char == "\\":
            i += 1
            if i >= len(glob):
                return None
            out.append(re2.escape(glob[i]))
        else:
            out.append(re2.escape(char))
        i += 1
    return "".join(out)


def parse_pattern(line: str, domain: Parts = ()) -> Pattern | None:
    """One line of a ``.sourceignore`` file or ``spec.ignore``; None for blanks and comments."""
    if line.startswith("#") or not line.strip():
        return None
    text = line
    exclude = True
    if line.startswith("!"):
        exclude = False
        line = line[1:]
    if not line.endswith("\\ "):
        line = line.rstrip(" ")
    dir_only = line.endswith("/")
    if dir_only:
        line = line[:-1]
    prefix = "^" + "".join(re2.escape(part) + "/" for part in domain)
    end = "/" if dir_only else "(?:/|$)"
    if "/" not in line:
        component = _component(line)
        regex = None if component is None or not line else prefix + _DIRS + component + end
        return Pattern(text=text, domain=domain, exclude=exclude, regex=regex)
    parts = [part for part in line.split("/") if part]
    while parts and parts[-1] == "**":
        parts.pop()  # "dir/**" matches what "dir" matches below it
    body: list[str] = []
    pending_dirs = False
    for part in parts:
        if part == "**":
            pending_dirs = True
            continue
        component = _component(part)
        if component is None:
            return Pattern(text=text, domain=domain, exclude=exclude, regex=None)
        body.append((_DIRS if pending_dirs else "") + component)
        pending_dirs = False
    if not body:
        return Pattern(text=text, domain=domain, exclude=exclude, regex=None)
    return Pattern(text=text, domain=domain, exclude=exclude,
                   regex=prefix + "/".join(body) + end)


def read_patterns(text: str, domain: Parts = ()) -> list[Pattern]:
    """Every pattern in ``text`` (a ``.sourceignore`` file or ``spec.ignore``)."""
    patterns = []
    for line in text.splitlines():
        pattern = parse_pattern(line, domain)
        if pattern is not None:
            patterns.append(pattern)
    return patterns


class Matcher:
    """Decides for each path whether it is left out; linear time per path (RE2)."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self._patterns = [p for p in patterns if p.regex is not None]
        if len(self._patterns) > MAX_PATTERNS:
            raise LimitExceededError(
                f"more than {MAX_PATTERNS} ignore patterns (.sourceignore files and spec.ignore)"
            )
        self.has_inclusions = any(not p.exclude for p in self._patterns)
        self.size = len(self._patterns)
        """Patterns compiled: what a cache of matchers bounds (the RE2 program lives outside
        Python's heap, about 1 to 3.5 KiB a pattern)."""
        self._set: re2.Set | None = None
        if self._patterns:
            options = re2.Options()
            options.max_mem = 64 * 1024 * 1024
            self._set = re2.Set.SearchSet(options)
            for pattern in self._patterns:
                self._set.Add(pattern.regex)
            try:
                self._set.Compile()
            except re2.error:
                raise LimitExceededError("the ignore patterns are too complex to match "
                                         "(RE2 memory budget)") from None

    def excluded(self, path: str, *, is_dir: bool) -> bool:
        """Whether the file (or directory) at ``path`` (relative to the root) is left out."""
        if self._set is None:
            return False
        matches = self._set.Match(path + "/" if is_dir else path)
        if not matches:
            return False
        return bool(self._patterns[max(matches)].exclude)

    def prunes(self, path: str) -> bool:
        """Whether the directory ``path`` and everything under it are left out."""
        return not self.has_inclusions and self.excluded(path, is_dir=True)


def source_matcher(*, spec_ignore: str | None,
                   sourceignore_files: Iterable[tuple[Parts, str]]) -> Matcher:
    """The matcher for a source: Flux's rule, in the module docstring.

    ``sourceignore_files`` are ``(directory, text)`` pairs, parents before children.
    """
    patterns: list[Pattern] = []
    total = 0
    for directory, text in sourceignore_files:
        total += len(text.encode())
        patterns += read_patterns(text, directory)
    if spec_ignore:
        total += len(spec_ignore.encode())
        patterns += read_patterns(spec_ignore)
    if total > MAX_PATTERN_BYTES:
        raise LimitExceededError(
            f"ignore patterns (.sourceignore files and spec.ignore) add up to more than "
            f"{MAX_PATTERN_BYTES} bytes"
        )
    if not patterns:
        return default_matcher()
    vcs = [p for line in VCS_PATTERNS if (p := parse_pattern(line)) is not None]
    return Matcher([*vcs, *patterns])


@functools.cache
def default_matcher() -> Matcher:
    """The matcher of every source without patterns: :data:`VCS_PATTERNS` and
    :data:`DEFAULT_PATTERNS`, compiled once per process and shared (read-only)."""
    lines = (*VCS_PATTERNS, *DEFAULT_PATTERNS)
    return Matcher([p for line in lines if (p := parse_pattern(line)) is not None])
