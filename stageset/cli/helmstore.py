"""Helm's records of the chart's releases, read where Helm keeps them, and why a hook failed.

Helm (v3 and v4) stores one record per revision of a release in the release's namespace: as a
Secret of type ``helm.sh/release.v1`` (the default ``secret`` driver) or as a ConfigMap (the
``configmap`` driver), both labelled ``owner=helm,name=<release>,version=<revision>,status=<status>``,
the record being base64 of gzipped JSON (once more base64 in a Secret's ``data``).  The ``sql``
driver keeps them outside the cluster: not seen here.

:func:`releases` lists the records of both drivers; :func:`hook_failures` says why a release's hook
failed: the hook Job's own status while it exists, and the Warning events of its pods (an image that
cannot be pulled, a crash), which the apiserver keeps for an hour after Helm deleted the Job.

Identity: the caller's own (the kubeconfig's credentials); reading Secrets needs what ``helm
list`` needs.  Nothing is written.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import dataclass, field
from typing import Any

from stageset.kube.client import ApiError, KubeClient
from stageset.kube.types import KubeObject

CHART = "stageset"
MAX_TOLD = 4
"""Distinct Warning messages told per object."""
DRIVERS = (("secret", "secrets"), ("configmap", "configmaps"))


@dataclass(frozen=True)
class Record:
    """One revision of one release, as Helm stored it."""

    name: str
    namespace: str
    revision: int
    status: str
    description: str
    chart: str
    chart_version: str
    manifest: str
    driver: str
    """``secret`` or ``configmap``: where Helm keeps this release (what ``HELM_DRIVER`` must say)."""
    hooks: list[dict[str, Any]] = field(default_factory=list)


def decode(obj: KubeObject, *, driver: str) -> dict[str, Any]:
    """A record's JSON: a Secret's ``data.release`` is base64 of Helm's base64 of gzipped JSON, a
    ConfigMap's is Helm's base64 as it is."""
    text = (obj.get("data") or {}).get("release", "")
    raw = base64.b64decode(base64.b64decode(text) if driver == "secret" else text)
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    decoded: dict[str, Any] = json.loads(raw)
    return decoded


def _record(obj: KubeObject, *, driver: str) -> Record | None:
    try:
        data = decode(obj, driver=driver)
    except (ValueError, OSError, EOFError):
        return None  # not a record Helm wrote
    meta = (data.get("chart") or {}).get("metadata") or {}
    info = data.get("info") or {}
    return Record(name=str(data.get("name", "")), namespace=str(data.get("namespace", "")),
                  revision=int(data.get("version", 0)), status=str(info.get("status", "")),
                  description=str(info.get("description", "")), chart=str(meta.get("name", "")),
                  chart_version=str(meta.get("version", "")), manifest=str(data.get("manifest", "")),
                  driver=driver, hooks=list(data.get("hooks") or []))


def releases(client: KubeClient, namespace: str | None, *, name: str | None = None,
             chart: str | None = CHART) -> list[Record]:
    """Every stored revision of the chart's releases (in ``namespace`` or every namespace; one
    release by ``name``), both drivers, oldest first.  A driver whose objects the caller may not
    list is skipped."""
    selector = "owner=helm" + (f",name={name}" if name else "")
    found: list[Record] = []
    for driver, plural in DRIVERS:
        path = f"/api/v1/namespaces/{namespace}/{plural}" if namespace else f"/api/v1/{plural}"
        try:
            items = client.request("GET", path, query={"labelSelector": selector}).get("items", [])
        except ApiError as error:
            if error.forbidden:
                continue
            raise
        for item in items:
            record = _record(item, driver=driver)
            if record is not None and (chart is None or record.chart == chart):
                found.append(record)
    return sorted(found, key=lambda r: (r.namespace, r.name, r.revision))


def latest(records: list[Record]) -> list[Record]:
    """The newest revision of each release."""
    newest: dict[tuple[str, str], Record] = {}
    for record in records:
        newest[(record.namespace, record.name)] = record
    return list(newest.values())


def _short(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _events(client: KubeClient, namespace: str, *, kind: str) -> list[dict[str, Any]]:
    try:
        return list(client.request("GET", f"/api/v1/namespaces/{namespace}/events",
                                   query={"fieldSelector": f"involvedObject.kind={kind}"}).get("items", []))
    except ApiError as error:
        if error.forbidden:
            return []
        raise


def job_reasons(client: KubeClient, namespace: str, job: str) -> list[str]:
    """Why the Job ``namespace/job`` failed or is stuck: its Failed condition while it exists,
    then the distinct Warning events of each of its pods (``<job>-<suffix>``: ``Failed to pull image
    ...``, ``Back-off restarting failed container``) and of the Job itself (``DeadlineExceeded``)."""
    reasons: list[str] = []
    try:
        live = client.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}")
    except ApiError as error:
        if not (error.not_found or error.forbidden):
            raise
    else:
        for condition in (live.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Failed" and condition.get("status") == "True":
                reasons.append(f"Job {condition.get('reason')}: {_short(str(condition.get('message', '')))}")
        if not reasons and (live.get("status") or {}).get("active"):
            reasons.append("the Job is still running")
    # Per object, its distinct Warning messages, oldest first (the first pull failure names the image
    # and the registry's answer; the back-off that follows only repeats that it failed).
    told: dict[str, list[tuple[str, str]]] = {}
    for kind in ("Pod", "Job"):
        for event in _events(client, namespace, kind=kind):
            involved = str((event.get("involvedObject") or {}).get("name", ""))
            ours = involved == job if kind == "Job" else involved.startswith(f"{job}-")
            if not ours or event.get("type") != "Warning":
                continue
            when = str(event.get("firstTimestamp") or event.get("eventTime") or "")
            told.setdefault(f"{kind}/{involved}", []).append(
                (when, f"{event.get('reason')}: {_short(str(event.get('message', '')))}"))
    for key, said in sorted(told.items()):
        # By time, and within a second in the order the apiserver lists them (their creation).
        distinct = list(dict.fromkeys(text for _, text in sorted(said, key=lambda told: told[0])))
        reasons.append(f"{key}: " + "; ".join(distinct[:MAX_TOLD]))
    return reasons


def failed_hooks(record: Record) -> list[tuple[str, str]]:
    """(kind, name) of the hooks of ``record`` whose last run failed or never finished."""
    found = []
    for hook in record.hooks:
        phase = str((hook.get("last_run") or {}).get("phase", ""))
        if phase in ("Failed", "Running", "Unknown"):
            found.append((str(hook.get("kind", "")), str(hook.get("name", ""))))
    return found
