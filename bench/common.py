"""Shared helpers for the benchmarks that need a control plane and the controller.

* :func:`controller_kubeconfig` — a kubeconfig for a ServiceAccount holding exactly the
  Helm chart's controller ClusterRole (multi-tenant mode, via
  :func:`stageset.envtest.install.controller_kubeconfig`), so every tenant request in a
  benchmark goes through impersonation, as in a real install, and the audit log tells
  the controller's own requests (``user``) from the tenants' (``impersonatedUser``).
* :class:`Controller` — ``python -m stageset.cli controller`` as a subprocess, with its
  resident memory read from ``/proc/<pid>/status``.
* :class:`StageSetTracker` — a watch (our own :class:`~stageset.kube.watch.Reflector`) on
  every StageSet, recording when each one was first seen Ready, so waiting costs no polling.
* :class:`AuditWindow` — reads the apiserver's audit log from a byte offset and counts
  requests and writes per identity and per kind of target.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stageset.controller.conditions import READY, find_condition, ready_at_generation
from stageset.controller.kinds import STAGESETS
from stageset.controller.status import REQUESTED_AT
from stageset.envtest import install
from stageset.envtest.server import ControlPlane
from stageset.kube.client import KubeClient
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector

CONTROLLER_NAMESPACE = "stageset-system"
CONTROLLER_ACCOUNT = "stageset-controller"
CONTROLLER_USER = f"system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_ACCOUNT}"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
BENCH_MANAGER = "stageset-bench"

Key = tuple[str, str]  # (namespace, name)


# -- identities ---------------------------------------------------------------------------


def controller_kubeconfig(admin: KubeClient, plane: ControlPlane, path: Path) -> Path:
    """A token kubeconfig for the controller's ServiceAccount bound to the chart's ClusterRole."""
    return install.controller_kubeconfig(admin, url=plane.url, ca=plane.pki.ca_cert, path=path,
                                         namespace=CONTROLLER_NAMESPACE, account=CONTROLLER_ACCOUNT)


def role_binding(admin: KubeClient, *, namespace: str, name: str, role: str, subjects: list[Key]) -> None:
    """Bind ClusterRole ``role`` in ``namespace`` to ServiceAccounts ``(namespace, name)``."""
    admin.apply(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/{name}",
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns} for ns, sa in subjects]},
        field_manager=BENCH_MANAGER)


def poke(admin: KubeClient, path: str, stamp: str | None = None) -> str:
    """Ask for a reconcile now (``reconcile.fluxcd.io/requestedAt``), as ``flux reconcile`` does."""
    stamp = stamp or f"{time.time():.6f}"
    admin.request("PATCH", path, content_type="application/merge-patch+json",
                  body={"metadata": {"annotations": {REQUESTED_AT: stamp}}})
    return stamp


# -- watching StageSets ---------------------------------------------------------------------


def ready_condition(obj: KubeObject) -> dict[str, Any]:
    return find_condition((obj.get("status") or {}).get("conditions"), READY)


# Ready=True for the current generation (what ``kubectl wait`` and dependents look at).
is_ready = ready_at_generation


@dataclass
class _Seen:
    obj: KubeObject
    ready: bool
    ready_since: float | None  # monotonic time this object was last seen turning Ready


class StageSetTracker:
    """The latest version of every StageSet, from one cluster-wide watch in this process."""

    def __init__(self, admin: KubeClient):
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._seen: dict[Key, _Seen] = {}
        self._flaps: Counter[Key] = Counter()  # times seen going from Ready to not Ready
        self._reflector = Reflector(client=admin, resource=STAGESETS, namespace=None,
                                    handler=self._handle, stop=self._stop)

    def start(self) -> None:
        self._reflector.start()
        if not self._reflector.synced.wait(30):
            raise RuntimeError("StageSet watch did not sync")

    def stop(self) -> None:
        self._stop.set()

    def _handle(self, event: str, obj: KubeObject) -> None:
        stamp = time.monotonic()
        metadata = obj.get("metadata", {})
        key = (str(metadata.get("namespace", "")), str(metadata.get("name", "")))
        with self._cond:
            if event == "DELETED":
                self._seen.pop(key, None)
            else:
                ready = is_ready(obj)
                before = self._seen.get(key)
                if before and before.ready and not ready:
                    self._flaps[key] += 1
                since = before.ready_since if before and before.ready else (stamp if ready else None)
                self._seen[key] = _Seen(obj, ready, since)
            self._cond.notify_all()

    def get(self, key: Key) -> KubeObject | None:
        with self._cond:
            seen = self._seen.get(key)
            return seen.obj if seen else None

    def ready_since(self, key: Key) -> float | None:
        with self._cond:
            seen = self._seen.get(key)
            return seen.ready_since if seen and seen.ready else None

    def flaps(self, keys: Iterable[Key]) -> int:
        """How often these StageSets were seen leaving Ready so far."""
        with self._cond:
            return sum(self._flaps[key] for key in keys)

    def wait(self, keys: Iterable[Key], check: Callable[[KubeObject | None], bool], *, timeout: float,
             what: str, alive: Callable[[], None] | None = None) -> float:
        """Block until ``check`` holds for every key; returns the monotonic time it first did."""
        pending = set(keys)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                pending = {k for k in pending if not check(s.obj if (s := self._seen.get(k)) else None)}
                if not pending:
                    return time.monotonic()
                left = deadline - time.monotonic()
                if left <= 0:
                    sample = sorted(pending)[:3]
                    states = {f"{k[0]}/{k[1]}": ready_condition(self._seen[k].obj) if k in self._seen
                              else "absent" for k in sample}
                    raise TimeoutError(f"{what}: {len(pending)} not there after {timeout:.0f}s; "
                                       f"e.g. {states}")
                self._cond.wait(min(left, 0.5))
                if alive is not None:
                    alive()


# -- the audit log --------------------------------------------------------------------------


def _actor(event: dict[str, Any]) -> str | None:
    """``controller`` or ``tenant`` (impersonated by the controller); ``None`` for anyone else."""
    if (event.get("user") or {}).get("username") != CONTROLLER_USER:
        return None
    return "tenant" if (event.get("impersonatedUser") or {}).get("username") else "controller"


def _target(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    resource, sub = ref.get("resource", ""), ref.get("subresource")
    if resource == "stagesets":
        return "StageSet status" if sub == "status" else "StageSet (metadata)"
    if resource == "gitrepositories":
        return "GitRepository status" if sub == "status" else "GitRepository"
    if resource == "events":
        return "Event"
    return "applied objects"


@dataclass
class AuditCounts:
    """Requests seen in one window of the audit log (``ResponseComplete`` events, watches left out)."""

    requests: Counter[str] = field(default_factory=Counter)  # by actor
    by_verb: Counter[tuple[str, str]] = field(default_factory=Counter)  # (actor, verb incl. dry-run)
    writes: Counter[str] = field(default_factory=Counter)  # by target, real writes only
    dry_runs: int = 0

    def total(self) -> int:
        return sum(self.requests.values())

    def total_writes(self) -> int:
        return sum(self.writes.values())


class AuditWindow:
    """Counts requests in the audit log between :meth:`start` and :meth:`finish`."""

    def __init__(self, plane: ControlPlane):
        self._path = plane.audit_log
        self._offset = 0

    def start(self) -> None:
        self._offset = self._path.stat().st_size if self._path.exists() else 0

    def finish(self, *, settle: float = 1.0) -> AuditCounts:
        time.sleep(settle)  # the log backend writes asynchronously to the request
        counts = AuditCounts()
        with self._path.open("rb") as log:
            log.seek(self._offset)
            data = log.read()
        for line in data.splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete":
                continue
            actor = _actor(event)
            if actor is None:
                continue
            verb = str(event.get("verb"))
            if verb == "watch":
                continue  # long-running: a watch ending in the window is not work done in it
            dry = "dryRun=" in str(event.get("requestURI", ""))
            counts.requests[actor] += 1
            counts.by_verb[(actor, f"{verb} (dry-run)" if dry else verb)] += 1
            if dry:
                counts.dry_runs += 1
            elif verb in WRITE_VERBS:
                counts.writes[_target(event)] += 1
        return counts


# -- CPU time ----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float:
    """CPU time the whole machine spent not idle so far (all cores, from ``/proc/stat``)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + (fields[7] if len(fields) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds each named process spent between :meth:`start` and :meth:`finish`.

    ``others`` is the rest of the machine's busy time in that window: other people's
    processes competing for the same cores (non-zero on a shared machine).
    """

    def __init__(self, processes: dict[str, int]):
        self._processes = processes
        self._before: dict[str, float] = {}

    def start(self) -> None:
        self._before = {name: cpu_seconds(pid) for name, pid in self._processes.items()}
        self._before["others"] = busy_seconds()

    def finish(self) -> dict[str, float]:
        used = {name: cpu_seconds(pid) - self._before[name] for name, pid in self._processes.items()}
        used["others"] = max(0.0, busy_seconds() - self._before["others"] - sum(used.values()))
        return used


# -- reporting --------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q) - 1))]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> str:
    """One line about where the numbers came from."""
    model = ""
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info
                          if line.startswith("model name")), "")
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} CPU cores ({model or platform.machine()}), {memory:.0f} GiB RAM, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def revision(root: Path) -> str:
    """The checkout's commit, and whether the product code has uncommitted changes."""
    git = shutil.which("git")
    if git is None:
        return "unknown revision"
    try:
        commit = subprocess.run([git, "-C", str(root), "rev-parse", "--short", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run([git, "-C", str(root), "status", "--porcelain", "--", "stageset", "sources"],
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"commit {commit}" + (" with uncommitted changes in stageset/ or sources/" if dirty else "")


def replace_section(path: Path, *, marker: str, body: str, skeleton: str) -> None:
    """Replace the text between ``<!-- marker:begin -->`` and ``<!-- marker:end -->`` in ``path``."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    text = path.read_text() if path.exists() else skeleton
    if begin not in text or end not in text:
        text = text.rstrip("\n") + f"\n\n{begin}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{begin}\n{body.strip()}\n{end}{tail}")
