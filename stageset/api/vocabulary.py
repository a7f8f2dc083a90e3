"""The words our status speaks: condition types, Ready reasons, stage phases, event reasons.

One ``StrEnum`` per concept, so a reason is a name the type checker knows rather than
a string typed twice.  The values are the wire strings and never change: users match
on them (``kubectl wait``, alerts), and Ready reasons reuse Flux's strings wherever
the meaning is the same.
"""

from __future__ import annotations

from enum import StrEnum


class ConditionType(StrEnum):
    """kstatus condition types."""

    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"
    DRIFTED = "Drifted"
    """StageSet, ``driftDetection.mode: Warn``: objects were left as someone else changed them."""


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Reason(StrEnum):
    """Reasons of the ``Ready`` condition (and of the ``Reconciling``/``Stalled`` beside it)."""

    # Both kinds
    SUCCEEDED = "Succeeded"
    SUSPENDED = "Suspended"
    INVALID_SPEC = "InvalidSpec"
    RBAC_DENIED = "RBACDenied"
    PROGRESSING = "Progressing"
    # StageSet
    SOURCE_NOT_READY = "SourceNotReady"
    ARTIFACT_NOT_FOUND = "ArtifactNotFound"
    RESOLVE_FAILED = "ResolveFailed"
    DEPENDENCY_NOT_READY = "DependencyNotReady"
    STALLED = "Stalled"
    STAGE_FAILED = "StageFailed"
    STAGE_PROGRESSING = "StageProgressing"
    CLUSTER_UNREACHABLE = "ClusterUnreachable"
    INVENTORY_INCOMPLETE = "InventoryIncomplete"
    """Status had no inventory and the cluster could not be searched completely: nothing pruned."""
    TARGET_NOT_AVAILABLE = "TargetNotAvailable"
    """``spec.targetRef`` names no StageTarget this StageSet may use (missing, outside the target
    namespaces, or not allowing its namespace: one message for all); nothing is sent to any cluster."""
    OWNERSHIP_CONFLICT = "OwnershipConflict"
    """A stage renders (or an ``apply`` action would write) an object another live StageSet owns: it
    writes nothing until it is released."""
    DRIFT_DETECTED = "DriftDetected"
    """The reason of the ``Drifted`` condition (never of ``Ready``): objects differ from what was applied."""
    SUPERSEDE_DENIED = "SupersedeDenied"
    """``spec.supersedes`` names a StageSet this StageSet's ServiceAccount may not read or patch: nothing
    is applied, and that StageSet keeps everything it holds."""
    RECONCILIATION_FAILED = "ReconciliationFailed"
    """A pass failed in a way no other reason names (Flux's word): nothing more is applied until a
    pass succeeds; retried with backoff."""
    # Steering a release (the reference's words; none of them is a failure but the last two)
    SOAKING = "Soaking"
    """A stage is Ready and soaking: its dependents start when the soak ends."""
    AWAITING_PROMOTION = "AwaitingPromotion"
    """A stage is Ready and waits for ``stageset promote``: its dependents wait too."""
    UPDATE_DEFERRED = "UpdateDeferred"
    """An update window holds a new revision back (Ready stays True when the applied one is Ready)."""
    ROLLED_BACK = "RolledBack"
    """A release failed and was rolled back to the last good revisions."""
    PREVIOUS_REVISION_UNAVAILABLE = "PreviousRevisionUnavailable"
    """A release failed and its last good revisions cannot be restored: nothing was rolled back."""
    ACTION_FAILED = "ActionFailed"
    """A stage's ``pre`` or ``post`` action failed (a ``pre`` failure applied nothing)."""
    # FleetRollout
    HALTED = "Halted"
    """A member of an open wave failed: no later wave opens until a new revision arrives."""
    MEMBERS_UNASSIGNED = "MembersUnassigned"
    """A selected StageSet is in no wave (or in several): it applies no new revision until assigned."""
    MEMBERS_CONTESTED = "MembersContested"
    """A StageSet is selected by two FleetRollouts: it applies no new revision until one lets go."""
    COMPLETED = "Completed"
    """Every wave is Ready at the newest revisions."""
    # GitRepository
    AUTHENTICATION_FAILED = "AuthenticationFailed"
    REF_NOT_FOUND = "RefNotFound"
    LIMIT_EXCEEDED = "LimitExceeded"
    INVALID_URL = "InvalidURL"
    UNSAFE_PATH = "UnsafePath"
    GIT_OPERATION_FAILED = "GitOperationFailed"
    SECRET_NOT_FOUND = "SecretNotFound"  # noqa: S105 - a reason, not a password
    FAILED = "Failed"
    # Label shards (written by the main shard on objects whose shard key no shard serves)
    NO_SHARD = "NoShard"


