"""What a StageSet waits for (``spec.dependsOn``), as ``tree``, ``get -o wide`` and ``graph`` show it.

Each entry is a StageSet (no ``kind``) or an object of another kind.  :func:`spec_text` says what the
spec names without a request (the list of ``get -o wide``); :func:`states` reads each one as the
user and says whether it is ready by the controller's own rules
(:mod:`stageset.controller.stageset.awaited`: a StageSet Ready at its generation; another kind by
kstatus, or by its ``readyExpr``, evaluated in the CEL sandbox as the controller does).

Identity: every read is the user's own (the session's client), so an object the user may not
read shows as ``Unknown``; discovery as the user too.
"""

from __future__ import annotations

from typing import Any

from stageset.apply.cel import CelSandbox, CelUnavailableError, LimitExceededError
from stageset.apply.health import variables
from stageset.controller.conditions import ready_at_generation
from stageset.controller.kinds import STAGESETS
from stageset.controller.stageset.awaited import (
    Awaited,
    ExprAnswer,
    Verdict,
    by_expression,
    by_kstatus,
    early,
    names_stageset,
)
from stageset.kube.client import ApiError, KubeClient
from stageset.kube.mapping import RestMapper, UnknownKindError
from stageset.kube.types import KubeObject


def is_stageset(entry: dict[str, Any]) -> bool:
    """Whether a ``spec.dependsOn`` entry names a StageSet (no kind, or ours)."""
    return names_stageset(entry)


def entries(obj: KubeObject) -> list[dict[str, Any]]:
    """The raw ``spec.dependsOn`` entries (dicts only)."""
    return [d for d in (obj.get("spec") or {}).get("dependsOn") or [] if isinstance(d, dict)]


def named(entry: dict[str, Any], home: str) -> str:
    """``StageSet db``, ``Database infra/db``: as messages name it (StageSets always with namespace)."""
    namespace = str(entry.get("namespace") or home)
    if names_stageset(entry):
        return f"StageSet {namespace}/{entry.get('name')}"
    where = "" if namespace == home else f"{namespace}/"
    return f"{entry.get('kind')} {where}{entry.get('name')}"


def spec_text(obj: KubeObject) -> str:
    """What the StageSet waits for, from its spec alone (``StageSet/shop/db,Database/db``), or ``-``."""
    home = str((obj.get("metadata") or {}).get("namespace") or "")
    return ",".join(named(e, home).replace(" ", "/", 1) for e in entries(obj)) or "-"


def _awaited(index: int, entry: dict[str, Any], home: str) -> Awaited:
    return Awaited(index=index, api_version=str(entry.get("apiVersion")), kind=str(entry.get("kind")),
                   name=str(entry.get("name")), namespace=str(entry.get("namespace") or home), home=home,
                   ready_expr=entry.get("readyExpr"))


def _stageset_state(client: KubeClient, namespace: str, name: str) -> tuple[str, str]:
    try:
        other = client.get(STAGESETS.object_path(name=name, namespace=namespace))
    except ApiError as error:
        if error.not_found:
            return "NotFound", ""
        if error.forbidden:
            return "Unknown", "you may not read it"
        raise
    return ("Ready", "") if ready_at_generation(other) else ("NotReady", "not Ready at its generation")


class _Judge:
    """The readiness of objects of other kinds, by the controller's rules; one CEL sandbox at most."""

    def __init__(self, client: KubeClient):
        self._client = client
        self._mapper = RestMapper(client)
        self._sandbox: CelSandbox | None = None

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()

    def state(self, awaited: Awaited) -> tuple[str, str]:
        try:
            resource = self._mapper.resolve(awaited.api_version, awaited.kind)
        except UnknownKindError:
            return "Unserved", f"the cluster serves no {awaited.kind} in {awaited.api_version}"
        except ApiError as error:
            return "Unknown", f"discovery failed: {error.message}"
        path = resource.object_path(name=awaited.name,
                                    namespace=awaited.namespace if resource.namespaced else None)
        try:
            found = self._client.get(path)
        except ApiError as error:
            if error.not_found:
                return "NotFound", ""
            if error.forbidden:
                return "Unknown", "you may not read it"
            raise
        verdict = self._judge(awaited, found, namespaced=resource.namespaced)
        what = awaited.what(namespaced=resource.namespaced)
        return ("Ready", "") if verdict.ready else ("NotReady", verdict.message.removeprefix(f"{what} "))

    def _judge(self, awaited: Awaited, found: KubeObject, *, namespaced: bool) -> Verdict:
        first = early(awaited, found, namespaced=namespaced)
        if first is not None:
            return first
        if awaited.ready_expr is None:
            return by_kstatus(awaited, found, namespaced=namespaced)
        if self._sandbox is None:
            self._sandbox = CelSandbox()
        try:
            (answer,) = self._sandbox.evaluate([awaited.ready_expr], variables(found))
        except (LimitExceededError, CelUnavailableError) as error:
            return Verdict(False, f"readyExpr could not be evaluated: {error}")
        judged = by_expression(awaited, ExprAnswer(answer.value, answer.type, answer.error),
                               namespaced=namespaced)
        return Verdict(False, judged) if isinstance(judged, str) else judged


def states(client: KubeClient, obj: KubeObject, *, stagesets: bool = True) -> list[dict[str, Any]]:
    """Every ``spec.dependsOn`` entry with its state as the user reads it: ``Ready``, ``NotReady``,
    ``NotFound``, ``Unserved`` (no such kind) or ``Unknown`` (not readable), and why (``stagesets``
    false: only the entries of other kinds)."""
    home = str((obj.get("metadata") or {}).get("namespace") or "")
    judge = _Judge(client)
    found: list[dict[str, Any]] = []
    try:
        for index, entry in enumerate(entries(obj)):
            namespace = str(entry.get("namespace") or home)
            if names_stageset(entry) and not stagesets:
                continue
            if names_stageset(entry):
                state, message = _stageset_state(client, namespace, str(entry.get("name")))
                kind, api_version = "StageSet", STAGESETS.api_version
            else:
                state, message = judge.state(_awaited(index, entry, home))
                kind, api_version = str(entry.get("kind")), str(entry.get("apiVersion"))
            found.append({"apiVersion": api_version, "kind": kind, "namespace": namespace,
                          "name": str(entry.get("name")), "what": named(entry, home), "state": state,
                          "message": message, **({"readyExpr": entry["readyExpr"]} if entry.get("readyExpr")
                                                 else {})})
    finally:
        judge.close()
    return found
