"""Settings of the apply engine; nested in the controller's settings and injected."""

from __future__ import annotations

from dataclasses import dataclass, field

from stageset.apply.cel import CelLimits
from stageset.apply.rights import DEFAULT_MAX_AGE
from stageset.apply.versions import DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class ApplySettings:
    # Objects of one stage dry-run, written and judged at once.
    parallelism: int = 4
    # How often readiness (and deletion for recreation) is polled while waiting.
    poll_interval: float = 0.5
    # How long a stage waits for the CRDs it applies to become Established.
    crd_timeout: float = 60.0
    # How long ``force: true`` waits for an object to go before creating it again.
    delete_timeout: float = 60.0
    # Bytes the resourceVersions remembered for warm passes may take (stageset/apply/versions.py).
    versions_max_bytes: int = DEFAULT_MAX_BYTES
    # Seconds a periodic pass trusts an identity's shown rights to write a kind in a namespace
    # instead of dry-running one unchanged object there (stageset/apply/rights.py); 0: every pass asks.
    rights_max_age: float = DEFAULT_MAX_AGE
    # What evaluating tenant CEL (readyChecks.exprs) may cost: time per request, memory, workers.
    cel: CelLimits = field(default_factory=CelLimits)
