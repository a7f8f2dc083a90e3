"""The digests a render records of what a stage was built from, beside its source revision.

Pure: no I/O, no clock.  Both are computed once, by the render service
(:class:`~stageset.controller.render.service.StageRender`), and read by two rules of the StageSet
pass that must agree on them:

- :func:`inputs_digest` — the action ledger's key (with the revision): a stage's ``pre``/``post``
  actions run once per revision and these inputs (:mod:`stageset.controller.stageset.actionplan`);
- :func:`substitution_digest` — what a release snapshot records of a stage's ``postBuild``
  variables, so a rollback knows whether restoring a revision restores its variables too
  (:mod:`stageset.controller.stageset.rollback`).

Invariant: neither holds a Secret value in a form that could be guessed back — values that came
from Secrets count by name only in :func:`inputs_digest` (its 16 hex digits are shown in status),
and :func:`substitution_digest` is salted with the StageSet's uid.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

from stageset.api import Stage

_SECRET = "<from a Secret>"  # noqa: S105 - a placeholder for a value, not a password


def inputs_digest(stage: Stage, variables: Mapping[str, str] | None, secret_values: Iterable[str]) -> str:
    """``sha256:<16 hex>`` of what the stage builds from besides its source revision."""
    secrets = set(secret_values)
    data = {
        "path": stage.path,
        "patches": [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in stage.patches],
        "variables": None if variables is None
        else {name: (_SECRET if value in secrets else value) for name, value in sorted(variables.items())},
    }
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"sha256:{digest[:16]}"


def substitution_digest(variables: Mapping[str, str] | None, *, salt: str) -> str | None:
    """A digest of a stage's ``postBuild`` variables (names and values, never the values
    themselves), salted with the StageSet's uid; ``None`` when the stage has no variables."""
    if variables is None:
        return None
    digest = hashlib.sha256(salt.encode())
    for name in sorted(variables):
        for part in (name, variables[name]):
            data = part.encode()
            digest.update(len(data).to_bytes(8, "big") + data)
    return f"sha256:{digest.hexdigest()}"
