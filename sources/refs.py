"""Which commit a GitRepository's ``ref`` selects, decided from a remote's ref listing.

Why separate from fetching: resolution is pure — a listing in, a decision out — so every
rule below is unit-tested without a server, and the mirror only fetches what was decided.

Precedence follows Flux when several fields are set: ``commit`` > ``name`` > ``semver`` >
``tag`` > ``branch``.  A ``commit`` together with a ``branch`` (or ``tag``/``name``) pins
the commit but still requires that ref to exist and reports its name in the revision, as
Flux does (``main@sha1:<commit>``); the commit itself is fetched and checked to exist, not
checked to be reachable from the ref.

When nothing is set we follow the remote's ``HEAD``: the branch it points to (a symref) is
used and named in the revision.  That is where ``git clone`` would land, and it is right
for repositories whose default branch is ``main`` as well as for old ``master`` ones.  A
remote whose HEAD is detached gives revision ``HEAD@sha1:<commit>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from dulwich.refs import Ref, check_ref_format

from sources.errors import InvalidRefError, RefNotFoundError
from sources.semver import Constraint, highest_match

PEELED_SUFFIX = "^{}"
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def valid_ref_name(name: str) -> bool:
    """Whether ``name`` is a well-formed full ref name (``git check-ref-format``)."""
    return check_ref_format(Ref(name.encode()))


@dataclass(frozen=True)
class RefSelector:
    """What to check out: Flux's ``spec.ref`` (all fields optional)."""

    branch: str | None = None
    tag: str | None = None
    semver: str | None = None
    name: str | None = None
    commit: str | None = None

    def __post_init__(self) -> None:
        if self.commit is not None and not _COMMIT.fullmatch(self.commit):
            raise InvalidRefError(
                f"ref.commit must be a full 40 (or 64) character lowercase hex commit id, "
                f"got {self.commit!r}"
            )
        if self.semver is not None:
            try:
                Constraint.parse(self.semver)
            except ValueError as error:
                raise InvalidRefError(f"ref.semver: {error}") from None
        if self.name is not None and self.name != "HEAD" and not (
            self.name.startswith("refs/") and valid_ref_name(self.name)
            and not any(part.startswith("-") for part in self.name.split("/"))
        ):
            raise InvalidRefError(f"ref.name must be a full ref name like refs/pull/7/head, "
                                  f"got {self.name!r}")
        for field_name, namespace in (("branch", "refs/heads/"), ("tag", "refs/tags/")):
            value = getattr(self, field_name)
            # A leading '-' is refused as git refuses it for branch names: defence in depth
            # against option injection (no ref ever reaches a command line here).
            if value is not None and (
                value.startswith(("refs/", "-")) or not valid_ref_name(namespace + value)
            ):
                raise InvalidRefError(f"ref.{field_name} must be a valid short {field_name} "
                                      f"name, got {value!r}")

    def ref_prefixes(self) -> list[str]:
        """Ref-name prefixes to ask the remote for (protocol v2 filters server-side)."""
        if self.name is not None:
            return [self.name]
        if self.tag is not None:
            return [f"refs/tags/{self.tag}"]
        if self.branch is not None:
            return [f"refs/heads/{self.branch}"]
        if self.semver is not None and self.commit is None:
            return ["refs/tags/"]
        # The remote HEAD (and, for a bare commit pin, proof that we may read the remote).
        return ["HEAD"]

    def describe(self) -> str:
        """The selector as a user wrote it, for messages."""
        parts = [f"{k}={v!r}" for k, v in vars(self).items() if v is not None]
        return ", ".join(parts) if parts else "the remote HEAD"


@dataclass(frozen=True)
class Resolution:
    """The outcome of resolving a selector against a listing.

    ``want`` is the object to fetch (a commit, or an annotated tag object); ``commit`` is the
    commit the listing says it peels to (the mirror still peels the fetched object itself).
    ``ref`` is the full remote ref that was selected (None for a bare commit pin).
    """

    ref_name: str | None
    ref: str | None
    want: str
    commit: str


def resolve(selector: RefSelector, refs: Mapping[str, str], symrefs: Mapping[str, str],
            *, url: str) -> Resolution:
    """Pick the object ``selector`` asks for from a remote listing.

    ``refs`` maps full ref names to object ids and may contain ``<tag>^{}`` entries with
    the peeled commit of annotated tags; ``symrefs`` maps e.g. ``HEAD`` to
    ``refs/heads/main``.  Raises :class:`RefNotFoundError` naming ``url`` and the ref.
    """
    if selector.commit is not None:
        ref_name: str | None = None
        if selector.name is not None or selector.tag is not None or selector.branch is not None:
            ref_name = _resolve_ref(selector, refs, symrefs, url=url).ref_name
        return Resolution(ref_name=ref_name, ref=None, want=selector.commit,
                          commit=selector.commit)
    return _resolve_ref(selector, refs, symrefs, url=url)


def _resolve_ref(selector: RefSelector, refs: Mapping[str, str], symrefs: Mapping[str, str],
                 *, url: str) -> Resolution:
    if selector.name is not None:
        return _pick(refs, selector.name, ref_name=selector.name, url=url, what="ref")
    if selector.semver is not None:
        tags = [r.removeprefix("refs/tags/") for r in refs
                if r.startswith("refs/tags/") and not r.endswith(PEELED_SUFFIX)]
        best = highest_match(selector.semver, tags)
        if best is None:
            raise RefNotFoundError(
                f"no tag in {url} matches semver constraint {selector.semver!r}"
            )
        return _pick(refs, f"refs/tags/{best}", ref_name=best, url=url, what="tag")
    if selector.tag is not None:
        return _pick(refs, f"refs/tags/{selector.tag}", ref_name=selector.tag, url=url,
                     what="tag")
    if selector.branch is not None:
        return _pick(refs, f"refs/heads/{selector.branch}", ref_name=selector.branch, url=url,
                     what="branch")
    if "HEAD" not in refs:
        raise RefNotFoundError(f"{url} has no HEAD (is the repository empty?); set ref.branch")
    head = _pick(refs, "HEAD", ref_name="HEAD", url=url, what="HEAD")
    target = symrefs.get("HEAD")
    if target is not None and target.startswith("refs/heads/") and valid_ref_name(target):
        # HEAD was listed with its symref target; the target itself may not be listed.
        return Resolution(ref_name=target.removeprefix("refs/heads/"), ref=target,
                          want=head.want, commit=head.commit)
    return head


def _pick(refs: Mapping[str, str], ref: str, *, ref_name: str, url: str,
          what: str) -> Resolution:
    want = refs.get(ref)
    if want is None:
        raise RefNotFoundError(f"{what} {ref_name!r} not found in {url}")
    # Annotated tags come with their peeled commit; anything else names the commit itself.
    return Resolution(ref_name=ref_name, ref=ref, want=want,
                      commit=refs.get(ref + PEELED_SUFFIX, want))
