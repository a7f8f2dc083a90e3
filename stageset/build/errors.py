"""The one error type of stageset.build."""

from __future__ import annotations


class BuildError(ValueError):
    """The stage's source cannot be turned into manifests; the message says where and why.

    Messages name files, objects, fields and variable names, never variable values.
    """
