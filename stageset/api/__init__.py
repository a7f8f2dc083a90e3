"""Our kinds, ``StageSet``, ``GitRepository`` and ``StageTarget`` (``stages.metio.wtf/v1``), as
pydantic models.

This is the bottom layer of the reconciler: it knows nothing about clients or
clusters.  Parse live objects with ``StageSet.model_validate(raw)`` and write them
back with ``model_dump(by_alias=True, exclude_none=True)``.  The CRDs under
``crds/`` are generated from these models by ``python -m stageset.api.crd`` (not
imported here, so that ``-m`` runs it cleanly).
"""

from stageset.api.common import (
    API_VERSION,
    GROUP,
    THIS_CLUSTER,
    VERSION,
    Condition,
    LocalObjectRef,
    SecretKeyRef,
    duration_seconds,
    format_time,
    parse_time,
)
from stageset.api.gitrepository import (
    Artifact,
    GitRef,
    GitRepository,
    GitRepositorySpec,
    GitRepositoryStatus,
)
from stageset.api.sourceref import SourceRef
from stageset.api.stageset import (
    AppliedTarget,
    Decryption,
    DecryptionProvider,
    DependencyRef,
    DriftDetection,
    DriftedObject,
    DriftMode,
    InventoryEntry,
    KubeConfigRef,
    ObjectRef,
    PostBuild,
    PreviousTargets,
    ReadyChecks,
    Stage,
    StageInventory,
    StageSet,
    StageSetRef,
    StageSetSpec,
    StageSetStatus,
    StageStatus,
    SubstituteRef,
    SupersededRef,
)
from stageset.api.target import StageTarget, StageTargetSpec, StageTargetStatus, TargetRef

__all__ = [
    "API_VERSION",
    "GROUP",
    "THIS_CLUSTER",
    "VERSION",
    "AppliedTarget",
    "Artifact",
    "Condition",
    "Decryption",
    "DecryptionProvider",
    "DependencyRef",
    "DriftDetection",
    "DriftMode",
    "DriftedObject",
    "GitRef",
    "GitRepository",
    "GitRepositorySpec",
    "GitRepositoryStatus",
    "InventoryEntry",
    "KubeConfigRef",
    "LocalObjectRef",
    "ObjectRef",
    "PostBuild",
    "PreviousTargets",
    "ReadyChecks",
    "SecretKeyRef",
    "SourceRef",
    "Stage",
    "StageInventory",
    "StageSet",
    "StageSetRef",
    "StageSetSpec",
    "StageSetStatus",
    "StageStatus",
    "StageTarget",
    "StageTargetSpec",
    "StageTargetStatus",
    "SubstituteRef",
    "SupersededRef",
    "TargetRef",
    "duration_seconds",
    "format_time",
    "parse_time",
]
