"""Hypothesis profiles for the fuzz tests.

The test command runs a fixed number of examples per property, derandomized (the same
examples on every run: a failure is reproducible, and the run's length is known).  For a
long local run set ``STAGESET_FUZZ=long`` (10,000 examples per property, random seeds, the
failures Hypothesis finds kept in ``.hypothesis/``)::

    STAGESET_FUZZ=long .venv/bin/pytest tests/fuzz -p no:cacheprovider
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                 HealthCheck.data_too_large])
settings.register_profile("long", max_examples=10_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                 HealthCheck.data_too_large])
settings.load_profile("long" if os.environ.get("STAGESET_FUZZ") == "long" else "ci")
