"""Apply one stage: dry-run everything as the tenant, apply phase by phase, then wait.

Identity: every request made here goes through the ``client`` handed in, which the
controller binds to the stage's identity (the tenant's ServiceAccount, or the
controller itself in single-tenant mode).  Discovery (``mapper``) is the only read
made with the controller's identity.

Invariant: a stage whose objects the tenant may not write changes nothing.  All
objects whose kinds are already served are server-side dry-run first; any denial
or validation error fails the stage before the first real write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from stageset.apply.ownership import FIELD_MANAGER, StageOwner, label_object
from stageset.apply.plan import describe, phases
from stageset.apply.readiness import Readiness, Status, readiness
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import Resource, RestMapper, UnknownKindError
from stageset.kube.types import KubeObject


class StageError(Exception):
    """The stage cannot be applied; ``reason`` is the Ready condition reason to report."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class AppliedObject:
    resource: Resource
    path: str
    manifest: KubeObject
    live: KubeObject = field(default_factory=dict)


@dataclass(frozen=True)
class ApplySettings:
    parallelism: int = 4
    poll_interval: float = 0.5
    crd_timeout: float = 60.0


def _resolve(mapper: RestMapper, obj: KubeObject, default_namespace: str) -> AppliedObject | None:
    """Bind an object to its REST path; ``None`` when its kind is not served yet."""
    try:
        resource = mapper.for_object(obj)
    except UnknownKindError:
        return None
    manifest = obj
    if resource.namespaced and not obj["metadata"].get("namespace"):
        manifest = {**obj, "metadata": {**obj["metadata"], "namespace": default_namespace}}
    if not resource.namespaced and obj["metadata"].get("namespace"):
        manifest = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "namespace"}}
    path = resource.object_path(name=manifest["metadata"]["name"],
                                namespace=manifest["metadata"].get("namespace"))
    return AppliedObject(resource=resource, path=path, manifest=manifest)


def _error_for(item: AppliedObject, error: ApiError, identity: str) -> StageError:
    what = describe(item.manifest)
    if error.forbidden:
        return StageError("RBACDenied", f"{identity} may not apply {what}: {error.message}")
    if error.invalid:
        return StageError("StageFailed", f"{what} is invalid: {error.message}")
    return StageError("StageFailed", f"applying {what} failed: {error.status} {error.message}")


class StageApplier:
    """Applies stages; one instance is shared by all workers (it holds only settings)."""

    def __init__(self, *, mapper: RestMapper, settings: ApplySettings | None = None):
        self._mapper = mapper
        self._settings = settings or ApplySettings()

    def _each(self, items: list[AppliedObject], action: Callable[[AppliedObject], None]) -> None:
        if len(items) <= 1:
            for item in items:
                action(item)
            return
        with ThreadPoolExecutor(max_workers=self._settings.parallelism) as pool:
            for future in [pool.submit(action, item) for item in items]:
                future.result()

    def _dry_run(self, client: KubeClient, items: list[AppliedObject]) -> None:
        failures: list[StageError] = []
        lock = threading.Lock()

        def dry_run(item: AppliedObject) -> None:
            try:
                client.apply(item.path, item.manifest, field_manager=FIELD_MANAGER, dry_run=True)
            except ApiError as error:
                with lock:
                    failures.append(_error_for(item, error, client.identity.describe()))

        self._each(items, dry_run)
        if failures:
            denied = [f for f in failures if f.reason == "RBACDenied"]
            first = (denied or failures)[0]
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise StageError(first.reason, first.message + more)

    def _apply(self, client: KubeClient, items: list[AppliedObject]) -> None:
        def apply(item: AppliedObject) -> None:
            try:
                item.live = client.apply(item.path, item.manifest, field_manager=FIELD_MANAGER)
            except ApiError as error:
                raise _error_for(item, error, client.identity.describe()) from error

        self._each(items, apply)

    def _wait_established(self, client: KubeClient, items: list[AppliedObject]) -> None:
        crds = [i for i in items if i.manifest.get("kind") == "CustomResourceDefinition"]
        deadline = time.monotonic() + self._settings.crd_timeout
        for crd in crds:
            while True:
                verdict = readiness(client.get(crd.path))
                if verdict.status is Status.CURRENT:
                    break
                if verdict.status is Status.FAILED or time.monotonic() > deadline:
                    raise StageError("StageFailed", f"{describe(crd.manifest)}: {verdict.message}")
                time.sleep(self._settings.poll_interval)

    def apply(self, *, client: KubeClient, owner: StageOwner, objects: list[KubeObject],
              default_namespace: str) -> list[AppliedObject]:
        """Apply ``objects`` as ``client``'s identity; raise :class:`StageError` on failure."""
        labelled = [label_object(obj, owner) for obj in objects]
        planned = [_resolve(self._mapper, obj, default_namespace) for obj in labelled]
        self._dry_run(client, [p for p in planned if p is not None])
        applied: list[AppliedObject] = []
        for phase in phases(labelled):
            items: list[AppliedObject] = []
            for obj in phase:
                item = _resolve(self._mapper, obj, default_namespace)
                if item is None:
                    raise StageError("StageFailed", f"{describe(obj)}: the cluster serves no kind "
                                     f"{obj.get('kind')} in {obj.get('apiVersion')}")
                items.append(item)
            self._apply(client, items)
            self._wait_established(client, items)
            applied.extend(items)
        return applied

    def wait_ready(self, *, client: KubeClient, applied: list[AppliedObject], timeout: float,
                   stop: threading.Event) -> Readiness:
        """Poll until every object is Current, one Failed, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        pending = list(applied)
        while True:
            still: list[AppliedObject] = []
            last = Readiness(Status.CURRENT)
            for item in pending:
                try:
                    live = client.get(item.path)
                except ApiError as error:
                    if error.not_found:
                        still.append(item)
                        last = Readiness(Status.IN_PROGRESS, f"{describe(item.manifest)} not found")
                        continue
                    raise
                verdict = readiness(live)
                if verdict.status is Status.FAILED:
                    return Readiness(Status.FAILED, f"{describe(item.manifest)}: {verdict.message}")
                if verdict.status is Status.IN_PROGRESS:
                    still.append(item)
                    last = Readiness(Status.IN_PROGRESS, f"{describe(item.manifest)}: {verdict.message}")
            if not still:
                return Readiness(Status.CURRENT)
            if time.monotonic() >= deadline or stop.is_set():
                return last
            pending = still
            stop.wait(self._settings.poll_interval)
