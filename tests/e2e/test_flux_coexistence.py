"""Next to Flux: our kinds never shadow source.toolkit.fluxcd.io's, and the docs say what kubectl resolves.

Flux's GitRepository CRD (a minimal copy of its names: same kind, plural, singular and the
short name ``gitrepo``) is installed next to ours.  Names are then resolved from the
apiserver's discovery documents the way kubectl resolves them (no kubectl binary needed):

1. a category (``kubectl get stages``) expands to every resource that lists it;
2. a short name expands to the first resource in discovery order that declares it;
3. a plural, singular or kind name (optionally ``.group``-qualified) maps to the first
   group in discovery order that serves it (kubectl's priority REST mapper).

The expectations are read from the table in docs/concepts.md, so the page and the cluster
cannot disagree.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from stageset.api.crd import CATEGORY, KINDS
from stageset.kube.client import ApiError, KubeClient

pytestmark = [pytest.mark.apiserver]

ROOT = Path(__file__).resolve().parents[2]
_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FLUX_GROUP = "source.toolkit.fluxcd.io"
FLUX_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gitrepositories.{FLUX_GROUP}"},
    "spec": {
        "group": FLUX_GROUP,
        "names": {
            "kind": "GitRepository",
            "listKind": "GitRepositoryList",
            "plural": "gitrepositories",
            "singular": "gitrepository",
            "shortNames": ["gitrepo"],
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


@dataclass(frozen=True)
class ApiResource:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    short_names: tuple[str, ...]
    categories: tuple[str, ...]

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def discovery(client: KubeClient) -> list[ApiResource]:
    """Every served resource, in kubectl's priority order: the core group, then /apis in order
    (the apiserver sorts groups by priority; CRD groups of equal priority by name)."""
    versions: list[tuple[str, str]] = [("", "v1")]
    for group in client.get("/apis")["groups"]:
        preferred = group["preferredVersion"]["version"]
        others = [v["version"] for v in group["versions"] if v["version"] != preferred]
        versions += [(group["name"], v) for v in (preferred, *others)]
    found: list[ApiResource] = []
    for group, version in versions:
        path = f"/apis/{group}/{version}" if group else "/api/v1"
        for entry in client.get(path).get("resources", []):
            if "/" in entry["name"]:
                continue
            found.append(
                ApiResource(
                    group=group,
                    version=version,
                    plural=entry["name"],
                    singular=entry.get("singularName") or entry["kind"].lower(),
                    kind=entry["kind"],
                    short_names=tuple(entry.get("shortNames") or ()),
                    categories=tuple(entry.get("categories") or ()),
                )
            )
    return found


def resolve(resources: list[ApiResource], arg: str) -> set[str]:
    """What ``kubectl get <arg>`` lists: the qualified resource names."""
    category = {r.qualified for r in resources if arg in r.categories}
    if category:
        return category
    name, _, group = arg.partition(".")
    for r in resources:
        if name in r.short_names and (not group or r.group == group):
            return {r.qualified}
    for r in resources:
        if name in (r.plural, r.singular, r.kind.lower()) and (not group or r.group == group):
            return {r.qualified}
    return set()


def documented() -> dict[str, set[str]]:
    """The table in docs/concepts.md: | `kubectl get X` | `a.b`, `c.d` | ... |"""
    rows: dict[str, set[str]] = {}
    text = (ROOT / "docs" / "concepts.md").read_text()
    for match in re.finditer(r"^\| `kubectl get ([\w.-]+)` \| ([^|]+) \|", text, re.MULTILINE):
        rows[match.group(1)] = set(re.findall(r"`([\w.-]+)`", match.group(2)))
    return rows


def _wait_served(client: KubeClient, group: str, plural: str, *, present: bool = True) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            served = {r["name"] for r in client.get(f"/apis/{group}/v1").get("resources", [])}
        except ApiError as error:
            if not error.not_found:
                raise
            served = set()
        groups = {g["name"] for g in client.get("/apis")["groups"]}
        if (plural in served and group in groups) == present:
            return
        time.sleep(0.2)
    pytest.fail(f"{plural}.{group} {'not served' if present else 'still served'} after 60s")


@pytest.fixture
def flux_installed(installed: KubeClient) -> Iterator[KubeClient]:
    path = f"{_CRDS}/{FLUX_CRD['metadata']['name']}"
    try:
        installed.get(path)
        # Flux's real CRDs, installed by the Flux source tests on this control plane: used as they are.
        _wait_served(installed, FLUX_GROUP, "gitrepositories")
        yield installed
        return
    except ApiError as error:
        if not error.not_found:
            raise
    installed.apply(path, FLUX_CRD, field_manager="flux-coexistence-test")
    _wait_served(installed, FLUX_GROUP, "gitrepositories")
    try:
        yield installed
    finally:
        installed.delete(path)
        _wait_served(installed, FLUX_GROUP, "gitrepositories", present=False)


def test_the_docs_table_covers_every_name_of_ours() -> None:
    rows = documented()
    names = {CATEGORY, "gitrepo"}
    for kind in KINDS:
        names |= {*kind.short_names, kind.plural, kind.singular, kind.crd_name}
    assert names <= set(rows), f"docs/concepts.md lacks rows for {sorted(names - set(rows))}"


def test_alone_our_plural_names_resolve_to_ours(installed: KubeClient) -> None:
    # Alone: without Flux's kinds (other tests of this worker may have installed its CRDs).
    resources = [r for r in discovery(installed) if r.group != FLUX_GROUP]
    assert any(r.group == "stages.metio.wtf" for r in resources)
    assert resolve(resources, "gitrepositories") == {"gitrepositories.stages.metio.wtf"}
    assert resolve(resources, "gitrepo") == set()  # Flux's short name is not ours to take


def test_next_to_flux_every_name_resolves_as_documented(flux_installed: KubeClient) -> None:
    resources = discovery(flux_installed)
    ours = [r for r in resources if r.group == "stages.metio.wtf"]
    assert {r.plural for r in ours} == {kind.plural for kind in KINDS}
    for arg, expected in documented().items():
        assert resolve(resources, arg) == expected, f"kubectl get {arg}"
    # Flux keeps its short name, and no other resource in the cluster declares ours.
    assert resolve(resources, "gitrepo") == {f"gitrepositories.{FLUX_GROUP}"}
    for r in ours:
        for short in r.short_names:
            holders = {
                o.qualified for o in resources if short in o.short_names or short in (o.plural, o.singular)
            }
            assert holders == {r.qualified}, f"short name {short!r} is also {holders - {r.qualified}}"


def test_printer_columns(installed: KubeClient, admin_api: k8s.ApiClient, make_namespace: Any) -> None:
    namespace = make_namespace("columns")
    base = f"/apis/stages.metio.wtf/v1/namespaces/{namespace}"
    installed.apply(
        f"{base}/gitrepositories/app",
        {
            "apiVersion": "stages.metio.wtf/v1",
            "kind": "GitRepository",
            "metadata": {"name": "app", "namespace": namespace},
            "spec": {"url": "https://git.example.invalid/app.git", "suspend": True},
        },
        field_manager="test",
    )
    table = _table(admin_api, f"{base}/gitrepositories")
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "URL", "Ready", "Status", "Revision", "Suspended", "Age"]
    row = dict(zip(names, table["rows"][0]["cells"], strict=True))
    assert row["URL"] == "https://git.example.invalid/app.git"
    assert row["Suspended"] is True
    table = _table(admin_api, f"{base}/stagesets")
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Ready",
        "Status",
        "Revision",
        "Suspended",
        "Age",
    ]


def _table(api: k8s.ApiClient, path: str) -> dict[str, Any]:
    """The server-side table kubectl prints (``Accept: ...;as=Table``), as the admin."""
    response = api.rest_client.pool_manager.request(
        "GET",
        f"{api.configuration.host}{path}",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    assert response.status == 200, response.data[:500]
    table: dict[str, Any] = json.loads(response.data)
    return table
