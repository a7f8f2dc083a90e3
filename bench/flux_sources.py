"""Flux sources: from a source's status patch to the apply that follows it, event-driven, p50/p95.

``python -m bench.flux_sources [--iterations 30]`` starts a control plane, installs our CRDs and
Flux's (from the source-controller module), one tenant, a loopback artifact server and the
controller (the chart's multi-tenant RBAC).  One StageSet names an ``ExternalArtifact``; each
iteration publishes a new artifact (a new digest: a download is part of every iteration) by
patching the object's status, as a producer or source-controller would, and measures on the
apiserver's own clock (audit log, microseconds):

* **floor** — status patch -> a plain watch in this process sees it (the event's delivery);
* **apply begins** — status patch -> the first request of the stage's apply (the tenant's
  server-side dry-run of the ConfigMap), which needs: the watch event, a StageSet reconcile
  reading the source as the tenant, a download job in the source pool, the verified unpacking,
  the wake-up, a second reconcile, the build;
* the ratio of the two medians.

It also counts artifact requests: exactly one per new digest, and none while nothing changes
(``--idle`` seconds at the end): no artifact URL is polled.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import controller_kubeconfig, machine, markdown_table, percentile
from bench.common import revision as checkout
from stageset.envtest import install
from stageset.envtest import server as envtest
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.sourcecontroller import install_flux_crds
from stageset.kube.client import ClientPool, KubeClient
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector
from tests.artifactserver import ArtifactServer, digest_of, tarball

NS, SA, NAME = "bench-flux", "deployer", "app"
FLUX = "source.toolkit.fluxcd.io"
EA = Resource(group=FLUX, version="v1", kind="ExternalArtifact", plural="externalartifacts", namespaced=True)
ROOT = Path(__file__).resolve().parents[1]


def _stamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _configmap(value: int) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bench"},
                       "data": {"iteration": str(value)}})


class Watcher:
    """The floor: when this process's own watch sees each artifact revision."""

    def __init__(self, admin: KubeClient):
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Condition()
        self._reflector = Reflector(client=admin, resource=EA, namespace=NS, handler=self._handle,
                                    stop=self._stop)

    def _handle(self, _event: str, obj: KubeObject) -> None:
        revision = str(((obj.get("status") or {}).get("artifact") or {}).get("revision") or "")
        with self._lock:
            self.seen.setdefault(revision, time.time())
            self._lock.notify_all()

    def start(self) -> None:
        self._reflector.start()
        self._reflector.synced.wait(30)

    def stop(self) -> None:
        self._stop.set()


def publish(admin: KubeClient, server: ArtifactServer, i: int) -> tuple[str, str]:
    body = tarball({"cm.yaml": _configmap(i)})
    file = f"ea/{i}.tar.gz"
    url = server.publish(file, body)
    revision = f"latest@sha256:{i}"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    admin.request("PATCH", f"{EA.object_path(name=NAME, namespace=NS)}/status",
                  content_type="application/merge-patch+json", body={"status": {
                      "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded",
                                      "message": "stored", "lastTransitionTime": now}],
                      "artifact": {"url": url, "digest": digest_of(body), "revision": revision, "path": file,
                                   "size": len(body), "lastUpdateTime": now}}})
    return revision, file


def audit(plane: envtest.ControlPlane) -> list[dict[str, Any]]:
    return plane.audit_events()


def patch_time(events: list[dict[str, Any]]) -> float | None:
    """When the apiserver received the latest status patch (one per iteration, each awaited)."""
    found = [event for event in events if event.get("verb") == "patch"
             and (event.get("objectRef") or {}).get("resource") == "externalartifacts"
             and (event.get("objectRef") or {}).get("subresource") == "status"]
    return _stamp(found[-1]["requestReceivedTimestamp"]) if found else None


def apply_time(events: list[dict[str, Any]], after: float) -> float | None:
    for event in events:
        ref = event.get("objectRef") or {}
        if ref.get("resource") == "configmaps" and ref.get("name") == "bench" \
                and (event.get("impersonatedUser") or {}).get("username") \
                and event.get("verb") in ("patch", "create") \
                and _stamp(event["requestReceivedTimestamp"]) >= after:
            return _stamp(event["requestReceivedTimestamp"])
    return None


