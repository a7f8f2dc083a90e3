"""What a StageSet status write costs the apiserver, beside a ConfigMap apply (issue 38, item 2).

Measurement only; nothing here changes what the controller writes.  Run from the checkout's root::

    .venv/bin/python -m bench.status_cost [--n 200] [--rounds 3] [--watchers 0,4]

One control plane (:class:`bench.peers.Bench`, cluster-admin mode, its own watch of StageSets
always open); this controller converges N StageSets of one stage of 5 ConfigMaps (pairs sources)
and is stopped, so the StageSets keep the status it wrote.  Then, for each number of extra
StageSet watchers (a :class:`~stageset.kube.watch.Reflector` each, like another controller or a
dashboard), kube-apiserver's and etcd's CPU seconds are counted over N x rounds writes of each kind:

* ``status (as written)`` — the merge patch to ``/status`` the controller sends
  (:func:`stageset.controller.status.write_status`: the whole status, lists replaced whole), with
  one condition message changed so every write is a real change;
* ``status without inventory and history`` — the same patch with ``inventory``, ``history`` and
  ``lastAppliedSnapshot`` taken out of the object first (what a smaller status would cost);
* ``ConfigMap apply`` — a server-side apply of one of the set's ConfigMaps with a changed value
  (the floor's write);
* with ``--shapes`` (issue 51, the inventory out of the hot status write): ``status without
  inventory`` (only ``inventory`` taken out: the status write of a StageSet whose inventory lives
  elsewhere), and the reference's shape of that elsewhere — a ``StageInventory`` object per stage
  (a bench-only CRD in the same group: the stage's entries in ``spec``, so backups keep them; an
  owner reference to its StageSet), server-side applied as the controller would: ``StageInventory
  apply, new`` (a cold pass creates one per stage) and ``StageInventory apply, changed`` (a pass
  that applied a new revision rewrites its digests).  The per-pass table then adds them up for a
  cold pass, a pass that applied a change and a warm no-op pass, today's shape beside the
  reference's.

Last, the StageSet CRD is applied again without its ``x-kubernetes-validations`` (CEL rules, all
on ``spec``; the apiserver validates the whole object on a status write) and the two status
writes are measured once more: what the rules cost a status write.  The CRD is restored by
nothing: the control plane is thrown away.

Printed: bytes of each object as stored (JSON, with and without ``managedFields``), and per write
the apiserver + etcd CPU in milliseconds.  Identity: the benchmark's admin and the controller's
ServiceAccount bound to cluster-admin, on a control plane of its own.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import CpuMeter, machine, markdown_table, revision
from bench.peers import ROOT, Bench, log, object_names, parallel, ready
from stageset.controller.kinds import STAGESETS
from stageset.envtest import install
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector

SMALLER = ("inventory", "history", "lastAppliedSnapshot")


def _size(obj: KubeObject) -> tuple[int, int]:
    """(bytes as JSON, bytes without managedFields)."""
    whole = len(json.dumps(obj, separators=(",", ":")))
    meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
    return whole, len(json.dumps({**obj, "metadata": meta}, separators=(",", ":")))


def _status_patch(obj: KubeObject, round_: int, *, smaller: bool,
                  without: tuple[str, ...] = SMALLER) -> dict[str, Any]:
    status = json.loads(json.dumps(obj["status"]))
    if smaller:
        for key in without:
            status.pop(key, None)
    for condition in status.get("conditions", []):
        if condition.get("type") == "Ready":
            condition["message"] = f"{condition.get('message', '')[:200]} (write {round_})"
    return {"status": {**{k: None for k in obj["status"] if k not in status}, **status}}


INVENTORY_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "stageinventories.stages.metio.wtf"},
    "spec": {
        "group": "stages.metio.wtf", "scope": "Namespaced",
        "names": {"kind": "StageInventory", "listKind": "StageInventoryList", "plural": "stageinventories",
                  "singular": "stageinventory"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {
                "stageSet": {"type": "string", "maxLength": 253},
                "stage": {"type": "string", "maxLength": 63},
                "serviceAccountName": {"type": "string", "maxLength": 253},
                "entries": {"type": "array", "x-kubernetes-list-type": "atomic", "items": {
                    "type": "object", "required": ["id", "v"], "properties": {
                        "id": {"type": "string", "maxLength": 1024},
                        "v": {"type": "string", "maxLength": 256},
                        "h": {"type": "string", "maxLength": 64}}}}}}}}}}]}}
"""The reference's shape, as a bench-only CRD: one object per stage, its entries in ``spec``."""


