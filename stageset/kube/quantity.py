"""Kubernetes quantities (``2Gi``, ``500M``, ``100m``) as exact decimals: the official client's
parser, behind our own typed name so that nothing outside ``stageset.kube`` imports
``kubernetes``.  Pure: no request is made.
"""

from __future__ import annotations

from decimal import Decimal

from kubernetes.utils import parse_quantity as _parse_quantity


def parse_quantity(text: str) -> Decimal:
    """``text`` as a :class:`~decimal.Decimal`; ``ValueError`` when it is not a quantity."""
    value = _parse_quantity(text)  # type: ignore[no-untyped-call]
    return Decimal(value)