def run(iterations: int, idle: float) -> str:
    started = time.monotonic()
    plane = envtest.start()
    workdir = Path(tempfile.mkdtemp(prefix="bench-flux-"))
    pool = ClientPool.from_kubeconfig(str(plane.kubeconfig))
    admin = pool.client()
    server = ArtifactServer().start()
    controller: ControllerProcess | None = None
    watcher = Watcher(admin)
    try:
        install.install(admin)
        install_flux_crds(admin)
        install.create_tenant(admin, namespace=NS, service_account=SA)
        admin.apply(EA.object_path(name=NAME, namespace=NS), {
            "apiVersion": f"{FLUX}/v1", "kind": "ExternalArtifact",
            "metadata": {"name": NAME, "namespace": NS}, "spec": {}}, field_manager="bench")
        publish(admin, server, 0)
        kubeconfig = controller_kubeconfig(admin, plane, workdir / "kubeconfig")
        controller = ControllerProcess(kubeconfig=kubeconfig, workdir=workdir / "controller",
                                       log_level="warning")
        stageset = f"/apis/stages.metio.wtf/v1/namespaces/{NS}/stagesets/{NAME}"
        admin.apply(stageset, {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                               "metadata": {"name": NAME, "namespace": NS},
                               "spec": {"serviceAccountName": SA, "stages": [
                                   {"name": "app",
                                    "sourceRef": {"kind": "ExternalArtifact", "name": NAME}}]}},
                    field_manager="bench")
        _wait_applied(admin, stageset, "latest@sha256:0", controller)
        watcher.start()
        floors, applies = [], []
        for i in range(1, iterations + 1):
            revision, _ = publish(admin, server, i)
            _wait_applied(admin, stageset, revision, controller)
            time.sleep(0.3)  # the audit log is written asynchronously
            events = audit(plane)
            patched = patch_time(events)
            applied = apply_time(events, patched) if patched is not None else None
            seen = watcher.seen.get(revision)
            if patched is None or applied is None or seen is None:
                raise RuntimeError(f"iteration {i}: missing evidence (patch {patched}, apply {applied}, "
                                   f"watch {seen})")
            floors.append(seen - patched)
            applies.append(applied - patched)
        requests_before_idle = sum(server.requests.values())
        time.sleep(idle)
        idle_requests = sum(server.requests.values()) - requests_before_idle
        downloads = sum(server.requests.values())
    finally:
        watcher.stop()
        if controller is not None:
            controller.stop()
        server.stop()
        pool.close()
        plane.stop()
    rows = [["floor: status patch -> a watch sees it", _ms(floors), "1.00x"],
            ["status patch -> apply begins (download included)", _ms(applies),
             f"{percentile(applies, 50) / max(percentile(floors, 50), 1e-6):.1f}x"]]
    return "\n".join([
        f"# Flux sources: status patch -> apply begins ({iterations} new artifacts)", "",
        f"{machine()}; {checkout(ROOT)}; {time.monotonic() - started:.0f}s in all.", "",
        markdown_table(["measure", "p50 / p95", "vs floor (p50)"], rows), "",
        f"Artifact requests: {downloads} for {iterations + 1} artifacts (one per new digest); "
        f"{idle_requests} in {idle:.0f}s without changes (no polling).", ""])


def _ms(values: list[float]) -> str:
    return f"{percentile(values, 50) * 1000:.0f} / {percentile(values, 95) * 1000:.0f} ms"


def _wait_applied(admin: KubeClient, stageset: str, revision: str, controller: ControllerProcess) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        controller.check_alive()
        status = admin.get(stageset).get("status") or {}
        if status.get("lastAppliedRevision") == revision:
            return
        time.sleep(0.02)
    raise TimeoutError(f"{stageset} not applied at {revision}: {admin.get(stageset).get('status')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds without changes at the end")
    options = parser.parse_args(argv)
    print(run(options.iterations, options.idle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
