"""The kinds this controller serves, as the apiserver names them (``stages.metio.wtf/v1``).

Identity: none; these are names.  The manager knows neither: each reconciler's declaration
(:mod:`stageset.controller.setup`) says which it is ``For`` and which it watches.
"""

from __future__ import annotations

from stageset.api import GROUP, VERSION
from stageset.kube.mapping import Resource

STAGESETS = Resource(group=GROUP, version=VERSION, kind="StageSet", plural="stagesets", namespaced=True)
GITREPOSITORIES = Resource(group=GROUP, version=VERSION, kind="GitRepository",
                           plural="gitrepositories", namespaced=True)
STAGETARGETS = Resource(group=GROUP, version=VERSION, kind="StageTarget", plural="stagetargets",
                        namespaced=True)
SECRETS = Resource(group="", version="v1", kind="Secret", plural="secrets", namespaced=True)
"""Watched metadata-only in the target namespaces (a kubeconfig Secret changed), never cached."""
CONFIGMAPS = Resource(group="", version="v1", kind="ConfigMap", plural="configmaps", namespaced=True)
"""Watched metadata-only in the target namespaces with workload identity on (a StageTarget's
workload-identity ConfigMap changed), never cached."""
FLEETROLLOUTS = Resource(group=GROUP, version=VERSION, kind="FleetRollout", plural="fleetrollouts",
                         namespaced=False)
