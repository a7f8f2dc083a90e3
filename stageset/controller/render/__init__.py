"""The render service: what a stage's source becomes, the same for the controller and the CLI.

A shared service, below the reconcilers (an import-linter contract): the StageSet reconciler renders
through it (:mod:`stageset.controller.stageset.rendering`), and so do ``stageset build`` and ``diff``
(:mod:`stageset.cli.render`), so the two cannot silently disagree.

- ``service`` — **the one render pipeline**: a stage's source and variables read as the tenant,
  its files from wherever the caller says, built (``patches``, SOPS, substitution) and cached;
- ``files`` — the seam for where files come from (a caller's :class:`~.files.SourceFiles`);
  ``stores`` — the controller's: its shared Git mirror and its artifact store;
- ``reads`` — what a StageSet names, read as the tenant: sources, ``substituteFrom``, dependencies;
- ``revisions`` — a stage's source at a recorded revision (rollback, held updates);
- ``decryption`` — ``spec.decryption``: the key Secret read as the StageSet's ServiceAccount, once a pass;
- ``cache`` — rendered stages keyed by exactly what their build read;
- ``digests`` — what a render records of its inputs, shared by the action ledger and rollback (pure).

Layers, one way (a contract): ``service`` > ``decryption | stores`` > ``files`` > ``revisions`` >
``reads`` > ``cache | digests``; the service imports no store, key reader or caller.

Identity: every read as the identity its caller hands in (:mod:`stageset.controller.identity`
picks it); see each module.
"""
