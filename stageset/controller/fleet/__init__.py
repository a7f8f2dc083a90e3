"""FleetRollout: one change across many StageSets, in waves (the decision is :mod:`.decide`)."""
