"""One attempt of one action, as far as one slice of time allows: the six verbs.

**Identity.**  Every request acts as the **stage's identity** (:mod:`stageset.controller.identity`:
the stage's ServiceAccount, impersonated; the controller itself only in single-tenant mode),
carried in :class:`ActionContext`:

- on the stage's **target cluster** (``spec.kubeConfig``, else this one): the Jobs of a ``job`` action
  (create, list, delete), the objects a ``patch``, ``delete`` or ``apply`` action writes, the object a
  ``wait`` reads;
- on **this cluster**, where the StageSet lives: the sources of ``job`` and ``apply`` actions (read by
  the stage :class:`~stageset.controller.stageset.rendering.Renderer`, as a stage's own source), and
  the Secrets of an ``http`` action's ``headersFrom`` / ``bodyFrom``.

The controller's own identity makes no request here (discovery aside, which only says which kinds
exist).  Secret values are added to the pass's redactor before the request that uses them, so no
message built afterwards — status, event, log — can carry them.

**What a failure quotes.**  Of what someone else wrote — an endpoint's response body, the
apiserver's message, a Job's condition — a message quotes at most :data:`_SNIPPET` printable
characters, redacted before they are cut (:func:`_excerpt`).  Of an ``http`` action's response: the
status code, and the excerpt only when the request carried nothing from a Secret (:func:`_answer`;
an endpoint may echo a header in a way no redactor can know).

**Bounds.**  A step waits at most its ``budget`` (one readiness slice, never past the action's
timeout), then says ``PENDING``; the stage comes back after the readiness requeue, so a slow action
holds only its own StageSet, and a worker never longer than a slice.  One HTTP request takes at most
:data:`~stageset.controller.stageset.actionplan.HTTP_ATTEMPT_CAP` seconds.  An ``http`` action's URL
must name a host ``--allowed-action-hosts`` lists (checked again at every redirect) and passes the
address guard of artifact downloads (:class:`sources.addresses.AddressGuard`: loopback, link-local,
metadata refused at every connection; off only with ``--allow-insecure-sources``).

**Jobs.**  A ``job`` action's Jobs are named by :func:`~stageset.controller.stageset.actionplan.job_name`
and labelled with the action (``stages.metio.wtf/action``), the revision
(``stages.metio.wtf/action-revision``) and the run (``stages.metio.wtf/action-run``).  Before it
creates anything, a step looks at what the cluster holds: a run still going is awaited, a run that
completed counts as done, so a restart between "created" and "recorded" never creates a second
migration.  Jobs of older revisions are deleted when the action runs for a new one; the last ones
stay for their logs (``ttlSecondsAfterFinished`` defaults to a day).
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import quote, urlsplit

from sources.addresses import AddressGuard, AddressRefusedError
from sources.download import call, display
from sources.errors import SourceError, UrlPolicyError
from stageset.api import SourceRef, Stage, duration_seconds
from stageset.api.actions import Action, ActionLedger, ActionRun, Hook, SecretKey, TargetRef
from stageset.api.vocabulary import Reason
from stageset.apply.cel import CelSandbox, CelUnavailableError, LimitExceededError
from stageset.apply.claims import Claims
from stageset.apply.errors import StageError
from stageset.apply.health import variables as cel_variables
from stageset.apply.inventory import describe, object_id
from stageset.apply.ownership import holder
from stageset.apply.plan import phases
from stageset.apply.readiness import Status
from stageset.controller.accounts import read_named
from stageset.controller.clock import Clock
from stageset.controller.redact import Redactor, bounded
from stageset.controller.stageset import actionplan
from stageset.controller.stageset.rendering import Renderer
from stageset.controller.targets.clusters import Target
from stageset.kube import fence
from stageset.kube.client import ApiError, Identity, KubeClient, UnreachableError
from stageset.kube.mapping import Resource
from stageset.kube.types import KubeObject

ACTION_LABEL = "stages.metio.wtf/action"
REVISION_LABEL = "stages.metio.wtf/action-revision"
RUN_LABEL = "stages.metio.wtf/action-run"
ACTION_ANNOTATION = "stages.metio.wtf/action-name"
FIELD_MANAGER = "stageset-actions"
JOB_TTL = 24 * 3600
"""``ttlSecondsAfterFinished`` of an action's Job that sets none."""
_SNIPPET = 256
"""Characters a message quotes of a text someone else wrote (:func:`_excerpt`)."""
_BODY_READ = 4096
"""Bytes of a response body read for its excerpt: redacted whole, then cut to :data:`_SNIPPET`."""
_MIN_WORD = 8
_JOB = ("batch/v1", "Job")


