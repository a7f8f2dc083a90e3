"""One writer per StageSet across label shards: a shard stops writing what left it, and the shard that
gains it waits until the other has said so.

Label shards (:mod:`stageset.controller.sharding`) each watch their own StageSets; relabelling one
moves it: the losing shard's watch says ``DELETED``, the gaining shard's ``ADDED``.  Without more,
a pass of the losing shard that was waiting in an action when that happened would go on, apply the
older revision over the newer one the gaining shard applied, and write stale status.  Two parts
prevent it:

* **The losing shard stops writing** (:class:`~stageset.kube.fence.Fence`).  Every reconcile runs
  under a fence of its own; the watch event that says the object left revokes it, and from then on
  every request of that pass that could change anything — status, finalizer, record, an applied or
  pruned object, whatever identity it is made as — is refused before it is sent (no extra request:
  the watch already told).  The pass ends at its next write; so does an action's HTTP call.
* **The gaining shard waits for the hand-off** (:class:`ShardHandoff`).  Once the last write of
  the revoked pass that was in flight has ended (at once when none was), the losing shard records
  the release in a ``coordination.k8s.io/v1`` Lease named for the StageSet
  (:func:`record_name`) in the release namespace: the StageSet's uid and the resourceVersion at
  which it left.  The gaining shard's first reconcile of a StageSet it gained while running — one
  some controller reconciled before (it has status) — reads that Lease (one GET per look, backing
  off 0.2 s doubling to 2 s) and writes nothing until it shows a release at or after the version the
  StageSet arrived with, or changed since the first look; after ``--shard-handoff-timeout``
  (default 30 s) it goes on anyway: the other shard crashed or is gone, and a stopped process
  writes nothing.  Each hand-off is counted (``stageset_shard_handoffs_total{outcome}``) and its
  wait timed (``stageset_shard_handoff_wait_seconds``).
* **The record goes when the hand-off is complete.**  Once the gaining shard has seen the release,
  it deletes the Lease — only the version it read (a ``resourceVersion`` precondition: a record
  rewritten since, as by a StageSet moved on again, stays).  A Lease left by a hand-off that
  timed out, or not waited for (below), stays until the next hand-off of that StageSet ends.

:func:`setup` declares one :class:`ShardHandoff` per process as the guard of every controller
(:attr:`Setup.guard <stageset.controller.setup.Setup.guard>`) when it runs as a label shard (each
kind is watched under the selector, so every kind's passes are fenced); only StageSets' releases
are recorded and waited for.

Not covered, and why (docs/security.md): StageSets a shard finds in its first list after it started
(it cannot tell a move from its own restart; the losing shard's fence still stops its writes at
the watch event), and a reported ``NoShard`` StageSet (the main shard's report is one status write
and applies nothing): neither is waited for.

Only a process that may reconcile records a release (with leader election: the leader); a standby
watches as well, but its passes are none, so a release of its own would say nothing.

Identity: the controller's own — the hand-off Leases are written, read and deleted as the release's
ServiceAccount (every shard of a release runs as it: the shard that deletes a record is another
process of the identity that created it), which the chart lets get/create/update/delete Leases
in the release namespace only.
Nothing of a tenant is in a record but the StageSet's namespace/name and uid.
Invariant: a pass that began while its StageSet was this shard's sends no write after the watch
told this shard it left; and the release is recorded only after the last write sent before that
has been answered.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from stageset.controller.keys import ObjectKey
from stageset.controller.kinds import STAGESETS
from stageset.controller.leader import default_identity
from stageset.controller.metrics import Metrics
from stageset.controller.result import Result
from stageset.controller.setup import Event, Setup
from stageset.controller.sharding import LabelSelector
from stageset.controller.shared import Shared
from stageset.kube import fence
from stageset.kube.client import ApiError, KubeClient, UnreachableError
from stageset.kube.types import KubeObject

log = logging.getLogger(__name__)

Ticks = Callable[[], float]

LABEL = "stages.metio.wtf/shard-handoff"
"""On every hand-off Lease (``kubectl get leases -l stages.metio.wtf/shard-handoff``)."""
STAGESET = "stages.metio.wtf/stageset"
"""Annotation: ``namespace/name`` of the StageSet the record is about (for people; never parsed)."""
RELEASED_UID = "stages.metio.wtf/released-uid"
RELEASED_VERSION = "stages.metio.wtf/released-version"
"""The StageSet's resourceVersion when it left the shard that released it (empty: not known, as after
a relist)."""
RELEASED_BY = "stages.metio.wtf/released-by"
"""The releasing process (``<host>_<random>``, as leader election names holders)."""

DEPARTED_MEMORY = 60.0
"""Seconds a departure is remembered for a reconcile that read the object just before it left."""
FIRST_LOOK = 0.2
LONGEST_LOOK = 2.0
_PUBLISH_ATTEMPTS = 5


class Outcome(StrEnum):
    RELEASED = "released"
    """The record was there at the first look: no wait."""
    WAITED = "waited"
    """The shard waited for the record, then went on."""
    TIMEOUT = "timeout"
    """No record within the timeout: went on (the other shard is taken for gone)."""


def record_name(namespace: str, name: str) -> str:
    """The hand-off Lease of one StageSet: a hash, since a namespace and a name together can be
    longer than a Lease name may be; the same in every shard of every release."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:40]
    return f"stageset-handoff-{digest}"