def measure(n: int, rounds: int, watchers: tuple[int, ...], *, shapes: bool = False) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="stageset-status-"))
    bench = Bench(workdir, sources="pairs", tenants=10)
    rows: list[list[str]] = []
    sizes: list[list[str]] = []
    try:
        placement = bench.placement("stageset", n, "status")
        objects = bench.stageset_objects(placement, 5, shards=0)
        keys = [(ns, f"set-{k:04d}") for ns, k in placement]
        with bench.stageset_controller("status-controller") as running:
            parallel(8, lambda item: bench.admin.apply(item[0], item[1], field_manager="bench"), objects)
            bench.stagesets.wait(keys, ready, timeout=300 + 2.0 * n, what="cold convergence",
                                 alive=running.alive)
        sets = {key: bench.admin.get(STAGESETS.object_path(namespace=key[0], name=key[1])) for key in keys}
        sample = next(iter(sets.values()))
        namespace, k = placement[0]
        cm = bench.admin.get(f"/api/v1/namespaces/{namespace}/configmaps/{object_names(k, 5)[0]}")
        for label, obj in (("StageSet (after a cold pass)", sample), ("ConfigMap (one of its 5)", cm)):
            whole, bare = _size(obj)
            sizes.append([label, str(whole), str(bare), str(whole - bare)])
        small = {**sample, "status": {k: v for k, v in sample["status"].items() if k not in SMALLER}}
        whole, bare = _size(small)
        sizes.append(["StageSet without inventory, history, lastAppliedSnapshot", str(whole), str(bare),
                      str(whole - bare)])
        processes = {name: pid for name, pid in bench._processes({}).items() if name != "benchmark"}
        if shapes:
            bench.admin.apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                              f"{INVENTORY_CRD['metadata']['name']}", INVENTORY_CRD, field_manager="bench")
            time.sleep(5)  # until the apiserver serves the new kind
        for extra in watchers:
            stop = threading.Event()
            reflectors = [Reflector(client=bench.admin, resource=STAGESETS, namespace=None,
                                    handler=lambda _e, _o: None, stop=stop) for _ in range(extra)]
            for reflector in reflectors:
                reflector.start()
                reflector.synced.wait(60)
            try:
                for label, write in _writes(bench, placement, shapes=shapes, sets=sets).items():
                    meter = CpuMeter(processes)
                    meter.start()
                    begun = time.monotonic()
                    for round_ in range(rounds):
                        parallel(8, functools.partial(_call, write, round_), list(sets.items()))
                    elapsed = time.monotonic() - begun
                    used = meter.finish()
                    count = rounds * len(sets)
                    api = used["kube-apiserver"] * 1000 / count
                    etcd = used["etcd"] * 1000 / count
                    rows.append([str(extra + 1), label, str(count), f"{api:.2f}", f"{etcd:.2f}",
                                 f"{api + etcd:.2f}", f"{elapsed:.1f}", f"{used['others']:.1f}"])
                    log(f"watchers {extra + 1}: {label}: {api + etcd:.2f} ms per write")
            finally:
                stop.set()
        if shapes:
            rows.append([])  # marks where the per-pass sums go
        _strip_cel(bench)
        writes = _writes(bench, placement)
        for label in ("status (as written)", "status without inventory and history"):
            meter = CpuMeter(processes)
            meter.start()
            begun = time.monotonic()
            for round_ in range(rounds):
                parallel(8, functools.partial(_call, writes[label], round_ + rounds), list(sets.items()))
            elapsed = time.monotonic() - begun
            used = meter.finish()
            count = rounds * len(sets)
            api, etcd = used["kube-apiserver"] * 1000 / count, used["etcd"] * 1000 / count
            rows.append(["1", f"{label}, CRD without CEL rules", str(count), f"{api:.2f}", f"{etcd:.2f}",
                         f"{api + etcd:.2f}", f"{elapsed:.1f}", f"{used['others']:.1f}"])
            log(f"without CEL: {label}: {api + etcd:.2f} ms per write")
    finally:
        bench.close()
        shutil.rmtree(workdir, ignore_errors=True)
    passes = _per_pass(rows) if shapes else ""
    rows = [row for row in rows if row]
    head = (f"N = {n} StageSets (one stage of 5 ConfigMaps each, converged by this controller, then "
            f"stopped), {rounds} rounds of each write, 8 threads. Machine: {machine()}. "
            f"Code: {revision(ROOT)}.")
    return "\n\n".join([
        head,
        markdown_table(["object", "bytes (JSON)", "without managedFields", "managedFields"], sizes),
        markdown_table(["StageSet watchers", "write", "writes", "kube-apiserver ms/write", "etcd ms/write",
                        "together ms/write", "wall (s)", "other processes CPU-s"], rows),
        *([passes] if passes else []),
    ])


