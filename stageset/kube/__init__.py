"""A thin layer over the official ``kubernetes`` client, used as a transport only.

Manifests and live objects stay raw dicts (the client's typed models cost ~0.2 ms
per object).  Everything here is identity-aware: every :class:`KubeClient` is bound
to one cluster and one identity, and :class:`ClientPool` hands out one cached
client per (cluster, identity) so connection pools are reused across reconciles.
"""

from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient
from stageset.kube.mapping import Resource, RestMapper

__all__ = ["ApiError", "ClientPool", "Identity", "KubeClient", "Resource", "RestMapper"]
