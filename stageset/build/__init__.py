"""Manifests from a source tree: YAML/JSON documents under a stage's path, substituted.

Pure functions over ``{relative path: bytes}``; no cluster access and no Git here.
"""

from stageset.build.render import BuildError, render_manifests, substitute

__all__ = ["BuildError", "render_manifests", "substitute"]