def _per_pass(rows: list[list[str]]) -> str:
    """Per kind of pass, what the writes of each shape cost together (the rows with one watcher)."""
    cost = {row[1]: float(row[5]) for row in rows[:rows.index([])] if row and row[0] == "1"}
    today = cost["status (as written)"]
    status = cost["status without inventory"]
    new, changed = cost["StageInventory apply, new"], cost["StageInventory apply, changed"]
    lines = [
        ["cold pass (one stage)", "1 status write", f"{today:.2f}",
         "1 status write + 1 StageInventory created", f"{status + new:.2f}",
         f"{(status + new) / today:.2f}x"],
        ["a pass that applied a new revision", "1 status write", f"{today:.2f}",
         "1 status write + 1 StageInventory rewritten", f"{status + changed:.2f}",
         f"{(status + changed) / today:.2f}x"],
        ["warm no-op pass (lastHandledReconcileAt)", "1 status write", f"{today:.2f}", "1 status write",
         f"{status:.2f}", f"{status / today:.2f}x"],
    ]
    return markdown_table(["pass", "today: writes", "ms", "StageInventory shape: writes", "ms",
                           "shape / today"], lines)


def _strip_cel(bench: Bench) -> None:
    """The StageSet CRD again, without any ``x-kubernetes-validations``; waits until it serves."""
    crd = next(c for c in install.crd_manifests() if c["spec"]["names"]["plural"] == "stagesets")

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "x-kubernetes-validations"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    bench.admin.apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}",
                      strip(crd), field_manager="stageset-install")
    time.sleep(5)  # the apiserver swaps the CRD's handler asynchronously


def _call(write: Any, round_: int, item: tuple[tuple[str, str], KubeObject]) -> None:
    write(item, round_)


def _writes(bench: Bench, placement: list[tuple[str, int]], *, shapes: bool = False,
            sets: dict[tuple[str, str], KubeObject] | None = None) -> dict[str, Any]:
    index = {f"set-{k:04d}": k for _, k in placement}
    counter = itertools.count(1)

    def status(item: tuple[tuple[str, str], KubeObject], round_: int, *, smaller: bool,
               without: tuple[str, ...] = SMALLER) -> None:
        (namespace, name), obj = item
        bench.admin.request("PATCH", STAGESETS.object_path(namespace=namespace, name=name) + "/status",
                            body=_status_patch(obj, round_, smaller=smaller, without=without),
                            content_type="application/merge-patch+json")

    def inventory(item: tuple[tuple[str, str], KubeObject], round_: int, *, new: bool) -> None:
        (namespace, name), obj = item
        del round_  # every call writes something new: a new object, or changed digests
        stage = obj["status"]["inventory"][0]
        serial = next(counter)
        object_name = f"{name}-{stage['name']}" + (f"-n{serial}" if new else "")
        entries = [{**entry, "h": f"{serial:06d}{entry.get('h', '')[6:]}"} for entry in stage["entries"]]
        body = {"apiVersion": "stages.metio.wtf/v1", "kind": "StageInventory",
                "metadata": {"name": object_name, "namespace": namespace,
                             "labels": {"stages.metio.wtf/name": name},
                             "ownerReferences": [{"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
                                                  "name": name, "uid": obj["metadata"]["uid"],
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": {"stageSet": name, "stage": stage["name"], "entries": entries}}
        bench.admin.apply(f"/apis/stages.metio.wtf/v1/namespaces/{namespace}/stageinventories/{object_name}",
                          body, field_manager="stageset-controller")

    def configmap(item: tuple[tuple[str, str], KubeObject], round_: int) -> None:
        (namespace, name), _ = item
        cm_name = object_names(index[name], 5)[0]
        bench.admin.apply(f"/api/v1/namespaces/{namespace}/configmaps/{cm_name}",
                          {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": cm_name, "namespace": namespace},
                           "data": {"round": str(round_)}},
                          field_manager="stageset-bench-floor")

    if shapes and sets is not None:
        # The objects "changed" rewrites, created first (untimed).
        parallel(8, lambda item: inventory(item, 0, new=False), list(sets.items()))
    writes = {
        "status (as written)": lambda item, r: status(item, r, smaller=False),
        "status without inventory and history": lambda item, r: status(item, r, smaller=True),
        "ConfigMap apply": configmap,
    }
    if shapes:
        writes.update({
            "status without inventory": lambda item, r: status(item, r, smaller=True, without=("inventory",)),
            "StageInventory apply, new": lambda item, r: inventory(item, r, new=True),
            "StageInventory apply, changed": lambda item, r: inventory(item, r, new=False),
        })
    return writes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.status_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--watchers", type=lambda v: tuple(int(x) for x in v.split(",")), default=(0, 4),
                        help="extra StageSet watchers per measurement (the benchmark's own is always open)")
    parser.add_argument("--shapes", action="store_true",
                        help="also the inventory's own object (the reference's StageInventory), per pass")
    args = parser.parse_args(argv)
    print(measure(args.n, args.rounds, args.watchers, shapes=args.shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
