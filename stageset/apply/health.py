"""CEL health checks (``readyChecks.exprs``): readiness of the kinds kstatus cannot judge, as Flux's
``healthCheckExprs`` judges them.

Rules, in order (pure: :func:`judge`):

1. an object being deleted, or whose ``status.observedGeneration`` is behind its
   ``metadata.generation``, is in progress — no expression is evaluated (kstatus's first rule);
2. ``failed`` true: Failed (the stage fails now rather than at its timeout);
3. ``current`` true: Current;
4. ``inProgress`` true: in progress;
5. none true: in progress.  An expression that fails to evaluate (a missing key) counts as not
   true; its error is part of the message the stage shows while it waits.

An entry without ``current`` (the reference allows that) only adds ``failed``: unless it is true,
the kstatus rules decide, as the reference's kstatus wait does before its expressions.

An expression whose result is not a bool is ``InvalidSpec``: refused before anything is applied
when the type checker knows it (:func:`spec_problems`), else when it is evaluated.  Kinds
without an expression keep the kstatus rules (:mod:`stageset.apply.readiness`).

The variables are the object's top-level fields — ``apiVersion``, ``kind``, ``metadata``,
``spec``, ``status`` (an absent one is an empty map) — and ``self``, the whole object.
Expressions are evaluated out of process, under a time and memory bound (:mod:`stageset.apply.cel`).

Identity: none of its own — :class:`HealthChecks` judges objects the engine read as the stage's
identity; the CEL workers see only what is sent to them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stageset.api.stageset import HealthCheckExpr, Stage, StageSet
from stageset.api.vocabulary import Reason
from stageset.apply.cel import Answer, CelSandbox, CelUnavailableError, LimitExceededError
from stageset.apply.errors import StageError
from stageset.apply.readiness import Readiness, Status, preconditions
from stageset.kube.types import KubeObject

# Evaluation order = priority: the first expression that is true decides.
PRIORITY: tuple[tuple[str, Status], ...] = (
    ("failed", Status.FAILED), ("current", Status.CURRENT), ("inProgress", Status.IN_PROGRESS))
_MAX_DETAIL = 300


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."


@dataclass(frozen=True)
class HealthRule:
    """``readyChecks.exprs[index]``: the expressions for one kind, in priority order."""

    index: int
    group: str
    kind: str
    exprs: tuple[tuple[str, str], ...]
    """``(field, source)`` for the fields that are set, failed first."""

    @classmethod
    def of(cls, index: int, spec: HealthCheckExpr) -> HealthRule:
        sources = {"failed": spec.failed, "current": spec.current, "inProgress": spec.in_progress}
        return cls(index, _group(spec.api_version), spec.kind,
                   tuple((name, source) for name, _ in PRIORITY if (source := sources[name])))

    @property
    def judges_current(self) -> bool:
        """Whether ``current`` is set: without it, kstatus decides what ``failed`` does not."""
        return any(field == "current" for field, _ in self.exprs)

    def where(self, field: str) -> str:
        return f"readyChecks.exprs[{self.index}].{field}"

    def governs(self, obj: KubeObject) -> bool:
        return obj.get("kind") == self.kind and _group(str(obj.get("apiVersion", ""))) == self.group


def rules_of(stage: Stage) -> list[HealthRule]:
    exprs = stage.ready_checks.exprs if stage.ready_checks is not None else []
    return [HealthRule.of(index, spec) for index, spec in enumerate(exprs)]


def variables(obj: KubeObject) -> dict[str, object]:
    """What an expression sees: the top-level fields (absent maps empty) and ``self``."""
    return {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""),
            "metadata": obj.get("metadata") or {}, "spec": obj.get("spec") or {},
            "status": obj.get("status") or {}, "self": obj}


def judge(rule: HealthRule, answers: Sequence[Answer], *, stage: str, what: str) -> Readiness:
    """The object's readiness from the answers to ``rule.exprs`` (same order).

    Raises :class:`StageError` (``InvalidSpec``) when an expression returned something other than
    a bool."""
    errors: list[str] = []
    for (field, _), answer in zip(rule.exprs, answers, strict=True):
        if answer.type is not None:
            raise StageError(Reason.INVALID_SPEC, f"stage {stage!r}: {rule.where(field)} returned "
                             f"{answer.type}, not bool, for {what}")
        if answer.error is not None:
            errors.append(f"{rule.where(field)}: {_short(answer.error)}")
            continue
        if answer.value:
            status = dict(PRIORITY)[field]
            if status is Status.CURRENT:
                return Readiness(Status.CURRENT)
            return Readiness(status, f"{rule.where(field)} is true")
    detail = f" ({'; '.join(errors)})" if errors else ""
    return Readiness(Status.IN_PROGRESS, f"{rule.where('current')} is not true yet{detail}")


def spec_problems(stageset: StageSet, answers: Sequence[Answer]) -> list[str]:
    """What the type checker refuses, per expression of every stage (``answers`` in
    :func:`expressions_of` order): messages naming the stage and the field."""
    problems: list[str] = []
    for (stage, where, _), answer in zip(expressions_of(stageset), answers, strict=True):
        if answer.error is not None:
            problems.append(f"stage {stage!r}: {where} does not compile: {_short(answer.error)}")
        elif answer.type not in ("bool", "dyn"):
            problems.append(f"stage {stage!r}: {where} returns {answer.type}, not bool")
    return problems


def expressions_of(stageset: StageSet) -> list[tuple[str, str, str]]:
    """``(stage, field path, source)`` of every health expression, in spec order."""
    found: list[tuple[str, str, str]] = []
    for stage in stageset.spec.stages:
        for rule in rules_of(stage):
            found.extend((stage.name, rule.where(field), source) for field, source in rule.exprs)
    return found


class ExpressionChecker:
    """Compile-checks a StageSet's expressions before anything is applied (answers cached by source)."""

    def __init__(self, sandbox: CelSandbox, *, max_entries: int = 1024):
        self._sandbox = sandbox
        self._known: OrderedDict[str, Answer] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def _answers(self, sources: Iterable[str]) -> dict[str, Answer]:
        wanted = list(dict.fromkeys(sources))
        with self._lock:
            known = {s: self._known[s] for s in wanted if s in self._known}
        missing = [s for s in wanted if s not in known]
        if missing:
            fresh = dict(zip(missing, self._sandbox.check(missing), strict=True))
            known.update(fresh)
            with self._lock:
                self._known.update(fresh)
                while len(self._known) > self._max:
                    self._known.popitem(last=False)
        return known

    def answers(self, sources: Iterable[str]) -> dict[str, Answer]:
        """The type checker's answer for each expression (cached by source).  Raises
        :class:`~stageset.apply.cel.LimitExceededError` and
        :class:`~stageset.apply.cel.CelUnavailableError`."""
        return self._answers(sources)

    def check(self, stageset: StageSet) -> None:
        """Raise :class:`StageError` (``InvalidSpec``) naming the first bad expression."""
        expressions = expressions_of(stageset)
        if not expressions:
            return
        try:
            known = self._answers(source for _, _, source in expressions)
        except LimitExceededError as error:
            raise StageError(Reason.INVALID_SPEC, "readyChecks.exprs: checking the expressions exceeded "
                             "their limit; shorten them") from error
        except CelUnavailableError as error:
            raise StageError(Reason.STAGE_FAILED, f"readyChecks.exprs cannot be checked: {error}") from error
        problems = spec_problems(stageset, [known[source] for _, _, source in expressions])
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise StageError(Reason.INVALID_SPEC, problems[0] + more)


