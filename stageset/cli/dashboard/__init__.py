"""``stageset dashboard``: a live, read-only web view of StageSets, started by the user.

Identity: the user's own kubeconfig credentials, for reads only (``GET``: lists, watches,
discovery); it never impersonates and never writes, so it shows exactly what the user may read.
The shared dashboard (``--login``) has no credentials of its own: each signed-in person's pages
are read (and acted from) with the bearer token that person pasted, and nothing else.

- :mod:`~stageset.cli.dashboard.command` the click command: the address (loopback unless
  ``--allow-remote``), the scope (``-n``/``-A``), the server (uvicorn);
- :mod:`~stageset.cli.dashboard.hub` the watches, one per kind and namespace, shared by every page;
- :mod:`~stageset.cli.dashboard.views` what the pages show (pure), :mod:`~.layout` where the stage
  graph's nodes go (pure), :mod:`~.diffs` each stage's last change from the controller's events (pure);
- :mod:`~stageset.cli.dashboard.login` sign-in with a bearer token and the bounded, expiring
  login store; :mod:`~stageset.cli.dashboard.shared` the shared dashboard's routing (the login
  pages, then each login's own pages);
- :mod:`~stageset.cli.dashboard.app` the Starlette application: pages, live streams, headers;
  ``templates/`` (Jinja2, autoescaped) and ``static/`` (one stylesheet, one script; nothing from a CDN).
"""

from typing import Any

__all__ = ["dashboard"]


def __getattr__(name: str) -> Any:
    # Lazily: the pure modules of this package import without the command, its server and client.
    if name == "dashboard":
        from stageset.cli.dashboard.command import dashboard

        return dashboard
    raise AttributeError(name)
