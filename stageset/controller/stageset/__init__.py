"""The StageSet reconciler, as small named parts.  A picture of one pass: docs/architecture.md.

- ``reconciler`` — orchestration only: copy what the cache handed over, read the spec
  (teardown, suspend), prepare (finalizer, stage graph, dependencies, target), run one pass;
- ``watches`` — its declaration to the manager: what requeues a StageSet (its spec and
  requests, its dependencies, the sources it names), and the indexes its watch keeps;
- ``passes`` — one pass as named steps: render, refuse clashes, recover the inventory, apply
  over the graph, verdict, prune, conclude; its progress is a local value each step takes and
  returns anew;
- ``context`` — what one pass works on, fixed (the StageSet, its target, its writer), and a remote
  cluster failing mid-pass (carrying the progress as it stood);
- ``plan`` — the pure pass plan: rechecks, the quiet-pass rule, the readiness window, the
  verdict (Ready reason, requeue), teardown order.  No I/O; clock injected;
- ``pruning`` — **whether and what a pass may delete**, one pure decision asked once per pass
  (and once per teardown), every input required;
- ``progress`` — what a pass knows so far as one value, and the status it shows (pure);
- ``writer`` — **everything a reconcile writes to its StageSet, and when**: finalizer,
  inventory record, announce, progress, throttled waiting messages, conclusion (a quiet pass is
  an argument, not a mode of the writer);
- ``reads`` — what a StageSet names, read as the tenant (sources, variables, dependencies);
- ``targets`` — the cluster it applies to (``spec.kubeConfig``), a bounded cache of remotes;
- ``renderservice`` — **the one render pipeline**, which ``stageset build``/``diff`` call too: a
  stage's source and variables read as the tenant, its files from wherever the caller says, built
  (``patches``, SOPS, substitution) and cached by content;
- ``rendering`` — the controller's side of it: files from the shared mirror and the artifact
  store; ``Rendered`` carries the stage's identity and its objects' ids on the target;
- ``decryption`` — ``spec.decryption``: the key Secret read as the StageSet's ServiceAccount,
  once a pass;
- ``stage`` — applying one stage and judging its readiness within one slice;
- ``scheduler`` — running stages over the dependency graph, branches concurrently, every
  callback on the reconcile's thread;
- ``records`` — the durable inventory record and rebuilding a lost inventory (reads only);
- ``changes`` — what a pass changed, told: metrics, drift and prune events, the success event;
- ``teardown`` — deleting a deleted StageSet's objects, dependents first.
- ``release`` — steering a release in a pass (pinned and held stages, promotion gates, rollback,
  the last good snapshot), doing what the pure rules decide: ``steering`` (where each stage
  renders, the steered verdict), ``gates`` (soak, manual promotion), ``windows`` (update
  windows), ``rollback`` (the plan and its record), ``floors`` (``dependsOn[].minVersion``);
  ``revisions`` is the seam for "a stage's source at a recorded revision".

The modules are layered, one way, from ``reconciler`` down to the pure rules (the import-linter
contract in ``pyproject.toml``; every module is placed).

Who acts as whom: :mod:`stageset.controller.identity`.  Whether a pass deletes: ``pruning``; what
prune deletes object by object, the owner checks, the opt-out, ``prune: false``:
:mod:`stageset.apply.prune`.
"""
