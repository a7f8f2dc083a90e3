"""The controller: watches, a work queue, and the StageSet and GitRepository reconcilers.

Running it:

- ``manager`` — watches -> work queue -> workers; the watch cache (read-only) and the status
  our own writes left until the watch catches up; observability hooks for both kinds;
- ``wiring`` — the one place that builds both reconcilers and every collaborator (one
  identity policy);
- ``health`` / ``leader`` — probes, the metrics port, start-up waits, leader election;
- ``queue`` — the de-duplicating work queue with per-key backoff; ``result`` — what a
  reconcile tells it.

The two reconcilers, independent of each other (an import-linter contract):

- ``stageset/`` — the StageSet reconciler, a package of named parts (see its docstring);
- ``gitrepository`` — the GitRepository reconciler: fetch into the shared mirror, report the artifact.

Beside the StageSet reconciler (it imports its reads): ``artifacts`` — Flux artifacts for
StageSets, downloaded in the source pool, a tree handed only for the digest a stage's own read named.

Shared by both (none imports a reconciler, the manager or the wiring):

- ``identity`` — who acts as whom, for every read and write made for a tenant;
- ``status`` — the one writer of a reconcile's status (whole values in, messages redacted);
- ``conditions`` — kstatus conditions and the status values made from them (pure);
- ``consumers`` — whom the mirror serves a GitRepository's commits to, by uid (pure; the CLI's
  mirror too);
- ``events``, ``metrics``, ``logs``, ``redact`` — what the controller tells, and Secret values
  kept out of all of it;
- ``finalizers`` — our finalizer, added and removed optimistically;
- ``ordering`` — the stage ``dependsOn`` graph (pure); ``dependencies`` — StageSets'
  ``spec.dependsOn``, cycles, waking dependents;
- ``rendercache`` — rendered stages keyed by what their build read;
- ``settings`` — the controller's settings (injected); ``clock`` — the clock (injected).
"""
