"""The Sources page: every GitRepository (ours) and Flux source the viewer may list, and the
StageSets that use each.  Pure: the hub hands in the objects its watches hold.

What a row shows of a source: its URL (Git, OCI and Helm ``spec.url``; a Bucket's endpoint and
bucket; an ExternalArtifact's producer), the ref it follows, the revision of its artifact, when
that artifact was last updated (the last fetch that found something new), and -- when it is not
Ready -- the error.  Credentials never show: a URL's user information (``https://user:token@``)
is cut, and of ``secretRef`` nothing is shown.

"Used by": the StageSets (in the dashboard's scope) whose stages name the source in their
``sourceRef``, matched by API group, kind, namespace and name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from stageset.api.vocabulary import ConditionType
from stageset.cli.dashboard.links import split_runbook
from stageset.cli.dashboard.views import stage_sources, stageset_href
from stageset.controller.conditions import find_condition
from stageset.kube.types import KubeObject

_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", re.IGNORECASE)

SourceKey = tuple[str, str, str, str]
"""(API group, kind, namespace, name)."""


def without_credentials(url: str) -> str:
    """``https://user:token@host/x`` as ``https://host/x`` (any scheme's user information)."""
    return _USERINFO.sub(r"\1", url)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def source_url(kind: str, spec: Mapping[str, Any]) -> str:
    if kind == "Bucket":
        endpoint, bucket = _text(spec.get("endpoint")), _text(spec.get("bucketName"))
        return f"{endpoint}/{bucket}" if endpoint and bucket else endpoint or bucket
    if kind == "ExternalArtifact":
        producer = spec.get("sourceRef") or {}
        return f"from {producer.get('kind', '?')}/{producer.get('name', '?')}" if producer else ""
    return without_credentials(_text(spec.get("url")))


def source_ref(spec: Mapping[str, Any]) -> str:
    """``branch main``, ``tag v1.2``, ``semver >=1``, ``commit abc…`` (several when combined)."""
    ref = spec.get("ref") or {}
    if not isinstance(ref, Mapping):
        return ""
    parts = [f"{key} {ref[key]}" for key in ("branch", "tag", "semver", "name", "digest", "commit")
             if isinstance(ref.get(key), str) and ref[key]]
    return ", ".join(parts)


@dataclass(frozen=True)
class UsedBy:
    namespace: str
    name: str
    href: str | None


@dataclass(frozen=True)
class SourceRow:
    api_version: str
    kind: str
    namespace: str
    name: str
    url: str
    ref: str
    revision: str | None
    last_fetch: str | None
    ready: str
    reason: str
    message: str
    runbook: str | None
    used_by: list[UsedBy] = field(default_factory=list)

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def anchor(self) -> str:
        """The row's element id: ``/sources#<anchor>`` links to it."""
        return source_anchor(self.group, self.kind, self.namespace, self.name)


def source_anchor(group: str, kind: str, namespace: str, name: str) -> str:
    return "source-" + quote(f"{kind}.{group}-{namespace}-{name}".lower(), safe="-.")


def source_row(obj: KubeObject, used_by: list[UsedBy]) -> SourceRow:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    kind = str(obj.get("kind", ""))
    artifact = status.get("artifact") or {}
    ready = find_condition(status.get("conditions"), ConditionType.READY)
    message, runbook = split_runbook(str(ready.get("message", "")))
    return SourceRow(
        api_version=str(obj.get("apiVersion", "")), kind=kind, namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")), url=source_url(kind, spec), ref=source_ref(spec),
        revision=_text(artifact.get("revision")) or None,
        last_fetch=_text(artifact.get("lastUpdateTime")) or None,
        ready=str(ready.get("status", "Unknown")), reason=str(ready.get("reason", "")),
        message="" if ready.get("status") == "True" else message, runbook=runbook, used_by=used_by)


def users(stagesets: Iterable[KubeObject], *, linkable: Callable[[str], bool]
          ) -> dict[SourceKey, list[UsedBy]]:
    """Which StageSets use each source (by API group, kind, namespace and name)."""
    found: dict[SourceKey, list[UsedBy]] = {}
    for obj in stagesets:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        user = UsedBy(namespace, name, stageset_href(namespace, name) if linkable(namespace) else None)
        for ref in set(stage_sources(obj).values()):
            listed = found.setdefault((ref.group, ref.kind, ref.namespace, ref.name), [])
            if user not in listed:
                listed.append(user)
    return found


def source_rows(sources: Iterable[KubeObject], stagesets: Iterable[KubeObject], *,
                linkable: Callable[[str], bool]) -> list[SourceRow]:
    used = users(stagesets, linkable=linkable)
    rows = []
    for obj in sources:
        meta = obj.get("metadata") or {}
        key = (str(obj.get("apiVersion", "")).rpartition("/")[0], str(obj.get("kind", "")),
               str(meta.get("namespace", "")), str(meta.get("name", "")))
        rows.append(source_row(obj, sorted(used.get(key, []), key=lambda u: (u.namespace, u.name))))
    return sorted(rows, key=lambda r: (r.namespace, r.name, r.kind, r.group))
