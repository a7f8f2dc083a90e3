"""What the work queue holds: one type per kind of work, so a key says what runs it.

- :class:`ObjectKey` — a reconcile of one watched object (the kind's controller runs it);
- :class:`JobKey` — one job of a named job runner (an artifact download), charged to a namespace;
- :class:`ReportKey` — a report written about an object no reconcile of this process owns (the
  main shard's ``NoShard``, :mod:`stageset.controller.unserved`).

Keys of different types never compare equal, even with the same fields: a report about a
StageSet and a reconcile of it are two pieces of work.  Every key has a ``namespace``, the share
of its pool it is charged to (:class:`~stageset.controller.queue.WorkQueue`'s fairness).

Identity: none; pure values.
"""

from __future__ import annotations

from dataclasses import dataclass

from stageset.kube.types import KubeObject

Ref = tuple[str, str, str]
"""``(kind, namespace, name)``: how metrics and the redaction registry name an object."""


@dataclass(frozen=True, order=True, slots=True)
class ObjectKey:
    """A reconcile of the object ``kind`` ``namespace``/``name``."""

    kind: str
    namespace: str
    name: str

    @property
    def ref(self) -> Ref:
        return (self.kind, self.namespace, self.name)

    @classmethod
    def of(cls, obj: KubeObject, *, kind: str | None = None) -> ObjectKey:
        """The key of ``obj`` (of its own ``kind`` unless one is given)."""
        meta = obj.get("metadata") or {}
        return cls(str(kind if kind is not None else obj.get("kind", "")), str(meta.get("namespace", "")),
                   str(meta.get("name", "")))

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, order=True, slots=True)
class JobKey:
    """Job ``name`` of the job runner ``runner``, in ``namespace``'s share of the runner's pool."""

    runner: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.runner} job {self.namespace}/{self.name}"


@dataclass(frozen=True, order=True, slots=True)
class ReportKey:
    """A report about the object ``kind`` ``namespace``/``name`` (not a reconcile of it)."""

    kind: str
    namespace: str
    name: str

    @property
    def object(self) -> ObjectKey:
        return ObjectKey(self.kind, self.namespace, self.name)

    def __str__(self) -> str:
        return f"report on {self.kind} {self.namespace}/{self.name}"


WorkKey = ObjectKey | JobKey | ReportKey
