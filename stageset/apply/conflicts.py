"""Which answer an immutable-field conflict gets, object by object: ``conflictPolicy`` of a stage.  Pure.

The apiserver refuses some changes outright (a Job's ``spec.template``, a Service's
``clusterIP``, most of a PersistentVolumeClaim's spec): the engine learns of it from the
dry-run and asks :meth:`ConflictResolver.resolve` what to do.  The first ``rules[]`` entry
whose target matches wins, else ``default`` (``force: true`` is sugar for ``Recreate``):

- ``Fail`` — the stage fails, naming the object and the field;
- ``Recreate`` — delete, wait until gone, create (the data of a PersistentVolumeClaim or
  PersistentVolume goes with it, so that needs a rule naming the kind with ``allowDataLoss``);
- ``KeepExisting`` — leave the live object exactly as it is: created when absent, never updated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stageset.api.stageset import ConflictAction, ConflictRule, Stage
from stageset.kube.types import KubeObject

DATA_KINDS = frozenset({"PersistentVolumeClaim", "PersistentVolume"})


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def matches(rule: ConflictRule, manifest: KubeObject) -> bool:
    """Does ``rule`` govern ``manifest`` (namespace already defaulted)?  Unset fields match any."""
    target = rule.target
    metadata = manifest.get("metadata") or {}
    return ((target.kind is None or target.kind == manifest.get("kind"))
            and (target.api_version is None
                 or _group(target.api_version) == _group(str(manifest.get("apiVersion", ""))))
            and (target.name is None or target.name == metadata.get("name"))
            and (target.namespace is None or target.namespace == (metadata.get("namespace") or "")))


@dataclass(frozen=True)
class Resolution:
    action: ConflictAction
    refusal: str = ""
    """Why a ``Recreate`` is refused (data would be lost); the object then fails."""


@dataclass(frozen=True)
class ConflictResolver:
    default: ConflictAction = ConflictAction.FAIL
    rules: Sequence[ConflictRule] = ()

    @classmethod
    def of(cls, stage: Stage) -> ConflictResolver:
        rules = stage.conflict_policy.rules if stage.conflict_policy is not None else []
        return cls(default=stage.conflict_default(), rules=tuple(rules))

    @classmethod
    def forcing(cls, force: bool) -> ConflictResolver:
        return cls(default=ConflictAction.RECREATE if force else ConflictAction.FAIL)

    def resolve(self, manifest: KubeObject) -> Resolution:
        rule = next((r for r in self.rules if matches(r, manifest)), None)
        action = rule.action if rule is not None else self.default
        if action is ConflictAction.RECREATE and manifest.get("kind") in DATA_KINDS \
                and not (rule is not None and rule.allow_data_loss):
            return Resolution(ConflictAction.FAIL, refusal=(
                f"recreating it would delete its data; add a conflictPolicy rule for kind "
                f"{manifest.get('kind')} with action Recreate and allowDataLoss: true to allow that"))
        return Resolution(action)
