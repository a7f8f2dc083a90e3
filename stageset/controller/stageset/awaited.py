"""Dependencies on objects of other kinds (``spec.dependsOn`` entries with ``apiVersion`` and ``kind``):
what a StageSet awaits, whether the object is ready, and how that is said.  Pure: no I/O.

Rules (:func:`verdict`), for the object as the StageSet's identity read it:

1. absent (404): not ready — "Database db not found";
2. being deleted, or ``status.observedGeneration`` behind ``metadata.generation``: not ready, whatever
   it says (kstatus's first rule, as for ``readyChecks.exprs``);
3. with ``readyExpr``: ready when the expression is true; false, or failing to evaluate (a missing
   key), is not ready; a result that is not a bool is ``InvalidSpec``;
4. without: ready when the kstatus rules (:mod:`stageset.apply.readiness`, the stage readiness rules)
   say ``Current``; ``InProgress`` and ``Failed`` are not ready (a failed object may recover: the
   StageSet waits, its message says it failed).

Messages name the object as the user wrote it: ``Database db`` in the StageSet's namespace,
``Database infra/db`` in another, ``CustomResourceDefinition databases.example.com`` for a
cluster-scoped kind.  What the object itself says (its Ready message, an expression's evaluation
error) is shown only for an object of the StageSet's own namespace (or a cluster-scoped one) that is
not a Secret: of another namespace only the fixed text, as for sources; an evaluation error over a
Secret's fields could quote its data.

Identity: none (no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stageset.api import API_VERSION, StageSet
from stageset.apply.readiness import Status, preconditions, readiness
from stageset.kube.types import KubeObject

_MAX_DETAIL = 300
_SILENT_KINDS = frozenset({("v1", "Secret")})
"""Kinds whose own words (or an expression's error over them) are never quoted."""


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."


@dataclass(frozen=True)
class Awaited:
    """One ``spec.dependsOn`` entry naming an object of another kind."""

    index: int
    """Its position in ``spec.dependsOn`` (messages name the field)."""
    api_version: str
    kind: str
    name: str
    namespace: str
    """As written, else the StageSet's (unused for a cluster-scoped kind)."""
    home: str
    """The StageSet's namespace."""
    ready_expr: str | None = None

    @property
    def field(self) -> str:
        return f"spec.dependsOn[{self.index}]"

    @property
    def cross_namespace(self) -> bool:
        return self.namespace != self.home

    def what(self, *, namespaced: bool = True) -> str:
        """``Database db``, ``Database infra/db`` (another namespace), or the cluster-scoped name."""
        if not namespaced or not self.cross_namespace:
            return f"{self.kind} {self.name}"
        return f"{self.kind} {self.namespace}/{self.name}"

    def quotes(self, *, namespaced: bool = True) -> bool:
        """Whether messages may quote what the object says (own namespace or cluster-scoped; no Secret)."""
        if (self.api_version, self.kind) in _SILENT_KINDS:
            return False
        return not namespaced or not self.cross_namespace


def names_stageset(entry: KubeObject) -> bool:
    """Whether a raw ``spec.dependsOn`` entry is a StageSet dependency (no kind, or our StageSet)."""
    kind = entry.get("kind")
    return kind is None or (kind == "StageSet" and entry.get("apiVersion") == API_VERSION)


def awaited_of(stageset: StageSet) -> list[Awaited]:
    """The entries of ``spec.dependsOn`` that name objects of other kinds, in spec order."""
    home = str(stageset.metadata["namespace"])
    return [Awaited(index=index, api_version=str(ref.api_version), kind=str(ref.kind), name=ref.name,
                    namespace=ref.namespace or home, home=home, ready_expr=ref.ready_expr)
            for index, ref in enumerate(stageset.spec.depends_on) if not ref.names_stageset]


@dataclass(frozen=True)
class Verdict:
    """Whether the awaited object is ready, and if not, the message that says why."""

    ready: bool
    message: str = ""


@dataclass(frozen=True)
class ExprAnswer:
    """What became of ``readyExpr`` over the object (:class:`stageset.apply.cel.Answer`'s fields)."""

    value: bool | None = None
    type: str | None = None
    error: str | None = None


def absent(awaited: Awaited, *, namespaced: bool = True) -> Verdict:
    return Verdict(False, f"{awaited.what(namespaced=namespaced)} not found ({awaited.field})")


def unserved(awaited: Awaited) -> str:
    """The message for a kind the cluster does not serve (yet): its CRD is missing or not established."""
    return (f"{awaited.what()} ({awaited.field}): this cluster serves no kind {awaited.kind} in "
            f"{awaited.api_version}; is its CustomResourceDefinition installed? (looked at again at "
            "retryInterval)")


def early(awaited: Awaited, obj: KubeObject, *, namespaced: bool = True) -> Verdict | None:
    """Rule 2: being deleted or a generation not yet observed (``None``: go on to rules 3-4)."""
    found = preconditions(obj)
    if found is None:
        return None
    detail = f": {found.message}" if awaited.quotes(namespaced=namespaced) else ""
    return Verdict(False, f"{awaited.what(namespaced=namespaced)} is not Ready{detail}")


def by_kstatus(awaited: Awaited, obj: KubeObject, *, namespaced: bool = True) -> Verdict:
    """Rule 4: the kstatus rules."""
    judged = readiness(obj)
    if judged.status is Status.CURRENT:
        return Verdict(True)
    what = awaited.what(namespaced=namespaced)
    quote = awaited.quotes(namespaced=namespaced) and judged.message
    if judged.status is Status.FAILED:
        return Verdict(False, f"{what} has failed" + (f": {_short(judged.message)}" if quote else ""))
    return Verdict(False, f"{what} is not Ready" + (f": {_short(judged.message)}" if quote else ""))


def by_expression(awaited: Awaited, answer: ExprAnswer, *, namespaced: bool = True) -> Verdict | str:
    """Rule 3 from the expression's answer; a ``str`` is the ``InvalidSpec`` message (not a bool)."""
    where = f"{awaited.field}.readyExpr"
    what = awaited.what(namespaced=namespaced)
    if answer.type is not None:
        return f"{where} returned {answer.type}, not bool, for {what}"
    if answer.value:
        return Verdict(True)
    detail = ""
    if answer.error is not None:
        detail = f" ({_short(answer.error)})" if awaited.quotes(namespaced=namespaced) else \
            " (it could not be evaluated)"
    return Verdict(False, f"{what} is not ready: {where} is not true yet{detail}")


def expression_problems(awaited: Sequence[Awaited], answers: Sequence[ExprAnswer]) -> list[str]:
    """What the type checker refuses, for each entry with ``readyExpr`` (``answers`` in that order)."""
    problems: list[str] = []
    with_expr = [a for a in awaited if a.ready_expr is not None]
    for entry, answer in zip(with_expr, answers, strict=True):
        where = f"{entry.field}.readyExpr"
        if answer.error is not None:
            problems.append(f"{where} does not compile: {_short(answer.error)}")
        elif answer.type not in ("bool", "dyn"):
            problems.append(f"{where} returns {answer.type}, not bool")
    return problems
