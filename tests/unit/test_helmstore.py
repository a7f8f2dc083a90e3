"""Helm's records in both storage drivers, and why a hook failed (``stageset check``,
``stageset uninstall``).  The commands run against the real helm in tests/helm and tests/node."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

from stageset.cli import helmstore
from stageset.kube.client import ApiError


def record(name: str, *, revision: int, status: str, chart: str = "stageset",
           hooks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": "ops", "version": revision,
            "info": {"status": status, "description": f"{status} for a reason"},
            "chart": {"metadata": {"name": chart, "version": "0.3.0"}}, "manifest": "", "hooks": hooks or []}


def stored(data: dict[str, Any], *, driver: str) -> dict[str, Any]:
    helm_side = base64.b64encode(gzip.compress(json.dumps(data).encode())).decode()
    value = base64.b64encode(helm_side.encode()).decode() if driver == "secret" else helm_side
    return {"metadata": {"name": f"sh.helm.release.v1.{data['name']}.v{data['version']}",
                         "labels": {"owner": "helm", "name": data["name"]}}, "data": {"release": value}}


class Fake:
    """What helmstore asks of the apiserver: lists of Secrets, ConfigMaps and Events, one Job."""

    def __init__(self, *, secrets: list[dict[str, Any]], configmaps: list[dict[str, Any]],
                 events: list[dict[str, Any]] | None = None, job: dict[str, Any] | None = None):
        self.secrets, self.configmaps, self.events, self.job = secrets, configmaps, events or [], job

    def request(self, method: str, path: str, *, query: dict[str, str] | None = None) -> dict[str, Any]:
        assert method == "GET"
        if path.endswith("/secrets"):
            return {"items": self.secrets}
        if path.endswith("/configmaps"):
            return {"items": self.configmaps}
        kind = (query or {})["fieldSelector"].split("=")[1]
        return {"items": [e for e in self.events if e["involvedObject"]["kind"] == kind]}

    def get(self, path: str) -> dict[str, Any]:
        assert path.endswith("/jobs/r-crds"), path
        if self.job is None:
            raise ApiError(status=404, reason="NotFound", message="gone")
        return self.job


def test_records_of_both_drivers_newest_per_release_and_only_the_chart_s() -> None:
    client = Fake(secrets=[stored(record("a", revision=1, status="superseded"), driver="secret"),
                           stored(record("a", revision=2, status="deployed"), driver="secret"),
                           stored(record("other", revision=1, status="deployed", chart="nginx"),
                                  driver="secret"),
                           {"metadata": {"name": "junk"}, "data": {"release": "not base64 !"}}],
                  configmaps=[stored(record("b", revision=1, status="failed"), driver="configmap")])
    found = helmstore.releases(client, "ops")  # type: ignore[arg-type]
    assert [(r.name, r.revision, r.driver) for r in found] == [("a", 1, "secret"), ("a", 2, "secret"),
                                                                ("b", 1, "configmap")]
    assert [(r.name, r.status) for r in helmstore.latest(found)] == [("a", "deployed"), ("b", "failed")]


def test_a_failed_hook_s_reasons_in_the_order_they_happened() -> None:
    hooks = [{"kind": "ServiceAccount", "name": "r-crds", "last_run": {"phase": "Succeeded"}},
             {"kind": "Job", "name": "r-crds", "last_run": {"phase": "Failed"}}]
    failed = helmstore._record(stored(record("r", revision=1, status="failed", hooks=hooks), driver="secret"),
                               driver="secret")
    assert failed is not None
    assert helmstore.failed_hooks(failed) == [("Job", "r-crds")]

    def event(name: str, kind: str, reason: str, message: str, when: str,
              type_: str = "Warning") -> dict[str, Any]:
        return {"involvedObject": {"kind": kind, "name": name}, "type": type_, "reason": reason,
                "message": message, "firstTimestamp": when}
    # Listed in creation order; two in the same second: the pull failure first, as it happened.
    events = [event("r-crds-x1", "Pod", "Pulling", "Pulling image", "T1", type_="Normal"),
              event("r-crds-x1", "Pod", "Failed", 'Failed to pull image "reg/stageset:9": not found', "T2"),
              event("r-crds-x1", "Pod", "Failed", "Error: ErrImagePull", "T2"),
              event("r-crds-x1", "Pod", "Failed", "Error: ImagePullBackOff", "T3"),
              event("r-crds-x1", "Pod", "Failed", "Error: ImagePullBackOff", "T4"),
              event("other-x1", "Pod", "Failed", "not ours", "T2"),
              event("r-crds", "Job", "DeadlineExceeded", "Job was active longer than specified deadline",
                    "T5")]
    reasons = helmstore.job_reasons(Fake(secrets=[], configmaps=[], events=events), "ops", "r-crds")  # type: ignore[arg-type]
    assert reasons == [
        "Job/r-crds: DeadlineExceeded: Job was active longer than specified deadline",
        'Pod/r-crds-x1: Failed: Failed to pull image "reg/stageset:9": not found; '
        "Failed: Error: ErrImagePull; Failed: Error: ImagePullBackOff"]
    job = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                      "message": "Job has reached the specified backoff limit"}]}}
    kept = helmstore.job_reasons(Fake(secrets=[], configmaps=[], job=job), "ops", "r-crds")  # type: ignore[arg-type]
    assert kept == ["Job BackoffLimitExceeded: Job has reached the specified backoff limit"]
