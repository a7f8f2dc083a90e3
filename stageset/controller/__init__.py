"""The controller: watches, a work queue, and the StageSet and GitRepository reconcilers.

Running it:

- ``manager`` — runs what the reconcilers declare: watches -> cache -> work queues -> workers,
  routing work by the type of its key; observability hooks for every kind.  It names no kind;
- ``wiring`` — the one place that builds both reconcilers, every collaborator (one identity
  policy) and the manager's ``Setup``;
- ``setup`` — what a reconciler declares (``For`` a kind with a trigger, ``Watches`` with
  mappings, jobs, reports); ``keys`` — the work keys, one type per kind of work (pure);
  ``cache`` — the watch cache (read-only) and the status our own writes left until the watch
  catches up; ``kinds`` — our kinds' API names;
- ``health`` / ``leader`` — probes, the metrics port, start-up waits, leader election;
- ``queue`` — the de-duplicating work queue with per-key backoff; ``result`` — what a
  reconcile tells it.

The two reconcilers, independent of each other (an import-linter contract):

- ``stageset/`` — the StageSet reconciler, a package of named parts (see its docstring);
- ``gitrepository`` — the GitRepository reconciler: fetch into the shared mirror, report the artifact.

Beside them, for StageSets' sources: ``fluxwatch`` (watches of Flux's source kinds, triggers
only), ``artifacts`` (Flux artifacts for StageSets, downloaded as jobs of the source pool, a tree
handed only for the digest a stage's own read named; it imports the StageSet reconciler's reads),
``sourcekinds`` (which source kinds a stage may name; pure); for label shards: ``sharding``
(pure), ``unserved`` (the main shard's ``NoShard`` reports) and ``handoff`` (one writer per
StageSet across shards; every controller's guard on a label shard).

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