class Kind(Enum):
    DONE = "done"
    PENDING = "pending"
    FAILED = "failed"


@dataclass(frozen=True)
class Step:
    """How one step of an attempt ended."""

    kind: Kind
    message: str = ""
    retryable: bool = True
    """A failure worth another attempt (a refusal, a denial or a 4xx is not)."""
    reason: Reason = Reason.ACTION_FAILED
    run: int | None = None
    """How far the attempt got (:attr:`ActionRun.run`), to carry into the next step."""

    @classmethod
    def done(cls, message: str = "", run: int | None = None) -> Step:
        return cls(Kind.DONE, message, run=run)

    @classmethod
    def pending(cls, message: str, run: int | None = None) -> Step:
        return cls(Kind.PENDING, message, run=run)

    @classmethod
    def failed(cls, message: str, *, retryable: bool = True, reason: Reason = Reason.ACTION_FAILED,
               run: int | None = None) -> Step:
        return cls(Kind.FAILED, message, retryable=retryable, reason=reason, run=run)


@dataclass(frozen=True)
class ActionContext:
    """Everything one step works with.  ``client`` acts as the stage's identity on its target
    cluster, ``local`` as the same identity on this cluster (Secrets)."""

    namespace: str
    stageset: str
    stage: Stage
    hook: Hook
    action: Action
    ledger: ActionLedger
    running: ActionRun
    identity: Identity
    client: KubeClient
    local: KubeClient
    target: Target
    redactor: Redactor
    claims: Claims
    """Whether another StageSet still holds an object (an ``apply`` action writes none it holds)."""
    deadline: float
    """Monotonic seconds: the step returns by then."""
    timeout: float
    """The action's whole timeout (seconds), for an HTTP request's own bound."""
    fresh_runs: bool = False
    """``onFailure``: a Job run that completed earlier does not count; every failure starts one."""

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True)
class StepSettings:
    allowed_hosts: tuple[str, ...] = ()
    """``--allowed-action-hosts``: the hosts an ``http`` action may call; none when empty."""
    guard: AddressGuard = field(default_factory=lambda: AddressGuard(purpose="actions", verb="call"))
    poll_interval: float = 0.5
    ca_certs: str | None = None


def _excerpt(text: str, redact: Redactor, *, cut: bool = False) -> str:
    """What a message quotes of a text someone else wrote (an endpoint, the apiserver, a Job's
    condition): redacted whole first (``cut``: it was cut already, so a start of a value at its end
    goes too), then printable characters only, on one line, at most :data:`_SNIPPET` characters."""
    text = redact(text, cut=cut)
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return bounded(text, limit=_SNIPPET, redact=redact)


def _answer(body: bytes, *, carried_secrets: bool, redact: Redactor) -> str:
    """What a failure says of the response's body.  Nothing when the request carried a Secret's
    value: an endpoint may echo it in a way no redactor knows (reversed, hashed, encoded twice),
    and the status code is what a user acts on; otherwise an :func:`_excerpt` of its first
    :data:`_BODY_READ` bytes."""
    if carried_secrets:
        return "the response is not shown, as the request carried values from a Secret"
    if not body:
        return "(empty)"
    text = body[:_BODY_READ].decode("utf-8", errors="replace")
    return _excerpt(text, redact, cut=len(body) > _BODY_READ) or "(empty)"


def _denied(error: StageError | ApiError, what: str, identity: Identity) -> Step:
    message = error.message if isinstance(error, StageError) else \
        f"{identity.describe()} may not {what}: {error.message}"
    return Step.failed(message, retryable=False, reason=Reason.RBAC_DENIED)


def _api_failure(error: ApiError, what: str, ctx: ActionContext) -> Step:
    if error.forbidden:
        return _denied(error, what, ctx.identity)
    # 400/422: the request itself is wrong and stays wrong; anything else may pass next time.
    retryable = error.status not in (400, 415, 422)
    said = _excerpt(error.message, ctx.redactor)
    return Step.failed(f"{what}: the apiserver {error.answered}: {said}", retryable=retryable)


