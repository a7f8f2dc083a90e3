"""Manifests from a source tree: plain YAML/JSON or a kustomize overlay, then ``postBuild`` substitution.

Pure functions over ``{relative path: bytes}`` (the stage path's subtree, as read from Git);
no cluster access and no Git here.  The controller reads ``substituteFrom`` ConfigMaps and
Secrets as the tenant, merges them with :func:`merge_variables`, and calls :func:`build_stage`.
"""

from stageset.build.errors import BuildError
from stageset.build.kustomize import KustomizeNotFoundError, ensure_kustomize, locate_kustomize
from stageset.build.render import build_stage, render_manifests
from stageset.build.variables import SubstituteFromNotFoundError, VariableSource, merge_variables, substitute

__all__ = [
    "BuildError",
    "KustomizeNotFoundError",
    "SubstituteFromNotFoundError",
    "VariableSource",
    "build_stage",
    "ensure_kustomize",
    "locate_kustomize",
    "merge_variables",
    "render_manifests",
    "substitute",
]
