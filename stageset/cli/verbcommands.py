"""The verbs that serve StageSets and, named, GitRepositories: ``get``, ``reconcile``, ``suspend``,
``resume`` (each the StageSet command, or ``<verb> source git ...``; :mod:`stageset.cli.verbs`
routes).  Loaded by the root group when one of them runs (:mod:`stageset.cli.root`).

Identity: none here; each command states its own.
"""

from __future__ import annotations

from stageset.cli import gitsources, inspect, steer
from stageset.cli.verbs import verb

get = verb(inspect.get, gitsources.get_sources)
reconcile = verb(steer.reconcile, gitsources.reconcile_source)
suspend = verb(steer.suspend, gitsources.suspend_source)
resume = verb(steer.resume, gitsources.resume_source)