def _version(obj: KubeObject) -> int | None:
    value = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(value) if value.isdigit() else None


def _ready_reason(obj: KubeObject) -> str | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("reason") or "")
    return None


@dataclass(frozen=True)
class Release:
    namespace: str
    name: str
    uid: str
    version: int | None


@dataclass
class _Gain:
    """A StageSet this shard gained and has not written yet."""

    uid: str
    version: int | None
    since: float
    delay: float = FIRST_LOOK
    looked: bool = False
    seen: str | None = None
    """The record's own resourceVersion at the first look (``None``: there was none)."""


def released(record: KubeObject | None, *, uid: str, version: int | None, seen: str | None,
             looked: bool) -> bool:
    """Whether ``record`` (the hand-off Lease, ``None`` when absent) releases the StageSet that arrived
    at ``version`` with ``uid``: its release is at or after that version, or it was written after the
    first look (``seen``: its resourceVersion then) — a release made since this shard gained it."""
    if record is None:
        return False
    meta = record.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if uid and annotations.get(RELEASED_UID) not in (None, "", uid):
        return False  # about an earlier StageSet of that name
    at = str(annotations.get(RELEASED_VERSION) or "")
    if at.isdigit() and version is not None and int(at) >= version:
        return True
    return looked and meta.get("resourceVersion") != seen


