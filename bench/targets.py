"""Platform targets past the bound: what cycling through more StageTargets than ``--max-remote-targets``
costs, against a real apiserver.

``python -m bench.targets`` (``--targets 24``, ``--bounds 8,24,48``, ``--rounds 3``).  Not part of the
test command; prints a Markdown table.

One control plane plays both sides: the controller's cluster (the StageTargets' Secrets, read as the
admin here) and every remote (each target's kubeconfig names it, with content of its own, so each
is a connection of its own, as distinct clusters are).  For each bound, a fresh
:class:`~stageset.controller.targets.clusters.Targets` with that capacity resolves every target
``--rounds`` times in turn (one StageSet per target, each resolving one kind: discovery), and the
table shows per resolve the wall time, the Secret reads and the discoveries (``GET /api/v1`` in the
audit log).  Within the bound, every round after the first is free; past it, least-recently-used
order evicts each target before it is used again, so every resolve reconnects — what the flag is
for: size it to the targets in use.
"""

from __future__ import annotations

import argparse
import base64
import time
from pathlib import Path

import yaml

from bench.common import markdown_table
from stageset.api import StageSet
from stageset.apply.engine import StageApplier
from stageset.apply.settings import ApplySettings
from stageset.controller.keys import ObjectKey
from stageset.controller.setup import Event
from stageset.controller.targets.clusters import Targets
from stageset.controller.targets.platform import PlatformTargets
from stageset.envtest import server as envtest
from stageset.kube.client import ClientPool
from stageset.kube.mapping import RestMapper

PLATFORM = "bench-targets"
TENANT = "bench-tenant"


def kubeconfig(plane: envtest.ControlPlane, index: int) -> bytes:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": plane.url,
                                               "certificate-authority-data": b64(plane.pki.ca_cert)}}],
        "users": [{"name": "u", "user": {"client-certificate-data": b64(plane.pki.admin_cert),
                                         "client-key-data": b64(plane.pki.admin_key)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }).encode() + f"# target {index}\n".encode()


def discoveries(plane: envtest.ControlPlane) -> int:
    return sum(1 for e in plane.audit_events()
               if e.get("requestURI") == "/api/v1" and e.get("stage") == "ResponseComplete")


def run(plane: envtest.ControlPlane, pool: ClientPool, *, targets: int, bound: int, rounds: int) -> list[str]:
    admin = pool.client()
    platform = PlatformTargets(admin=admin, namespaces=(PLATFORM,))
    cache = Targets(clients=pool, settings=ApplySettings(), local=StageApplier(mapper=RestMapper(admin)),
                    capacity=bound, platform=platform)
    for i in range(targets):
        platform.observe(Event.ADDED, ObjectKey("StageTarget", PLATFORM, f"t{i}"), {
            "metadata": {"name": f"t{i}", "namespace": PLATFORM},
            "spec": {"kubeConfig": {"secretRef": {"name": f"kc{i}"}}, "allowedNamespaces": [TENANT]}})
    stagesets = [StageSet.model_validate({"metadata": {"name": f"s{i}", "namespace": TENANT}, "spec": {
        "serviceAccountName": "deployer", "targetRef": {"name": f"t{i}", "namespace": PLATFORM},
        "stages": [{"name": "app", "sourceRef": {"name": "app"}}]}}) for i in range(targets)]
    time.sleep(1)
    before = discoveries(plane)
    started = time.monotonic()
    for _ in range(rounds):
        for stageset in stagesets:
            target = cache.for_target_ref(stageset)
            target.applier.resolve({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
                                   TENANT)
    elapsed = time.monotonic() - started
    time.sleep(1)
    resolves = rounds * targets
    return [str(targets), str(bound), str(resolves), f"{elapsed / resolves * 1000:.1f}",
            str(platform.secret_reads), str(discoveries(plane) - before), str(len(cache))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=24)
    parser.add_argument("--bounds", default="8,24,48")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    plane = envtest.start()
    pool = ClientPool.from_kubeconfig(str(plane.kubeconfig))
    try:
        admin = pool.client()
        for namespace in (PLATFORM, TENANT):
            admin.apply(f"/api/v1/namespaces/{namespace}",
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                        field_manager="bench")
        for i in range(args.targets):
            admin.apply(f"/api/v1/namespaces/{PLATFORM}/secrets/kc{i}",
                        {"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": f"kc{i}", "namespace": PLATFORM},
                         "data": {"value": base64.b64encode(kubeconfig(plane, i)).decode()}},
                        field_manager="bench")
        rows = [run(plane, pool, targets=args.targets, bound=int(bound), rounds=args.rounds)
                for bound in args.bounds.split(",")]
    finally:
        pool.close()
        plane.stop()
    print(markdown_table(["targets", "bound", "resolves", "ms / resolve", "Secret reads", "discoveries",
                          "kept"], rows))


if __name__ == "__main__":
    main()
