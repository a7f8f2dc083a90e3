"""A thin layer over the official ``kubernetes`` client, used as a transport only.

Manifests and live objects stay raw dicts (the client's typed models cost ~0.2 ms
per object).  Everything here is identity-aware: every :class:`~stageset.kube.client.KubeClient`
is bound to one cluster and one identity, and :class:`~stageset.kube.client.ClientPool`
hands out one cached client per (cluster, identity) so connection pools are reused
across reconciles.

Modules: ``client`` (requests, identities, the client pool), ``mapping`` (discovery,
kinds to paths), ``watch`` (our list/watch loop), ``remote`` (tenants' kubeconfigs, made
harmless), ``types`` (TypedDicts of raw JSON; imports nothing, so pure code may use it).
Nothing is re-exported here, so importing ``stageset.kube.types`` stays free of the client.
"""
