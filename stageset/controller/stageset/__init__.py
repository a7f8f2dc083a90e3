"""The StageSet reconciler, as small named parts.

- ``reconciler`` — orchestration only: the reconcile and the pass as a list of named steps;
- ``plan`` — the pure pass plan: rechecks, the quiet-pass rule, the readiness window, the
  verdict (Ready reason, requeue, when prune runs), teardown order.  No I/O; clock injected;
- ``reads`` — what a StageSet names, read as the tenant (sources, variables, dependencies);
- ``targets`` — the cluster it applies to (``spec.kubeConfig``);
- ``rendering`` — a stage's manifests, built and cached by content;
- ``stage`` — applying one stage and judging its readiness within one slice;
- ``scheduler`` — running stages over the dependency graph, branches concurrently;
- ``teardown`` — deleting a deleted StageSet's objects, dependents first.

Who acts as whom: :mod:`stageset.controller.identity`.  Deleting objects, owner checks,
the opt-out: :mod:`stageset.apply.prune`.
"""
