"""``sourceRef``: where a stage's (or an action's) manifests come from.  Pure schema.

Its own module because both :mod:`stageset.api.stageset` (a stage) and :mod:`stageset.api.actions`
(a ``job`` or ``apply`` action) name sources the same way.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from stageset.api.common import ApiModel, DNSLabel, DNSSubdomain

_SHORT = Annotated[str, Field(min_length=1, max_length=253)]


class SourceRef(ApiModel):
    """The source a stage's manifests come from: our ``GitRepository``, a Flux source
    (``source.toolkit.fluxcd.io``: ``ExternalArtifact``, ``GitRepository``, ``OCIRepository``,
    ``Bucket``) whose artifact is downloaded and verified, or a producer of an ``ExternalArtifact``.

    What omitted fields mean depends on the controller's ``--default-source-kind``: by default an
    omitted ``kind`` is our ``GitRepository`` (``stages.metio.wtf/v1``); with
    ``--default-source-kind=ExternalArtifact`` it is Flux's ``ExternalArtifact``
    (``source.toolkit.fluxcd.io/v1``), the reference controller's default.
    """

    api_version: _SHORT | None = None
    """API version of the source.  Left out: ``stages.metio.wtf/v1`` for ``GitRepository`` and
    ``source.toolkit.fluxcd.io/v1`` for ``ExternalArtifact``, ``OCIRepository`` and ``Bucket``; with
    ``--default-source-kind=ExternalArtifact``, ``source.toolkit.fluxcd.io/v1`` for every kind (write
    ``stages.metio.wtf/v1`` to name our GitRepository there).  Required for a producer kind."""
    kind: _SHORT | None = None
    """Kind of the source.  Left out: ``GitRepository`` (ours); with
    ``--default-source-kind=ExternalArtifact``, ``ExternalArtifact`` (Flux's, as in the reference).  A
    kind that is not a source kind names a producer: the stage reads the ``ExternalArtifact`` in the
    same namespace whose ``spec.sourceRef`` points at it."""
    name: DNSSubdomain
    """Name of the source."""
    namespace: DNSLabel | None = None
    """Namespace of the source; defaults to the StageSet's namespace."""
