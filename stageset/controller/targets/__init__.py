"""Cluster targets: the clusters a StageSet applies to, their credentials and connections, and the
platform's StageTargets.

A shared service below the reconcilers (an import-linter contract), and a feature of its own (the
StageTarget reconciler).  The StageSet reconciler reaches it through its face only, ``clusters``
(the independence contract of the four reconcilers allows that one import, nothing else):

- ``clusters`` — **the face**: :class:`~.clusters.Targets`, the registry a pass asks for its
  cluster (this one, ``spec.kubeConfig``'s, ``spec.targetRef``'s, a move's previous one) and
  :class:`~.clusters.Target`, one connected cluster with its apply engine;
- ``credentials`` — where a cluster's credentials come from (the kubeConfig Secret as the tenant,
  a StageTarget's Secret as the controller): the seam a new kind of credential plugs into;
- ``workload`` — workload identity (``kubeConfig.configMapRef``): the ConfigMap read as the tenant,
  whose token each request carries (tokens requested as the controller), no impersonation;
- ``platform`` — the platform's StageTargets: which StageSets may use each, one connection per target;
- ``reconciler`` — the StageTarget reconciler: connects and reports in the target's status;
- ``setup`` — the registry built, and the StageTarget reconciler and its Secret watch declared.

Identity: the StageSet's for its ``spec.kubeConfig`` Secret or ConfigMap; the controller's own for
everything about StageTargets and for TokenRequests; see each module.
"""
