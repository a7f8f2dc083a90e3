"""Fixtures for admission tests: our CRDs installed from ``crds/`` into the real apiserver.

Installed with the plain apiextensions API (not our client layer) so these tests
exercise exactly what ``kubectl apply -f crds/`` or Helm would send.  The control
plane lives for the whole worker session and other modules may install the same
CRDs, so installing is idempotent: an existing CRD is replaced with ours.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"
_ESTABLISH_TIMEOUT = 60.0


def _raw(response: Any) -> dict[str, Any]:
    # _preload_content=False: the typed CRD models of the official client add nothing here.
    body: dict[str, Any] = json.loads(response.data)
    return body


def install_crd(ext: k8s.ApiextensionsV1Api, crd: dict[str, Any]) -> None:
    """Create ``crd``, or replace the live one; raises the apiserver's refusal as is."""
    name = crd["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(crd, _preload_content=False)
    except k8s.ApiException as error:
        if error.status != 409:
            raise
        live = _raw(ext.read_custom_resource_definition(name, _preload_content=False))
        replacement = {**crd, "metadata": {**crd["metadata"],
                                           "resourceVersion": live["metadata"]["resourceVersion"]}}
        ext.replace_custom_resource_definition(name, replacement, _preload_content=False)


def wait_established(ext: k8s.ApiextensionsV1Api, name: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        live = _raw(ext.read_custom_resource_definition(name, _preload_content=False))
        conditions = {c["type"]: c for c in (live.get("status") or {}).get("conditions") or []}
        if conditions.get("Established", {}).get("status") == "True":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s: {conditions}")
        time.sleep(0.1)


def wait_served(custom: k8s.CustomObjectsApi, crd: dict[str, Any], *, timeout: float) -> None:
    """Established can precede the resource answering by a moment; list until it does."""
    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    version = crd["spec"]["versions"][0]["name"]
    deadline = time.monotonic() + timeout
    while True:
        try:
            custom.list_cluster_custom_object(group, version, plural, limit=1,
                                              _preload_content=False)
            return
        except k8s.ApiException as error:
            if error.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


@pytest.fixture(scope="module")
def crds(admin_api: k8s.ApiClient) -> list[dict[str, Any]]:
    """The CRDs from ``crds/``, installed and Established (the apiserver also checks CEL cost)."""
    manifests = [yaml.safe_load(path.read_text(encoding="utf-8"))
                 for path in sorted(CRD_DIR.glob("*.yaml"))]
    assert manifests, f"no CRDs in {CRD_DIR}"
    ext = k8s.ApiextensionsV1Api(admin_api)
    for crd in manifests:
        install_crd(ext, crd)
    custom = k8s.CustomObjectsApi(admin_api)
    for crd in manifests:
        wait_established(ext, crd["metadata"]["name"], timeout=_ESTABLISH_TIMEOUT)
        wait_served(custom, crd, timeout=_ESTABLISH_TIMEOUT)
    return manifests


@pytest.fixture
def ensure_namespace(admin_api: k8s.ApiClient) -> Callable[[str], str]:
    """Create a namespace of a fixed name unless it exists (DESIGN.md's examples need that).

    Such namespaces are left in place: without kube-controller-manager a deleted
    namespace stays Terminating for good and would block the next test needing it.
    """
    core = k8s.CoreV1Api(admin_api)

    def ensure(name: str) -> str:
        try:
            core.create_namespace({"metadata": {"name": name}})
        except k8s.ApiException as error:
            if error.status != 409:
                raise
        return name

    return ensure


@pytest.fixture(scope="module")
def scratch_namespace(admin_api: k8s.ApiClient) -> Iterator[str]:
    """One namespace for this module's dry-run and throw-away objects."""
    core = k8s.CoreV1Api(admin_api)
    name = f"api-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)
