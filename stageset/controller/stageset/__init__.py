"""The StageSet reconciler, as small named parts.  A picture of one pass: docs/architecture.md.

- ``setup`` — the reconciler and every collaborator of it, built once, and its declaration (what
  the wiring calls; the in-process tests too);
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
- ``rendering`` — the pass's side of the render service (:mod:`stageset.controller.render`, the
  one pipeline ``stageset build``/``diff`` call too: what a StageSet names read as the tenant,
  files, build, SOPS keys, the render cache): ``Rendered`` carries the stage's identity and its
  objects' ids on the target;
- the cluster it applies to comes from the cluster targets (:mod:`stageset.controller.targets`),
  through their face only (``targets.clusters``);
- ``placement`` — ``spec.targetNamespace``; ``claims`` — which StageSet holds an object (live);
- ``stage`` — applying one stage and judging its readiness within one slice;
- ``scheduler`` — running stages over the dependency graph, branches concurrently, every
  callback on the reconcile's thread;
- ``objectdeps`` — ``spec.dependsOn`` entries of other kinds (a CRD, a database claim, a
  HelmRelease): read as the StageSet's identity and judged by ``awaited`` (pure: kstatus or
  ``readyExpr``, and how it is said); ``dependencywatches`` — the held watches (per identity, kind
  and namespace) that wake a StageSet waiting for one;
- ``records`` — the durable inventory record and rebuilding a lost inventory (reads only);
- ``changes`` — what a pass changed, told: metrics, drift and prune events, the success event;
- ``drifting`` — what each pass tells the drift watches (:mod:`stageset.controller.drift`): it
  begins, what each stage applied, it ends (and a StageSet deleted or suspended needs none);
- ``teardown`` — deleting a deleted StageSet's objects, dependents first.
- ``release`` — steering a release in a pass (pinned and held stages, promotion gates, rollback,
  the last good snapshot), doing what the pure rules decide: ``steering`` (where each stage
  renders, the steered verdict), ``gates`` (soak, manual promotion), ``windows`` (update
  windows), ``rollback`` (the plan and its record), ``floors`` (``dependsOn[].minVersion``); a
  stage's source at a recorded revision comes from :mod:`stageset.controller.render.revisions`.

The modules are layered, one way, from ``setup`` down to the pure rules (the import-linter
contract in ``pyproject.toml``; every module is placed).

Who acts as whom: :mod:`stageset.controller.identity`.  Whether a pass deletes: ``pruning``; what
prune deletes object by object, the owner checks, the opt-out, ``prune: false``:
:mod:`stageset.apply.prune`.
"""
