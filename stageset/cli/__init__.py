"""Command line: ``stageset controller`` (production) and ``stageset run`` (local demo)."""

from stageset.cli.main import main

__all__ = ["main"]
