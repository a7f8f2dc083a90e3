"""Command line: ``stageset controller`` (production), the user commands, and ``stageset run`` (local demo).

The entry point is :func:`stageset.cli.root.main` (each command loaded when it runs).  This package
imports nothing itself, so that importing a pure module below it (the dashboard's views, say) does
not load every command and the Kubernetes client with it.
"""
