"""The controller: the manager, the features it runs, and the services and modules they share.

Layered one way (an import-linter contract; every module is placed):

- ``manager`` — runs what the features declare: watches -> cache -> work queues -> workers,
  routing work by the type of its key; observability hooks for every kind.  It names no kind and
  builds no feature;
- ``wiring`` — the composition root: the parts features share (the Git mirror, one identity
  policy, the readiness watch pool), each feature's own ``setup`` in order, joined into the
  manager's ``Setup``; beside it ``health`` / ``leader`` — probes, the metrics port, start-up
  waits, leader election;
- the features, independent of each other, each exporting a ``setup``:

  - ``stageset/`` — the StageSet reconciler, a package of named parts (see its docstring);
  - ``gitrepository`` — the GitRepository reconciler: fetch into the shared mirror, report the artifact;
  - ``fleet/`` — FleetRollouts: waves of revisions across StageSets;
  - ``notifications/`` — events to webhooks, chats and commit statuses (a listener of the recorder);
  - ``fluxsources`` — watches of Flux's source kinds (``fluxwatch``: triggers only) and Flux
    artifacts downloaded as jobs of the source pool (``artifacts``);
  - ``namespaces`` — the tenant watches: one metadata-only Namespace watch (``tenants``,
    ``terminating``);
  - ``handoff`` — one writer per StageSet across label shards (every controller's guard there);
    ``unserved`` — the main shard's ``NoShard`` reports; ``sharding`` — the selectors (pure);

- the services the features share, below them: ``render/`` — the one render pipeline (the CLI's
  ``build``/``diff`` too) and ``targets/`` — the clusters a StageSet applies to, their credentials,
  the platform's StageTargets and their reconciler (the StageSet package uses its face,
  ``targets.clusters``, only);
- ``shared`` — what the manager hands every feature's setup;
- the shared modules (none imports a reconciler, the manager or the wiring):

  - ``setup`` — what a feature declares (``For`` a kind with a trigger, ``Watches`` with mappings,
    its Ready→False event policy, jobs, reports, runnables, caches, indexes, listeners, closers);
    ``keys`` — the work keys, one type per kind of work (pure); ``cache`` — the watch cache
    (read-only) and the status our own writes left until the watch catches up; ``kinds`` — our
    kinds' API names; ``queue`` — the de-duplicating work queue with per-key backoff; ``result``
    — what a reconcile tells it;
  - ``identity`` — who acts as whom, for every read and write made for a tenant; ``accounts`` —
    what a read as the tenant answers (a denial explained, a missing object);
  - ``status`` — the one writer of a reconcile's status (whole values in, messages redacted);
  - ``conditions`` — kstatus conditions and the status values made from them (pure);
  - ``consumers`` — whom the mirror serves a GitRepository's commits to, by uid (pure; the CLI's
    mirror too); ``sourcekinds`` — which source kinds a stage may name (pure);
  - ``events``, ``metrics``, ``logs``, ``redact`` — what the controller tells, and Secret values
    kept out of all of it;
  - ``finalizers`` — our finalizer, added and removed optimistically;
  - ``ordering`` — the stage ``dependsOn`` graph (pure); ``dependencies`` — StageSets'
    ``spec.dependsOn``, cycles, waking dependents;
  - ``settings`` — the controller's settings, every feature's (injected); ``clock`` — the clock
    (injected).
"""
