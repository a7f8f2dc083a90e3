"""Deletion for recreation: an object whose immutable change the conflict policy recreates goes first.

Prune and teardown delete elsewhere (:mod:`stageset.apply.prune`, with the owner check); this is
the engine's own delete, of an object the stage is about to write again (``force: true`` or
``conflictPolicy: Recreate``), so it waits until the object is gone.

Identity: the delete and the reads that wait for it go through the ``client`` handed in (the
stage's identity).

Invariants:
- Propagation is Background: the object goes at once, the garbage collector removes its dependents.
- The wait is bounded by ``delete_timeout``: an object still there then fails the stage, and
  nothing is created in its place.
"""

from __future__ import annotations

import time

from stageset.api.vocabulary import Reason
from stageset.apply.core import AppliedObject, ApplyCore, apply_error
from stageset.apply.errors import StageError
from stageset.apply.inventory import describe
from stageset.kube.client import ApiError, KubeClient


def delete_for_recreation(core: ApplyCore, *, client: KubeClient, item: AppliedObject) -> None:
    """Delete ``item`` and wait until it is gone; raise :class:`StageError` if it is refused or stays."""
    try:
        client.delete(item.path, propagation="Background")
    except ApiError as error:
        if not error.not_found:
            raise apply_error(item, error, client.identity.describe()) from error
    deadline = time.monotonic() + core.settings.delete_timeout
    while time.monotonic() < deadline:
        try:
            client.get(item.path)
        except ApiError as error:
            if error.not_found:
                return
            raise
        time.sleep(core.settings.poll_interval)
    raise StageError(Reason.STAGE_FAILED,
                     f"{describe(item.manifest)} was not deleted for recreation in time")
