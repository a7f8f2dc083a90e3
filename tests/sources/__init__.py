"""Tests of :mod:`sources` against a real Git server on loopback."""