class StagePhase(StrEnum):
    """Where one stage stands (``status.stages[].phase``)."""

    PENDING = "Pending"
    """Not started: a dependency is not Ready yet, or its source has no artifact."""
    APPLYING = "Applying"
    """Being applied in this pass."""
    WAITING = "Waiting"
    """Applied; waiting for its objects to become ready, within its timeout."""
    READY = "Ready"
    PROGRESSING = "Progressing"
    """Applied, still not ready when its timeout ran out: held, its dependents wait."""
    FAILED = "Failed"


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


EVENT_REVISION_ANNOTATION = "stages.metio.wtf/revision"
"""The annotation of an Event naming the revision it is about (set by the controller's recorder;
read by notifications for a commit's status, and by the dashboard)."""


class EventReason(StrEnum):
    """Reasons of the Events the controller records (besides a Ready reason on a Warning when
    Ready turns False)."""

    RECONCILIATION_SUCCEEDED = "ReconciliationSucceeded"
    NEW_ARTIFACT = "NewArtifact"
    DRIFT_CORRECTED = "DriftCorrected"
    DRIFT_DETECTED = "DriftDetected"
    """``driftDetection.mode: Warn``: objects were changed by someone else and left so (once per drift)."""
    PRUNE_FAILED = "PruneFailed"
    TEARDOWN_FORCED = "TeardownForced"
    ORPHANED = "Orphaned"
    """A deleted StageSet left a ``prune: false`` stage's objects in place (owner labels removed)."""
    RETARGETED = "Retargeted"
    """The stages moved to another cluster: applied and Ready there, then removed from the previous one
    (released, under ``deletionPolicy: Orphan``)."""
    RETARGET_ABANDONED = "RetargetAbandoned"
    """A move's cleanup of the previous cluster was given up after ``--max-teardown-wait``."""
    PROMOTED = "Promoted"
    """A stage passed its promotion gate (soak ended, or promoted by hand)."""
    AWAITING_PROMOTION = "AwaitingPromotion"
    """A stage is Ready at a new revision and waits for ``stageset promote`` (told once per revision,
    so a notification reaches whoever must promote)."""
    PROMOTION_IGNORED = "PromotionIgnored"
    """A ``stages.metio.wtf/promote`` request named a stage that was not waiting for one."""
    UPDATE_DEFERRED = "UpdateDeferred"
    """An update window holds a new revision back."""
    UPDATE_OVERRIDDEN = "UpdateOverridden"
    """``stages.metio.wtf/update-now`` shipped held revisions despite the update windows."""
    ROLLED_BACK = "RolledBack"
    """A failed release was rolled back to its last good revisions."""
    ACTION_SUCCEEDED = "ActionSucceeded"
    """A stage's action completed (``pre``, ``post`` or ``onFailure``)."""
    ACTION_FAILED = "ActionFailed"
    """A stage's action failed (an ``onFailure`` action's failure is only this event)."""
    WAVE_OPENED = "WaveOpened"
    """A FleetRollout opened a wave: its members ship the new revisions."""
    ROLLOUT_HALTED = "RolloutHalted"
    """A member of an open wave failed: the FleetRollout opens no further wave."""
    ROLLOUT_COMPLETED = "RolloutCompleted"
    """Every wave of a FleetRollout is Ready at the newest revisions."""
    TAKEN_OVER = "TakenOver"
    """A stage took over objects of a StageSet its ``spec.supersedes`` names, in place (same objects)."""
    HANDED_OVER = "HandedOver"
    """A StageSet let objects go that a StageSet naming it in ``spec.supersedes`` took over."""
    SUSPENDED = "Suspended"
    """``spec.suspend`` turned true: nothing is applied until it is resumed (a Normal event: a
    deliberate state, not a failure)."""
    RESUMED = "Resumed"
    """``spec.suspend`` turned false again: reconciling resumes."""


# Ready reasons without the Warning event a Ready condition turning False gets: a release held as
# asked (soaking, awaiting a promotion, deferred) is not a failure, a rollback (a fleet's halt) is
# told by the reconciler itself (a RolledBack / RolloutHalted event naming what failed), and a
# suspend is a state someone chose (told by a Normal Suspended / Resumed event instead).
NO_TRANSITION_EVENT = frozenset({Reason.SOAKING, Reason.AWAITING_PROMOTION, Reason.UPDATE_DEFERRED,
                                 Reason.ROLLED_BACK, Reason.HALTED, Reason.SUSPENDED})
