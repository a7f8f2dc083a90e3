"""The one error a stage fails with: a Ready reason from the status vocabulary and a message.

Raised by the apply engine, prune and the controller's tenant reads alike; the
reconciler turns it into the stage's phase and the StageSet's ``Ready`` condition.
Messages name only what the user wrote (objects, files, identities), never values
read from Secrets and never anything read from a namespace the tenant cannot read.
"""

from __future__ import annotations

from stageset.api.vocabulary import Reason


class StageError(Exception):
    """The stage (or the StageSet) cannot go on; ``reason`` is the Ready reason to report."""

    def __init__(self, reason: Reason, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message