class ActionRunner:
    """Runs steps of actions; one instance is shared by every StageSet (it holds only settings)."""

    def __init__(self, *, renderer: Renderer, sandbox: CelSandbox, clock: Clock, stop: threading.Event,
                 settings: StepSettings):
        self._renderer = renderer
        self._sandbox = sandbox
        self._clock = clock
        self._stop = stop
        self._settings = settings
        self._verbs: dict[str, Callable[[ActionContext], Step]] = {
            "job": self._job, "http": self._http, "wait": self._wait, "patch": self._patch,
            "delete": self._delete, "apply": self._apply}

    def step(self, ctx: ActionContext) -> Step:
        """One step of the action in progress; never raises for what the tenant or the cluster did."""
        try:
            return self._verbs[ctx.action.verb](ctx)
        except StageError as error:
            # The renderer names the stage first; the caller names the stage and the action.
            message = error.message.removeprefix(f"stage {ctx.stage.name!r}: ")
            if error.reason in (Reason.SOURCE_NOT_READY, Reason.ARTIFACT_NOT_FOUND):
                return Step.pending(message)  # the action's source is on its way; its timeout runs
            return Step.failed(message, retryable=error.reason not in (
                Reason.RBAC_DENIED, Reason.INVALID_SPEC, Reason.RESOLVE_FAILED), reason=error.reason)
        except UnreachableError as error:
            return Step.failed(f"the cluster at {error.server} cannot be used: {error.why}")

    # -- helpers ---------------------------------------------------------------------------------

    def _sleep(self, ctx: ActionContext, seconds: float) -> bool:
        """Wait ``seconds`` (at most what the step has left); ``False`` when the controller stops."""
        return not self._stop.wait(max(0.0, min(seconds, ctx.left())))

    def _resource(self, ctx: ActionContext, ref: TargetRef | dict[str, Any]) -> tuple[KubeObject, Resource]:
        stub: KubeObject = ref if isinstance(ref, dict) else {
            "apiVersion": ref.api_version_or_core, "kind": ref.kind,
            "metadata": {"name": ref.name, "namespace": ref.namespace or ctx.namespace}}
        manifest, resource = ctx.target.applier.resolve(stub, ctx.namespace)
        if resource is None:
            raise StageError(Reason.ACTION_FAILED, f"the cluster serves no kind {stub.get('kind')} in "
                             f"{stub.get('apiVersion')}")
        return manifest, resource

    def _render(self, ctx: ActionContext, source_ref: SourceRef, path: str) -> list[KubeObject]:
        """The objects at ``path`` of the action's source, read and built as a stage's own source is."""
        stage = Stage(name=ctx.stage.name, source_ref=source_ref, path=path)
        rendered = self._renderer.render(stage=stage, identity=ctx.identity, namespace=ctx.namespace,
                                         target=ctx.target, redactor=ctx.redactor)
        return rendered.objects

    def _secret(self, ctx: ActionContext, ref: SecretKey) -> bytes:
        path = f"/api/v1/namespaces/{ctx.namespace}/secrets/{quote(ref.name)}"
        what = f"Secret {ctx.namespace}/{ref.name}"
        secret = read_named(ctx.local, path, what=what, missing_reason=Reason.ACTION_FAILED)
        encoded = (secret.get("data") or {}).get(ref.key)
        if encoded is None:
            raise StageError(Reason.ACTION_FAILED, f"{what} has no key {ref.key!r}")
        try:
            value = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise StageError(Reason.ACTION_FAILED, f"{what}: key {ref.key!r} is not base64") from None
        text = value.decode("utf-8", errors="replace")
        # The value, each of its lines, and each long word of it: an endpoint that echoes only the token
        # of "Bearer <token>" must not show it either.
        ctx.redactor.add([text, *(line for line in text.splitlines() if line.strip()),
                          *(word for word in text.split() if len(word) >= _MIN_WORD)])
        return value

    # -- job ---------------------------------------------------------------------------------------

    def _list_jobs(self, ctx: ActionContext, resource: Resource, namespaces: list[str], label: str
                   ) -> list[KubeObject]:
        found: list[KubeObject] = []
        for namespace in namespaces:
            try:
                listed = ctx.client.request("GET", resource.collection_path(namespace),
                                            query={"labelSelector": f"{ACTION_LABEL}={label}"})
            except ApiError as error:
                raise StageError(Reason.RBAC_DENIED if error.forbidden else Reason.ACTION_FAILED,
                                 f"{ctx.identity.describe()} may not list Jobs in namespace {namespace}: "
                                 f"{error.message}" if error.forbidden else
                                 f"listing Jobs in namespace {namespace}: {error.message}") from error
            found.extend(listed.get("items") or [])
        return found

    def _job(self, ctx: ActionContext) -> Step:
        assert ctx.action.job is not None
        objects = self._render(ctx, ctx.action.job.source_ref, ctx.action.job.path)
        others = [describe(o) for o in objects if (o.get("apiVersion"), o.get("kind")) != _JOB]
        if not objects or others:
            what = f"holds {', '.join(others[:3])}" if others else "renders nothing"
            return Step.failed(f"the job source {what}; a job action creates Jobs (batch/v1) only",
                               retryable=False, reason=Reason.INVALID_SPEC)
        _, resource = self._resource(ctx, objects[0])
        namespaces = sorted({str(o["metadata"].get("namespace") or ctx.namespace) for o in objects})
        label = actionplan.action_label(namespace=ctx.namespace, stageset=ctx.stageset, stage=ctx.stage.name,
                                        hook=ctx.hook, action=ctx.action.name)
        revision = actionplan.revision_label(ctx.ledger)
        jobs = self._list_jobs(ctx, resource, namespaces, label)
        self._delete_older(ctx, resource, jobs, revision)
        runs: dict[int, list[KubeObject]] = {}
        for job in jobs:
            labels = job["metadata"].get("labels") or {}
            if labels.get(REVISION_LABEL) == revision and str(labels.get(RUN_LABEL, "")).isdigit():
                runs.setdefault(int(labels[RUN_LABEL]), []).append(job)
        run = ctx.running.run
        if run is None:
            complete = [n for n, group in runs.items() if len(group) >= len(objects) and all(
                _job_state(j)[0] == "complete" for j in group)]
            going = [n for n, group in runs.items() if any(_job_state(j)[0] == "running" for j in group)]
            if complete and not ctx.fresh_runs:
                return Step.done(f"its Jobs completed for this revision already (run {max(complete)})",
                                 run=max(complete))
            run = max(going) if going else max(runs, default=-1) + 1
        if run not in runs:
            created = self._create_jobs(ctx, resource, objects, label=label, revision=revision, run=run)
            if created is not None:
                return created
        while True:
            group = self._list_jobs(ctx, resource, namespaces, label)
            mine = [j for j in group if (j["metadata"].get("labels") or {}).get(REVISION_LABEL) == revision
                    and str((j["metadata"].get("labels") or {}).get(RUN_LABEL)) == str(run)]
            states = [(j, *_job_state(j)) for j in mine]
            failed = [(j, why) for j, state, why in states if state == "failed"]
            if failed:
                job, why = failed[0]
                return Step.failed(f"Job {job['metadata'].get('namespace')}/{job['metadata']['name']} failed"
                                   + (f": {_excerpt(why, ctx.redactor)}" if why else ""), run=run)
            if mine and all(state == "complete" for _, state, _ in states):
                names = ", ".join(sorted(str(j["metadata"]["name"]) for j in mine))
                return Step.done(f"Job(s) {names} completed", run=run)
            if not mine:
                return Step.pending(f"its Jobs (run {run}) are gone; creating them again", run=None)
            waiting = next(j for j, state, _ in states if state != "complete")
            done = sum(state == "complete" for _, state, _ in states)
            message = (f"Job {waiting['metadata'].get('namespace')}/{waiting['metadata']['name']} has not "
                       f"completed yet ({done} of {len(mine)} done)")
            if ctx.left() <= 0 or not self._sleep(ctx, self._settings.poll_interval):
                return Step.pending(message, run=run)

    def _create_jobs(self, ctx: ActionContext, resource: Resource, objects: list[KubeObject], *, label: str,
                     revision: str, run: int) -> Step | None:
        for obj in objects:
            meta = obj["metadata"]
            namespace = str(meta.get("namespace") or ctx.namespace)
            name = actionplan.job_name(str(meta["name"]), action=label, revision=revision, run=run)
            spec = dict(obj.get("spec") or {})
            spec.setdefault("ttlSecondsAfterFinished", JOB_TTL)
            manifest = {**obj, "spec": spec, "metadata": {
                **meta, "name": name, "namespace": namespace,
                "labels": {**(meta.get("labels") or {}), ACTION_LABEL: label, REVISION_LABEL: revision,
                           RUN_LABEL: str(run)},
                "annotations": {**(meta.get("annotations") or {}),
                                ACTION_ANNOTATION: f"{ctx.stageset}/{ctx.stage.name}/{ctx.hook.value}/"
                                                   f"{ctx.action.name}",
                                "stages.metio.wtf/revision": ctx.ledger.revision}}}
            try:
                ctx.client.request("POST", resource.collection_path(namespace), body=manifest)
            except ApiError as error:
                if error.conflict and error.reason == "AlreadyExists":
                    continue  # created by an earlier step that did not get to record it
                return _api_failure(error, f"create Job {namespace}/{name}", ctx)
        return None

    def _delete_older(self, ctx: ActionContext, resource: Resource, jobs: list[KubeObject],
                      revision: str) -> None:
        """Jobs this action created for earlier revisions: no longer anyone's record (best effort)."""
        for job in jobs:
            meta = job["metadata"]
            if (meta.get("labels") or {}).get(REVISION_LABEL) == revision:
                continue
            try:
                ctx.client.delete(resource.object_path(name=meta["name"], namespace=meta.get("namespace")),
                                  propagation="Background")
            except ApiError:
                continue

    # -- http --------------------------------------------------------------------------------------

    def _http(self, ctx: ActionContext) -> Step:
        http = ctx.action.http
        assert http is not None
        allowed = self._settings.allowed_hosts

        def check(url: str) -> None:
            host = urlsplit(url).hostname or ""
            if not actionplan.host_allowed(host, allowed):
                listed = f"lists {', '.join(allowed)}" if allowed else "is empty: no host is allowed"
                raise UrlPolicyError(f"{display(url)}: host {host} is not allowed for actions (the "
                                     "controller's "
                                     f"--allowed-action-hosts {listed}); ask the platform team to add it")

        try:
            check(http.url)
        except UrlPolicyError as error:
            return Step.failed(str(error), retryable=False)
        headers: dict[str, str] = {}
        for ref in http.headers_from:
            value = self._secret(ctx, ref).decode("utf-8", errors="replace")
            if "\r" in value or "\n" in value:
                return Step.failed(f"Secret {ctx.namespace}/{ref.name}: key {ref.key!r} holds a line break, "
                                   "which a header may not", retryable=False)
            headers[ref.key] = value
        body = self._secret(ctx, http.body_from) if http.body_from is not None else \
            http.body.encode() if http.body is not None else None
        if body is not None and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json" if _is_json(body) else "text/plain; charset=utf-8"
        timeout = max(0.1, min(actionplan.HTTP_ATTEMPT_CAP, ctx.timeout - actionplan.elapsed(
            ctx.running, now=self._clock())))
        what = f"{http.method} {display(http.url)}"
        fence.check()  # not when the StageSet left this shard meanwhile (controller/handoff.py)
        try:
            answer = call(http.url, method=http.method, guard=self._settings.guard, timeout=timeout,
                          headers=headers, body=body, check=check, same_origin=http.carries_secrets,
                          ca_certs=self._settings.ca_certs, cancel=self._stop)
        except (AddressRefusedError, UrlPolicyError) as error:
            return Step.failed(f"{what}: {error}", retryable=False)
        except SourceError as error:
            return Step.failed(f"{what}: {error}")
        if http.accepts(answer.status):
            return Step.done(f"{what}: HTTP {answer.status}")
        expected = ", ".join(str(s) for s in http.expected_status) or "2xx"
        said = _answer(answer.body, carried_secrets=http.carries_secrets, redact=ctx.redactor)
        return Step.failed(f"{what} answered HTTP {answer.status}, expected {expected}: {said}",
                           retryable=actionplan.http_retryable(answer.status))

    # -- wait --------------------------------------------------------------------------------------

    def _wait(self, ctx: ActionContext) -> Step:
        wait = ctx.action.wait
        assert wait is not None
        if wait.duration is not None:
            total = duration_seconds(wait.duration)
            left = total - actionplan.elapsed(ctx.running, now=self._clock())
            if left > 0 and left <= ctx.left():
                self._sleep(ctx, left)
                left = total - actionplan.elapsed(ctx.running, now=self._clock())
            if left <= 0:
                return Step.done(f"waited {wait.duration}")
            return Step.pending(f"waiting {left:.0f}s more of {wait.duration}")
        assert wait.target is not None
        assert wait.expr is not None
        _, resource = self._resource(ctx, wait.target)
        namespace = wait.target.namespace or ctx.namespace
        path = resource.object_path(name=wait.target.name,
                                    namespace=namespace if resource.namespaced else None)
        what = f"{wait.target.kind} {namespace}/{wait.target.name}" if resource.namespaced \
            else f"{wait.target.kind} {wait.target.name}"
        while True:
            try:
                obj: KubeObject | None = ctx.client.get(path)
            except ApiError as error:
                if error.forbidden:
                    return _denied(error, f"read {what}", ctx.identity)
                if not error.not_found:
                    return _api_failure(error, f"reading {what}", ctx)
                obj = None
            if obj is None:
                message = f"{what} not found"
            else:
                try:
                    (answer,) = self._sandbox.evaluate([wait.expr], cel_variables(obj))
                except LimitExceededError:
                    return Step.failed(f"wait.expr on {what} took too long or too much memory",
                                       retryable=False, reason=Reason.INVALID_SPEC)
                except CelUnavailableError as error:
                    return Step.failed(f"CEL evaluation unavailable: {error}")
                if answer.type is not None:
                    return Step.failed(f"wait.expr returned {answer.type}, not bool, for {what}",
                                       retryable=False, reason=Reason.INVALID_SPEC)
                if answer.value:
                    return Step.done(f"{wait.expr} holds on {what}")
                message = f"{wait.expr} does not hold on {what} yet" + (
                    f" ({_excerpt(answer.error, ctx.redactor)})" if answer.error else "")
            if ctx.left() <= 0 or not self._sleep(ctx, self._settings.poll_interval):
                return Step.pending(message)

    # -- patch, delete -----------------------------------------------------------------------------

    def _patch(self, ctx: ActionContext) -> Step:
        patch = ctx.action.patch
        assert patch is not None
        target = patch.target
        stub: KubeObject = {"apiVersion": target.api_version_or_core, "kind": target.kind,
                            "metadata": {"name": target.name or "-",
                                         "namespace": target.namespace or ctx.namespace}}
        manifest, resource = self._resource(ctx, stub)
        namespace = manifest["metadata"].get("namespace")
        if target.selector is not None:
            query = target.selector.query()
            try:
                listed = ctx.client.request("GET", resource.collection_path(namespace),
                                            query={"labelSelector": query})
            except ApiError as error:
                return _api_failure(error, f"list {target.kind} ({query})", ctx)
            paths = [resource.object_path(name=o["metadata"]["name"], namespace=namespace)
                     for o in listed.get("items") or []]
        else:
            paths = [resource.object_path(name=str(target.name), namespace=namespace)]
        body = patch.body()
        for path in paths:
            name = path.rsplit("/", 1)[-1]
            kinds = ["application/json-patch+json"] if patch.type == "json6902" else \
                ["application/strategic-merge-patch+json", "application/merge-patch+json"]
            for number, content_type in enumerate(kinds):
                try:
                    ctx.client.request("PATCH", path, body=body, content_type=content_type)
                    break
                except ApiError as error:
                    if error.status == 415 and number + 1 < len(kinds):
                        continue  # a custom resource has no strategic merge: a JSON merge patch
                    if error.not_found:
                        return Step.failed(f"{target.kind} {name} not found")
                    return _api_failure(error, f"patch {target.kind} {name}", ctx)
        return Step.done(f"patched {len(paths)} {target.kind} object(s)")

    def _delete(self, ctx: ActionContext) -> Step:
        delete = ctx.action.delete
        assert delete is not None
        manifest, resource = self._resource(ctx, delete.target)
        path = resource.object_path(name=delete.target.name, namespace=manifest["metadata"].get("namespace"))
        what = f"{delete.target.kind} {delete.target.name}"
        try:
            ctx.client.delete(path, propagation=delete.cascade or "Background")
        except ApiError as error:
            if error.not_found:
                return Step.done(f"{what} was not there")
            return _api_failure(error, f"delete {what}", ctx)
        return Step.done(f"deleted {what}")

    # -- apply -------------------------------------------------------------------------------------

    def _held(self, ctx: ActionContext, objects: list[KubeObject]) -> Step | None:
        """``OwnershipConflict`` when another live StageSet holds an object the ``apply`` action would
        write — its owner labels name it, and it still lists the object on this target: a stage's own
        rule (:mod:`~stageset.controller.stageset.claims`) — before anything is written.  Each object
        of a kind served now is read as the stage's identity (a denied read is a denial: what cannot
        be judged is never written); one of a kind not served yet exists nowhere."""
        for obj in objects:
            manifest, resource = ctx.target.applier.resolve(obj, ctx.namespace)
            if resource is None:
                continue
            path = resource.object_path(name=manifest["metadata"]["name"],
                                        namespace=manifest["metadata"].get("namespace"))
            try:
                live = ctx.client.get(path)
            except ApiError as error:
                if error.not_found:
                    continue
                return _api_failure(error, f"read {describe(manifest)}", ctx)
            found = holder(live)
            if found is None:
                continue
            oid = object_id(manifest)
            if (claim := ctx.claims.claim(holder=found, oid=oid)) is not None:
                return Step.failed(f"{oid.describe()} is held by {claim.holder}, which still applies it; an "
                                   "apply action writes no object another StageSet holds (nothing was "
                                   "written)", retryable=False, reason=Reason.OWNERSHIP_CONFLICT)
        return None

    def _apply(self, ctx: ActionContext) -> Step:
        apply = ctx.action.apply
        assert apply is not None
        objects = self._render(ctx, apply.source_ref, apply.path)
        label = actionplan.action_label(namespace=ctx.namespace, stageset=ctx.stageset, stage=ctx.stage.name,
                                        hook=ctx.hook, action=ctx.action.name)
        if ctx.running.run is None and (held := self._held(ctx, objects)) is not None:
            return held
        bound: list[KubeObject] = []
        for phase in phases(objects):
            for obj in phase:
                meta = obj["metadata"]
                labelled = {**obj, "metadata": {**meta, "labels": {**(meta.get("labels") or {}),
                                                                    ACTION_LABEL: label}}}
                manifest, resource = self._resource(ctx, labelled)
                bound.append(manifest)
                if ctx.running.run is not None:
                    continue  # applied in an earlier step of this attempt: only waited for now
                path = resource.object_path(name=manifest["metadata"]["name"],
                                            namespace=manifest["metadata"].get("namespace"))
                try:
                    ctx.client.apply(path, manifest, field_manager=FIELD_MANAGER)
                except ApiError as error:
                    return _api_failure(error, f"apply {describe(manifest)}", ctx)
        if not apply.wait:
            return Step.done(f"applied {len(bound)} object(s)", run=1)
        items = [item for m in bound if (item := ctx.target.applier.reference(m, ctx.namespace)) is not None]
        readiness = ctx.target.applier.wait_ready(client=ctx.client, applied=items, timeout=ctx.left(),
                                                  stop=self._stop)
        if readiness.status is Status.CURRENT:
            return Step.done(f"applied {len(bound)} object(s), ready", run=1)
        if readiness.status is Status.FAILED:
            return Step.failed(readiness.message, run=1)
        return Step.pending(readiness.message, run=1)


def _job_state(job: KubeObject) -> tuple[str, str]:
    """``("complete" | "failed" | "running", why)`` from a Job's conditions (the job controller's)."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "complete", ""
        if condition.get("type") == "Failed":
            why = f"{condition.get('reason') or ''}: {condition.get('message') or ''}".strip(": ")
            return "failed", why
    return "running", ""


def _is_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except ValueError:
        return False
    return True
