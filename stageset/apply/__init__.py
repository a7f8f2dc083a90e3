"""Staged server-side apply: order within a stage, apply as the tenant, judge readiness."""
