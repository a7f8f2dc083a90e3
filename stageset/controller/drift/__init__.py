"""Drift by watch: what StageSets applied, watched as whoever applied it, on every cluster.

A shared service below the reconcilers (like the cluster targets and the render service): the
StageSet feature tells it what each pass applied and when a pass starts and settles
(:mod:`stageset.controller.stageset.drifting`), and it queues a StageSet when a watch sees a change
that is not ours.  The correction (or, in ``Warn`` mode, the report) is the StageSet's normal pass.

- ``judge`` — is a watch event drift?  Fingerprints and the one rule (pure);
- ``registry`` — the watches held, shared, bounded (``--max-drift-watches``) and released, and the
  events routed to the StageSet that owns the object;
- ``report`` — what a ``Warn`` StageSet says: ``status.drifted``, the ``Drifted`` condition, which
  drift is new (pure);
- ``setup`` — the registry built from the shared watch pool, counted in the metrics.

Identity: see each module; every watch is opened as the identity that applied what it watches.
"""