class HealthChecks:
    """A stage's expressions bound to the sandbox: the engine's readiness judge for their kinds."""

    def __init__(self, *, rules: Sequence[HealthRule], sandbox: CelSandbox, stage: str):
        self._rules = list(rules)
        self._sandbox = sandbox
        self._stage = stage

    def __bool__(self) -> bool:
        return bool(self._rules)

    def gates(self, obj: KubeObject) -> bool:
        """Whether a ``current`` expression judges ``obj``: the reference evaluates those even for a
        stage with ``disableWait``."""
        return any(rule.governs(obj) and rule.judges_current for rule in self._rules)

    def judge(self, live: KubeObject, *, what: str) -> Readiness | None:
        """``None`` when no expression governs the object's kind (kstatus then decides)."""
        rule = next((r for r in self._rules if r.governs(live)), None)
        if rule is None:
            return None
        early = preconditions(live)
        if early is not None:
            return early
        try:
            answers = self._sandbox.evaluate([source for _, source in rule.exprs], variables(live))
        except LimitExceededError as error:
            limits = self._sandbox.limits
            raise StageError(Reason.INVALID_SPEC, f"stage {self._stage!r}: readyChecks.exprs[{rule.index}] "
                             f"exceeded the evaluation limit ({limits.timeout:g}s, "
                             f"{limits.memory_bytes // (1024 * 1024)} MiB) on {what}; simplify "
                             "the expressions") from error
        except CelUnavailableError as error:
            raise StageError(Reason.STAGE_FAILED, f"stage {self._stage!r}: cannot evaluate "
                             f"readyChecks.exprs: {error}") from error
        verdict = judge(rule, answers, stage=self._stage, what=what)
        if verdict.status is not Status.FAILED and not rule.judges_current:
            return None
        return verdict
