"""What a reconcile tells the work queue, as controller-runtime's ``reconcile.Result``.

- return ``Result(requeue_after=s)``: done; come back in ``s`` seconds (``None``: only
  when the object changes).  The key's error backoff is forgotten.
- return ``Result(requeue_after=s, wanted=f)``: as above, but the requeue is dropped if ``f()``
  is false when it is due (what it waited for ended sooner: a StageSet whose held first word was
  said, :mod:`stageset.controller.stageset.holding`).
- return ``Result(backoff=True)``: a failure already reported in status (e.g. a remote
  cluster that does not answer); retry with the key's exponential backoff — never later than
  ``requeue_after`` when that is set too (a source keeps polling at least at its interval).
- raise :class:`TerminalError`: retrying cannot help until the object changes; not
  requeued.
- raise anything else: a bug or an unexpected failure; logged and retried with backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    requeue_after: float | None = None
    backoff: bool = False
    wanted: Callable[[], bool] | None = None


class TerminalError(Exception):
    """The object cannot be reconciled until it changes; the reconcile is not retried."""
