"""Benchmarks, run as modules from the checkout's root: ``python -m bench.<name>``."""
