"""The pure parts of ``stageset uninstall``: Helm's release records, and what a controller Deployment
watches.  The command itself runs against releases installed by the real helm in
tests/helm/test_uninstall.py."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

from stageset.cli.uninstall import Release, Scope, decode_release, leases, scope_of


def deployment(*args: str, component: str = "controller") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "x", "namespace": "ops", "labels": {
                "app.kubernetes.io/part-of": "stageset", "app.kubernetes.io/component": component}},
            "spec": {"template": {"spec": {"containers": [{"name": "controller", "args": list(args)}]}}}}


def test_helm_s_record_is_base64_of_base64_of_gzipped_json() -> None:
    release = {"name": "r", "manifest": "---\nkind: ServiceAccount\n", "info": {"status": "deployed"}}
    helm_side = base64.b64encode(gzip.compress(json.dumps(release).encode()))
    secret = {"data": {"release": base64.b64encode(helm_side).decode()}}
    assert decode_release(secret) == release
    plain = base64.b64encode(base64.b64encode(json.dumps(release).encode())).decode()  # not compressed
    assert decode_release({"data": {"release": plain}}) == release


def test_the_scope_is_what_the_controller_watches() -> None:
    assert scope_of(deployment("--workers=4")) == Scope(namespaces=None)
    watched = scope_of(deployment("--watch-namespaces=a,b",
                                  "--watch-label-selector=sharding.fluxcd.io/key=s1"))
    assert watched == Scope(namespaces=("a", "b"), selector="sharding.fluxcd.io/key=s1")
    assert watched.describe() == "a, b with labels sharding.fluxcd.io/key=s1"


def test_only_controller_deployments_count_and_their_leases_are_named_by_their_flags() -> None:
    elected = deployment("--leader-elect", "--leader-election-id=r-stageset",
                         "--leader-election-namespace=ops")
    other = deployment("--leader-elect", "--leader-election-id=nope", component="dashboard")
    release = Release(name="r", namespace="ops", objects=[elected, other, deployment("--no-leader-elect")])
    assert len(release.deployments) == 2
    assert [(lease["metadata"]["namespace"], lease["metadata"]["name"]) for lease in leases(release)] == [
        ("ops", "r-stageset")]
