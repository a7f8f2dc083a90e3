"""The dashboard's actions: reconcile (with its sources), suspend, resume, promote, update now.

Off unless ``stageset dashboard --allow-actions``; then, and only then, the StageSet page shows
their buttons and the server accepts ``POST /stagesets/NAMESPACE/NAME/actions/VERB``.

Identity: each request is made with **the viewer's kubeconfig** (the same credentials the
dashboard reads with; never impersonating, never a ServiceAccount of its own), through the
CLI's own implementation of the verb (:mod:`stageset.cli.steer`, :mod:`stageset.cli.promote`),
so RBAC decides exactly as for ``stageset reconcile``/``suspend``/``resume``/``promote``: a viewer
who may not ``patch`` the StageSet is refused by the apiserver, the page says so, and nothing is
written.

Cross-site requests (:class:`Guard`): a ``POST`` is refused (403, nothing sent to the cluster)
unless its ``Origin`` is this dashboard's own (the ``Host`` it was asked by; a browser always
sends ``Origin`` on a form post, and a ``Sec-Fetch-Site`` other than ``same-origin`` is refused
too) **and** it carries the session's token: a random session id in an ``HttpOnly``,
``SameSite=Strict`` cookie, and in each form an HMAC of it under a key made when the dashboard
started — so neither a page on another origin nor one on another port of the same host can make
the viewer's browser act.

Every action is logged (one line on the dashboard's stderr: who, what, outcome) and kept, newest
first, :data:`KEPT` per StageSet, for the page's activity list.  Nothing of a Secret is involved:
the requests carry annotations and ``spec.suspend`` only.
"""

from __future__ import annotations

import collections
import datetime
import hashlib
import hmac
import secrets
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from stageset.cli.promote import request_promotion
from stageset.cli.session import CliError, describe_api_error
from stageset.cli.steer import request_reconcile, request_sources, request_stamp, resume_one, suspend_one
from stageset.controller.kinds import STAGESETS
from stageset.kube.client import ApiError, KubeClient, UnreachableError

COOKIE = "stageset-dashboard-session"
KEPT = 50  # actions kept per StageSet


class Verb(StrEnum):
    RECONCILE = "reconcile"
    RECONCILE_WITH_SOURCE = "reconcile-with-source"
    SUSPEND = "suspend"
    RESUME = "resume"
    PROMOTE = "promote"
    UPDATE_NOW = "update-now"


class Refusal(StrEnum):
    """Why a ``POST`` was refused before anything was asked of the cluster."""

    CROSS_ORIGIN = "cross-origin request"
    NO_SESSION = "no dashboard session (reload the page)"
    BAD_TOKEN = "the form's token does not match this session (reload the page)"  # noqa: S105 - a reason


@dataclass(frozen=True)
class Done:
    """One action, as the activity list shows it."""

    when: str
    verb: Verb
    stage: str | None
    ok: bool
    message: str


class Guard:
    """Same-origin check and per-session tokens (the key lives as long as the process)."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    def token(self, session: str) -> str:
        return hmac.new(self._key, session.encode(), hashlib.sha256).hexdigest()

    def refusal(self, *, headers: Mapping[str, str], scheme: str, session: str | None,
                token: str | None) -> Refusal | None:
        """Why a ``POST`` with these headers, session cookie and form token is refused (``None``:
        it is not)."""
        if not same_origin(headers=headers, scheme=scheme):
            return Refusal.CROSS_ORIGIN
        if not session:
            return Refusal.NO_SESSION
        if not token or not hmac.compare_digest(token, self.token(session)):
            return Refusal.BAD_TOKEN
        return None


def same_origin(*, headers: Mapping[str, str], scheme: str) -> bool:
    """Whether a ``POST`` with these headers comes from a page of this very origin: its ``Origin``
    names the scheme and ``Host`` it was sent to, and ``Sec-Fetch-Site`` (when sent) agrees."""
    origin, host = headers.get("origin"), headers.get("host")
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site != "same-origin":
        return False
    if not origin or not host:
        return False
    parts = urlsplit(origin)
    return parts.scheme == scheme and parts.netloc == host


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def perform(client: KubeClient, verb: Verb, *, namespace: str, name: str, stage: str | None
            ) -> tuple[bool, str]:
    """Do ``verb`` to StageSet ``namespace/name`` as ``client`` (the viewer's); whether the cluster
    accepted it, and what to say.  Each verb is the CLI's own request(s)."""
    path = STAGESETS.object_path(name=name, namespace=namespace)
    try:
        obj = client.get(path)
        suspended = bool((obj.get("spec") or {}).get("suspend"))
        stamp = request_stamp()
        if verb in (Verb.RECONCILE, Verb.RECONCILE_WITH_SOURCE, Verb.UPDATE_NOW):
            if suspended:
                return False, "suspended: resume it to reconcile it"
            fetched = request_sources(client, obj, stamp) if verb is Verb.RECONCILE_WITH_SOURCE else []
            request_reconcile(client, STAGESETS, namespace, name, stamp,
                              update_now=verb is Verb.UPDATE_NOW)
            sources = f" and a fetch of {', '.join(f'{ns}/{n}' for ns, n in fetched)}" if fetched else ""
            held = "; held revisions ship now" if verb is Verb.UPDATE_NOW else ""
            return True, f"requested a reconcile{sources}{held}"
        if verb is Verb.SUSPEND:
            if suspended:
                return True, "already suspended"
            suspend_one(client, namespace, name)
            return True, "suspended"
        if verb is Verb.RESUME:
            resume_one(client, namespace, name, stamp)
            return True, "resumed, and a reconcile requested"
        if not stage:
            return False, "name the stage to promote"
        _value, gate = request_promotion(client, obj, stage)
        return True, f"asked to promote stage {stage} at {gate.get('revision') or 'its current revision'}"
    except CliError as error:
        return False, error.message
    except ApiError as error:
        if error.forbidden:
            return False, f"you may not read StageSet {namespace}/{name}: {error.message}"
        return False, describe_api_error(error)
    except UnreachableError as error:
        return False, describe_api_error(error)


class ActionLog:
    """The actions taken through this dashboard, per StageSet, newest first; each also logged."""

    def __init__(self, *, who: str):
        self._who = who
        self._lock = threading.Lock()
        self._done: dict[tuple[str, str], collections.deque[Done]] = {}

    def record(self, *, namespace: str, name: str, verb: Verb, stage: str | None, ok: bool,
               message: str) -> Done:
        done = Done(when=_now(), verb=verb, stage=stage, ok=ok, message=message)
        with self._lock:
            self._done.setdefault((namespace, name), collections.deque(maxlen=KEPT)).appendleft(done)
        where = f"StageSet {namespace}/{name}" + (f" stage {stage}" if stage else "")
        sys.stderr.write(f"action {verb.value} on {where} as {self._who}: "
                         f"{'done' if ok else 'refused'}: {message}\n")
        sys.stderr.flush()
        return done

    def refused(self, *, namespace: str, name: str, verb: str, why: Refusal) -> None:
        """A ``POST`` refused before the cluster was asked (logged, not listed: no viewer sent it)."""
        sys.stderr.write(f"action {verb[:40]!r} on StageSet {namespace}/{name} refused before any request: "
                         f"{why.value}\n")
        sys.stderr.flush()

    def of(self, namespace: str, name: str) -> list[Done]:
        with self._lock:
            return list(self._done.get((namespace, name), ()))