class ShardHandoff:
    """Per process: the fences of the passes in flight, the StageSets that left, those gained and
    not yet handed over, and the thread that records releases."""

    def __init__(self, *, client: KubeClient, selector: LabelSelector, namespace: str | None, timeout: float,
                 metrics: Metrics, synced: Callable[[], bool], stop: threading.Event,
                 leading: Callable[[], bool] = lambda: True, ticks: Ticks = time.monotonic,
                 identity: str | None = None):
        self._client = client
        # A standby replica (leader election) watches too, but never writes: a release it recorded
        # would not say that the leader's passes stopped.
        self._leading = leading
        self._selector = selector
        self._namespace = namespace
        self._timeout = timeout
        self._metrics = metrics
        self._synced = synced
        self._stop = stop
        self._ticks = ticks
        self._identity = identity or default_identity()
        self._lock = threading.Lock()
        self._fences: dict[ObjectKey, fence.Fence] = {}
        self._departed: dict[ObjectKey, float] = {}  # when it left (ticks)
        self._gains: dict[ObjectKey, _Gain] = {}
        self._releases: queue.SimpleQueue[Release | None] = queue.SimpleQueue()
        self._publisher: threading.Thread | None = None

    # -- the watch: what left, what arrived ------------------------------------------------------

    def observe(self, key: ObjectKey, event: Event, obj: KubeObject, *, known: bool) -> None:
        """A watch event of this shard's label-selected watch (``known``: the key was in the cache)."""
        meta = obj.get("metadata") or {}
        if event is Event.DELETED:
            # Relabelled away: its labels no longer match (a relist's DELETED carries none: taken as
            # left).  A deletion proper (labels still matching) hands nothing over.
            if not meta.get("deletionTimestamp") and not (meta.get("labels") and
                                                          self._selector.matches(meta.get("labels"))):
                self._left(key, obj)
        elif not known:
            self._gained(key, obj)

    def _left(self, key: ObjectKey, obj: KubeObject) -> None:
        meta = obj.get("metadata") or {}
        release = Release(namespace=key.namespace, name=key.name, uid=str(meta.get("uid") or ""),
                          version=_version(obj))
        now = self._ticks()
        with self._lock:
            for old in [k for k, at in self._departed.items() if now - at > DEPARTED_MEMORY]:
                del self._departed[old]
            self._departed[key] = now
            self._gains.pop(key, None)
            running = self._fences.get(key)
        if running is None:
            self._publish(key, release)
            return
        log.info("%s %s/%s left this shard during its pass: the pass writes nothing more", *key.ref)
        if running.revoke(on_quiet=lambda: self._publish(key, release)):
            self._publish(key, release)

    def _gained(self, key: ObjectKey, obj: KubeObject) -> None:
        with self._lock:
            self._departed.pop(key, None)
        if key.kind != STAGESETS.kind or self._namespace is None or not self._synced():
            return  # the first list: a restart cannot be told from a move (see the module docstring)
        if not (obj.get("status") or {}).get("conditions") or _ready_reason(obj) == "NoShard":
            return  # never reconciled (new), or only reported by the main shard
        meta = obj.get("metadata") or {}
        with self._lock:
            self._gains[key] = _Gain(uid=str(meta.get("uid") or ""), version=_version(obj),
                                     since=self._ticks())
        log.info("%s %s/%s arrived from another shard: waiting until that shard has stopped writing it",
                 *key.ref)

    # -- the losing side: record the release -------------------------------------------------------

    def _publish(self, key: ObjectKey, release: Release) -> None:
        if key.kind != STAGESETS.kind or self._namespace is None or not self._leading():
            return
        self._releases.put(release)
        with self._lock:
            if self._publisher is None:
                self._publisher = threading.Thread(target=self._publish_loop, name="shard-handoff",
                                                   daemon=True)
                self._publisher.start()

    def _publish_loop(self) -> None:
        while True:
            release = self._releases.get()
            if release is None:
                return
            for attempt in range(_PUBLISH_ATTEMPTS):
                try:
                    self._write(release)
                    break
                except (ApiError, UnreachableError) as error:
                    if attempt + 1 == _PUBLISH_ATTEMPTS or self._stop.is_set():
                        log.warning("recording the release of StageSet %s/%s failed: %s (the shard that "
                                    "gained it goes on after --shard-handoff-timeout)", release.namespace,
                                    release.name, error)
                        break
                    self._stop.wait(0.2 * 2 ** attempt)

    def _path(self, name: str | None = None) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{self._namespace}/leases"
        return base if name is None else f"{base}/{name}"

    def _write(self, release: Release) -> None:
        name = record_name(release.namespace, release.name)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body: KubeObject = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": self._namespace, "labels": {LABEL: "true"},
                         "annotations": {STAGESET: f"{release.namespace}/{release.name}",
                                         RELEASED_UID: release.uid,
                                         RELEASED_VERSION: str(release.version or ""),
                                         RELEASED_BY: self._identity}},
            # Nobody holds it: the record says who let go, not who writes.
            "spec": {"holderIdentity": "", "renewTime": now}}
        try:
            current = self._client.request("GET", self._path(name))
        except ApiError as error:
            if not error.not_found:
                raise
            try:
                self._client.request("POST", self._path(), body=body)
                return
            except ApiError as created:
                if not created.conflict:  # 409: another shard created it meanwhile; update it
                    raise
                current = self._client.request("GET", self._path(name))
        body["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
        self._client.request("PUT", self._path(name), body=body)
        log.debug("recorded the release of StageSet %s/%s", release.namespace, release.name)

    # -- the gaining side, and every reconcile -----------------------------------------------------

    def run(self, key: ObjectKey, obj: KubeObject, reconcile: Callable[[KubeObject], Result]) -> Result:
        """One reconcile of ``key`` under a fence of its own; a StageSet gained from another shard is
        not reconciled until the hand-off (a requeue until then)."""
        with self._lock:
            if key in self._departed:
                return Result()  # left between the cache read and now: another shard's
            held = fence.Fence(why="the object left this shard's watch (relabelled to another shard)",
                               on_refused=self._metrics.shard_writes_fenced.inc)
            self._fences[key] = held
        try:
            wait = self._handed_over(key)
            if wait is not None:
                return Result(requeue_after=wait)
            try:
                with fence.holding(held):
                    result = reconcile(obj)
            except Exception:
                if held.revoked:
                    log.info("%s %s/%s: the pass stopped at its first write after the object left this "
                             "shard", *key.ref)
                    return Result()
                raise
            return Result() if held.revoked else result
        finally:
            with self._lock:
                if self._fences.get(key) is held:
                    del self._fences[key]

    def _handed_over(self, key: ObjectKey) -> float | None:
        """``None`` once ``key`` may be written (no hand-off pending, or it ended); else the seconds
        until the next look."""
        with self._lock:
            gain = self._gains.get(key)
        if gain is None:
            return None
        record = self._read(key)
        waited = self._ticks() - gain.since
        outcome: Outcome | None = None
        if released(record, uid=gain.uid, version=gain.version, seen=gain.seen, looked=gain.looked):
            outcome = Outcome.WAITED if gain.looked else Outcome.RELEASED
        elif waited >= self._timeout:
            outcome = Outcome.TIMEOUT
            log.warning("%s %s/%s: the shard it came from recorded no release within %gs; going on (that "
                        "shard is taken for gone)", *key.ref, self._timeout)
        if outcome is not None:
            with self._lock:
                if self._gains.get(key) is gain:
                    del self._gains[key]
            if record is not None and outcome is not Outcome.TIMEOUT:
                self._retire(key, record)
            self._metrics.shard_handoffs.labels(outcome.value).inc()
            self._metrics.shard_handoff_wait.observe(waited if outcome is not Outcome.RELEASED else 0.0)
            return None
        if not gain.looked:
            gain.looked = True
            gain.seen = None if record is None else (record.get("metadata") or {}).get("resourceVersion")
        delay, gain.delay = gain.delay, min(LONGEST_LOOK, gain.delay * 2)
        return max(0.01, min(delay, self._timeout - waited))

    def _read(self, key: ObjectKey) -> KubeObject | None:
        try:
            return self._client.request("GET", self._path(record_name(key.namespace, key.name)))
        except ApiError as error:
            if not error.not_found:
                log.warning("reading the hand-off record of %s %s/%s failed: %s", *key.ref, error)
            return None
        except UnreachableError:
            return None

    def _retire(self, key: ObjectKey, record: KubeObject) -> None:
        """The hand-off ``record`` guarded is complete: delete it, as the release's ServiceAccount —
        the version read only, so a release recorded since (the StageSet moved on) is kept.  A
        record that cannot be deleted now is left for the next hand-off of that StageSet to end."""
        meta = record.get("metadata") or {}
        name, version = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        if not name or not version:
            return
        try:
            self._client.request("DELETE", self._path(name), body={
                "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": version}})
        except ApiError as error:
            if not (error.not_found or error.conflict):
                log.warning("deleting the hand-off record of %s %s/%s failed: %s", *key.ref, error)
        except UnreachableError as error:
            log.info("deleting the hand-off record of %s %s/%s failed: %s", *key.ref, error)

    def close(self) -> None:
        """Stop the publisher once it wrote what it was given."""
        self._releases.put(None)


def setup(shared: Shared, *, stop: threading.Event) -> Setup:
    """On a label shard, one hand-off guarding every controller watched under the shard's selector
    (one writer per object across shards); nothing otherwise."""
    settings = shared.settings
    selector = settings.watch_label_selector
    if selector is None:
        return Setup()
    return Setup(guard=ShardHandoff(client=shared.clients.client(), selector=selector,
                                    namespace=settings.shard_handoff_namespace,
                                    timeout=settings.shard_handoff_timeout, metrics=shared.metrics, stop=stop,
                                    synced=shared.synced, leading=shared.leading))
