"""Manifests from a source tree: kustomize builds or plain YAML/JSON, then ``postBuild`` substitution.

Pure functions over ``{relative path: bytes}`` (the whole source root, as read from Git)
and a stage path in it; no cluster access and no Git here.  The controller reads
``substituteFrom`` ConfigMaps and Secrets as the tenant, merges them with
:func:`merge_variables`, and renders through :func:`prepare` and :func:`render` (the
render cache keys on :meth:`Prepared.digest` in between), or :func:`build_stage`.
Identity: none — nothing here talks to a cluster or a Git server; kustomize runs as a
subprocess of the controller with no network and no view of the filesystem.
"""

from stageset.build.errors import BuildError
from stageset.build.kustomize import KustomizeNotFoundError, ensure_builder, ensure_kustomize, locate_builder
from stageset.build.limits import BuildLimits
from stageset.build.render import Prepared, build_stage, prepare, render
from stageset.build.variables import SubstituteFromNotFoundError, VariableSource, merge_variables, substitute

__all__ = [
    "BuildError",
    "BuildLimits",
    "KustomizeNotFoundError",
    "Prepared",
    "SubstituteFromNotFoundError",
    "VariableSource",
    "build_stage",
    "ensure_builder",
    "ensure_kustomize",
    "locate_builder",
    "merge_variables",
    "prepare",
    "render",
    "substitute",
]
