"""The user's own kubeconfig, as the CLI reads it: its contexts, and the error a bad one raises.

The official client's loader behind our own names, so that nothing outside ``stageset.kube``
imports ``kubernetes``.  Identity: none — it reads the user's own kubeconfig file and makes no
request.  A tenant's kubeconfig (``spec.kubeConfig``) is never read here:
:mod:`stageset.kube.remote` makes that one harmless.
"""

from __future__ import annotations

from typing import Any

from kubernetes import config as _config
from kubernetes.config.config_exception import ConfigException

__all__ = ["ConfigException", "list_contexts"]


def list_contexts(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every context of the kubeconfig at ``path`` (files separated by ``os.pathsep`` merge), and
    the current one."""
    contexts, current = _config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    return list(contexts), dict(current)
