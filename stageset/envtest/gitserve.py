"""Serve a directory as a Git repository over smart HTTP on loopback (for the demo).

The directory's files are committed into a fresh bare repository with dulwich
(no ``git`` CLI needed) and served by dulwich's WSGI smart-HTTP server in a
background thread.  With ``live=True`` the directory is a working copy: every ref
advertisement (the start of each fetch) first commits the directory again if its
content changed, so an edit saved under it is the next poll's new revision.
Development only: plain HTTP, no authentication.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from dulwich.objects import Blob, Commit, ObjectID, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo
from dulwich.server import BackendRepo, DictBackend
from dulwich.web import make_wsgi_chain


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *_args: object) -> None:
        return


def _tree_for(repo: Repo, directory: Path) -> ObjectID:
    tree = Tree()
    for entry in sorted(directory.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            tree.add(entry.name.encode(), 0o040000, _tree_for(repo, entry))
        elif entry.is_file():
            blob = Blob.from_string(entry.read_bytes())
            repo.object_store.add_object(blob)
            tree.add(entry.name.encode(), 0o100644, blob.id)
    repo.object_store.add_object(tree)
    return tree.id


def commit_directory(repo: Repo, directory: Path, *, branch: str = "main",
                     message: str = "snapshot") -> str:
    """Commit ``directory``'s files as the new tip of ``branch``; returns the commit id."""
    ref = Ref(f"refs/heads/{branch}".encode())
    commit = Commit()
    commit.tree = _tree_for(repo, directory)
    commit.parents = [repo.refs[ref]] if ref in repo.refs else []
    commit.author = commit.committer = b"stageset demo <demo@stageset.invalid>"
    commit.author_time = commit.commit_time = int(time.time())
    commit.author_timezone = commit.commit_timezone = 0
    commit.message = message.encode()
    repo.object_store.add_object(commit)
    repo.refs[ref] = commit.id
    repo.refs.set_symbolic_ref(Ref(b"HEAD"), ref)
    return commit.id.decode()


def refresh(repo: Repo, directory: Path, *, branch: str = "main") -> str | None:
    """Commit ``directory`` again if its content differs from the tip of ``branch``; the new
    commit id, or ``None`` when nothing changed."""
    ref = Ref(f"refs/heads/{branch}".encode())
    tree = _tree_for(repo, directory)
    if ref in repo.refs:
        tip = repo[repo.refs[ref]]
        if isinstance(tip, Commit) and tip.tree == tree:
            return None
    return commit_directory(repo, directory, branch=branch,
                            message=f"{directory.name}/ as of {time.strftime('%H:%M:%S')}")


def _live(app: Any, repo: Repo, directory: Path) -> Any:
    """WSGI middleware: before each ref advertisement, commit the directory if it changed."""
    lock = threading.Lock()

    def middleware(environ: dict[str, Any], start_response: Any) -> Any:
        if str(environ.get("PATH_INFO", "")).endswith("/info/refs"):
            with lock:
                refresh(repo, directory)
        return app(environ, start_response)

    return middleware


@contextlib.contextmanager
def serve_directory(directory: Path, *, name: str = "examples", live: bool = False) -> Iterator[str]:
    """Yield the clone URL of ``directory`` served over smart HTTP on 127.0.0.1 (``live``: see above)."""
    with tempfile.TemporaryDirectory(prefix="stageset-git-") as tmp:
        repo = Repo.init_bare(tmp, mkdir=False)
        commit_directory(repo, directory)
        repos: dict[str, BackendRepo] = {f"/{name}.git": repo}
        app = make_wsgi_chain(DictBackend(repos))
        if live:
            app = _live(app, repo, directory)
        server: WSGIServer = make_server("127.0.0.1", 0, app, handler_class=_QuietHandler)
        thread = threading.Thread(target=server.serve_forever, name="git-http", daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}/{name}.git"
        finally:
            server.shutdown()
            server.server_close()
            repo.close()
