"""What one pass works on, fixed for the pass: the StageSet, its target, its writer.

A :class:`PassContext` is made once by the pass runner
(:class:`~stageset.controller.stageset.passes.PassRunner`) and handed, unchanged, to every step
and to release steering (:class:`~stageset.controller.stageset.release.Release`).  What the pass
*learns* is not here: that is the :class:`~stageset.controller.stageset.progress.Progress` value
each step takes and returns anew, a local value of the runner.

Identity: nothing here acts.  The target's clients are used as each stage's identity (derived per
stage, carried by :class:`~stageset.controller.stageset.rendering.Rendered`); the writer writes as
the controller.

A remote target cluster that fails part-way through a pass ends it with a short condition and the
stages as they stood then: :func:`interruptible` turns its error into :class:`Interrupted`, which
carries the progress the failing step had made (the runner writes it; the progress stays a value
nobody else assigns).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from stageset.api import StageSet
from stageset.controller.redact import Redactor
from stageset.controller.render.cache import StageDecryption
from stageset.controller.stageset.progress import Progress
from stageset.controller.stageset.supersedes import NOTHING, Letting, Taking
from stageset.controller.stageset.writer import PassWriter
from stageset.controller.targets.clusters import Target
from stageset.kube.client import ApiError, UnreachableError


@dataclass(frozen=True)
class PassContext:
    """What one pass works on (the writer is the pass's one way to write; it is not a value)."""

    writer: PassWriter
    stageset: StageSet
    target: Target
    redactor: Redactor
    retry: float
    """``spec.retryInterval`` in seconds: when a failed pass runs again."""
    decryption: StageDecryption | None
    """``spec.decryption`` for this pass (the key Secret read at most once, as the StageSet)."""
    taking: Taking = field(default_factory=Taking)
    """What this pass takes over from the StageSets its ``spec.supersedes`` names."""
    letting: Letting = NOTHING
    """What this StageSet handed over to StageSets that supersede it: never applied, listed or pruned."""

    @property
    def ref(self) -> tuple[str, str]:
        """The StageSet's namespace and name."""
        return str(self.stageset.metadata["namespace"]), str(self.stageset.metadata["name"])


class Interrupted(Exception):
    """The pass's remote target cluster failed part-way: the error, and where the pass stood."""

    def __init__(self, error: UnreachableError | ApiError, progress: Progress) -> None:
        super().__init__(str(error))
        self.error = error
        self.progress = progress


@contextlib.contextmanager
def interruptible(ctx: PassContext, where: Callable[[], Progress]) -> Iterator[None]:
    """Within the block, a remote target cluster that fails interrupts the pass with ``where()``:
    the progress as it stood when it failed (``where`` reads the step's local value then).  A local
    cluster's errors, and an :class:`Interrupted` from an inner step, pass through unchanged."""
    try:
        yield
    except (UnreachableError, ApiError) as error:
        if not ctx.target.remote:
            raise
        raise Interrupted(error, where()) from error
