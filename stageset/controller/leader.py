"""Leader election on a ``coordination.k8s.io/v1`` Lease: one controller of a release reconciles.

Identity: the controller's own (``ClientPool.client()``: the release's ServiceAccount in a
cluster), which the chart lets get/create/update Leases in the release namespace only.

The protocol is client-go's, on one Lease per release (``--leader-election-id``, the chart
passes the release's full name, so sharded releases never contend):

* A candidate reads the Lease.  It may take it when nobody holds it (no Lease, an empty
  ``holderIdentity``), or when the record it last saw has not changed for ``lease_duration``
  by *its own* monotonic clock (the holder's timestamps are never compared with ours, so
  clock skew between nodes does not matter).  Writes carry the ``resourceVersion`` read, so
  of two candidates exactly one wins; the other gets 409 and tries again.
* The leader renews every ``retry_period``.  If it has not renewed for ``renew_deadline``
  (shorter than ``lease_duration``) it has lost the lease: :attr:`LeaderElector.on_lost`
  runs (the controller exits at once, as controller-runtime does), before any candidate
  can see the lease expire.  So no two processes reconcile at the same time, unless a
  process is paused longer than ``lease_duration - renew_deadline`` (see docs/install.md).
* On a clean stop the leader *releases* the Lease (empty holder, 1 s duration), so a standby
  (e.g. the new pod of a rolling update) takes over at its next try instead of after
  ``lease_duration``.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stageset.kube.client import ApiError, KubeClient, UnreachableError

log = logging.getLogger(__name__)

_IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def default_identity() -> str:
    """``<hostname>_<random>``: the pod name in a cluster, unique even for two processes on one host."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str | None:
    """``$POD_NAMESPACE``, else the in-cluster ServiceAccount's namespace, else None."""
    configured = os.environ.get("POD_NAMESPACE")
    if configured:
        return configured
    try:
        with open(_IN_CLUSTER_NAMESPACE) as source:
            return source.read().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class LeaderElectionConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs retry period < renew deadline < lease duration "
                             f"(got {self.retry_period}s, {self.renew_deadline}s, {self.lease_duration}s)")


def _now() -> str:
    """A MicroTime, as the Lease API expects it."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquires, renews and releases one Lease; :attr:`leading` is set while we hold it."""

    def __init__(self, *, client: KubeClient, config: LeaderElectionConfig, stop: threading.Event,
                 on_lost: Callable[[], None], clock: Callable[[], float] = time.monotonic):
        self._client = client
        self.config = config
        self._stop = stop
        self.on_lost = on_lost
        self._clock = clock
        self.leading = threading.Event()
        # The Lease as we last saw it, and when (our clock) its content last changed.
        self._observed: dict[str, Any] | None = None
        self._observed_key: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._thread: threading.Thread | None = None
        # Every Lease request is bounded well inside the renew deadline.
        self._timeout = max(1.0, config.renew_deadline / 2)

    @property
    def _path(self) -> str:
        return (f"/apis/coordination.k8s.io/v1/namespaces/{self.config.namespace}"
                f"/leases/{self.config.name}")

    # -- one attempt -------------------------------------------------------------------

    def _observe(self, lease: dict[str, Any] | None) -> None:
        spec = (lease or {}).get("spec") or {}
        key = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        if key != self._observed_key:
            self._observed_key = key
            self._observed_at = self._clock()
        self._observed = lease

    def try_acquire_or_renew(self) -> bool:
        """One round: True when we hold the Lease afterwards.  An apiserver that does not answer
        is a failed round like a refused one (a leader steps down after ``renew_deadline`` of
        them), never an exception that would end the election thread while ``leading`` stays set."""
        try:
            return self._round()
        except UnreachableError as error:
            log.warning("leader election: Lease %s/%s not reachable: %s", self.config.namespace,
                        self.config.name, error)
            return False

    def _round(self) -> bool:
        now = _now()
        duration = max(1, round(self.config.lease_duration))
        try:
            lease: dict[str, Any] | None = self._client.request("GET", self._path, timeout=self._timeout)
        except ApiError as error:
            if not error.not_found:
                log.warning("leader election: reading Lease %s/%s failed: %s", self.config.namespace,
                            self.config.name, error)
                return False
            lease = None
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.config.name, "namespace": self.config.namespace},
                    "spec": {"holderIdentity": self.config.identity, "leaseDurationSeconds": duration,
                             "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}
            try:
                created = self._client.request(
                    "POST", f"/apis/coordination.k8s.io/v1/namespaces/{self.config.namespace}/leases",
                    body=body, timeout=self._timeout)
            except ApiError as error:
                if not (error.conflict or error.status == 409):
                    log.warning("leader election: creating Lease failed: %s", error)
                return False
            self._observe(created)
            return True
        self._observe(lease)
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        ours = holder == self.config.identity
        expired = self._clock() - self._observed_at >= self.config.lease_duration
        if holder and not ours and not expired:
            return False
        if not ours:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
        spec.update(holderIdentity=self.config.identity, leaseDurationSeconds=duration, renewTime=now)
        try:
            updated = self._client.request("PUT", self._path, body={**lease, "spec": spec},
                                           timeout=self._timeout)
        except ApiError as error:
            if error.status != 409:
                log.warning("leader election: updating Lease failed: %s", error)
            return False
        self._observe(updated)
        return True

    # -- the loop ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def wait_leading(self) -> bool:
        """Block until we lead (True) or the process is asked to stop (False)."""
        while not self._stop.is_set():
            if self.leading.wait(0.2):
                return True
        return False

    def _run(self) -> None:
        config = self.config
        log.info("leader election: %s is a candidate for Lease %s/%s", config.identity, config.namespace,
                 config.name)
        while not self._stop.is_set():
            if self.try_acquire_or_renew():
                self._renewed_at = self._clock()
                if not self.leading.is_set():
                    log.info("leader election: %s acquired Lease %s/%s", config.identity,
                             config.namespace, config.name)
                    self.leading.set()
            elif self.leading.is_set() and self._clock() - self._renewed_at >= config.renew_deadline:
                self.leading.clear()
                log.error("leader election: %s could not renew Lease %s/%s for %.0fs: leadership lost",
                          config.identity, config.namespace, config.name, config.renew_deadline)
                self.on_lost()
                return
            self._stop.wait(config.retry_period)

    def release(self) -> None:
        """Give the Lease up now (clean stop), so a standby need not wait for it to expire."""
        if self._thread is not None:
            self._thread.join(timeout=self._timeout + 1)  # no renewal races the release
        if not self.leading.is_set():
            return
        self.leading.clear()
        lease = self._observed
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.config.identity:
            return
        spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now()}
        try:
            self._client.request("PUT", self._path, body={**lease, "spec": spec}, timeout=self._timeout)
            log.info("leader election: released Lease %s/%s", self.config.namespace, self.config.name)
        except (ApiError, UnreachableError) as error:
            log.warning("leader election: releasing Lease failed (it expires by itself): %s", error)
