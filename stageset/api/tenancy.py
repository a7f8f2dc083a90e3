"""The one label that says which tenant a namespace belongs to.

``stages.metio.wtf/tenant`` is set on a tenant's Namespaces by ``stageset create tenant``
(:mod:`stageset.cli.tenant`) and read by the controller for the ``tenant`` label of its
per-StageSet metrics (:mod:`stageset.controller.tenants`).  Only the Namespace's label counts:
whoever may label a Namespace is the platform, while a StageSet's own labels are the tenant's to
write, so a label on a StageSet never names its tenant.
"""

from __future__ import annotations

from typing import Final

TENANT_LABEL: Final = "stages.metio.wtf/tenant"
