"""Hostile Git inputs, each fetched (and read) in a fresh process that reports its memory.

Why a subprocess: a test process carries pytest, other tests' garbage and a Git server's
threads, so its RSS says little; a fresh interpreter that imports :mod:`sources`, measures
``VmRSS``, runs one fetch and read, collects garbage and measures again, gives the
before / peak (``VmHWM``) / after figures docs/security.md reports.  Used by
``tests/sources/test_git_memory.py`` (bounds asserted) and ``bench/git_fetch.py
--hostile`` (the table).

Run by hand: ``python -m tests.sources.memprobe '{"url": ..., "ref": {...}}'``.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.gitserver import GitServer, Zeros

MiB = 1024 * 1024


def _status(key: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Run in the child: fetch ``spec["url"]`` (and read it), report memory in MiB."""
    from sources import Limits, MirrorStore, RefSelector, SourceError, UrlPolicy

    root = Path(tempfile.mkdtemp(prefix="memprobe-"))
    store = MirrorStore(root=root, policy=UrlPolicy(allow_http=True),
                        limits=Limits(**spec.get("limits", {})))
    gc.collect()
    before = _status("VmRSS")
    started = time.monotonic()
    outcome = "ok"
    try:
        snapshot = store.fetch(spec["url"], ref=RefSelector(**spec.get("ref", {})),
                               timeout=spec.get("timeout", 120))
        files = store.read_tree(spec["url"], commit=snapshot.commit, path=spec.get("path", "./"),
                                ignore=spec.get("ignore"))
        outcome = f"ok: {len(files)} files read"
        del files
    except SourceError as error:
        outcome = f"{type(error).__name__}: {error}"
    seconds = time.monotonic() - started
    gc.collect()
    return {"before": before, "peak": _status("VmHWM"), "after": _status("VmRSS"),
            "seconds": seconds, "outcome": outcome}


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run :func:`probe` in a fresh interpreter; its report."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-m", "tests.sources.memprobe", json.dumps(spec)],
                            capture_output=True, timeout=600, cwd=root, check=False,
                            env={**os.environ, "PYTHONPATH": str(root)})
    if result.returncode != 0:
        raise RuntimeError(f"memprobe failed: {result.stderr.decode()[-3000:]}")
    report: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return report


# -- the hostile inputs ----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    attack: str
    spec: dict[str, Any]


def _endless_listing(stop: threading.Event) -> int:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)

    def handle(connection: socket.socket) -> None:
        try:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-git-upload-pack-"
                               b"advertisement\r\n\r\n001e# service=git-upload-pack\n0000")
            first = b"1" * 40 + b" HEAD\0side-band-64k ofs-delta\n"
            connection.sendall(f"{len(first) + 4:04x}".encode() + first)
            payload = b"1" * 40 + b" refs/heads/" + b"b" * 10 + b"\n"
            block = (f"{len(payload) + 4:04x}".encode() + payload) * 4096
            while not stop.is_set():
                connection.sendall(block)
        except OSError:
            pass
        finally:
            connection.close()

    def serve() -> None:
        with listener:
            while not stop.is_set():
                try:
                    connection = listener.accept()[0]
                except OSError:
                    continue
                threading.Thread(target=handle, args=(connection,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    port: int = listener.getsockname()[1]
    return port


def _tree_bomb(server: GitServer, name: str) -> None:
    blob = server.git(name, "hash-object", "-w", "--stdin", input=b"kind: ConfigMap\n")
    tree = server.git(name, "mktree", input=b"".join(
        f"100644 blob {blob}\tf{i}.png\n".encode() for i in range(20)))
    for _ in range(5):
        tree = server.git(name, "mktree", input=b"".join(
            f"040000 tree {tree}\td{i}\n".encode() for i in range(20)))
    server.set_ref(name, "refs/heads/main", server.git(name, "commit-tree", tree, "-m", "bomb"))


def _distinct_big_blobs(server: GitServer, name: str, *, count: int, size: int) -> None:
    """``count`` different blobs of ``size`` bytes (mostly zeros: cheap to pack)."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="memprobe-blobs-") as tmp:
        for i in range(count):
            path = Path(tmp) / f"b{i}"
            with path.open("wb") as handle:
                handle.truncate(size - 8)
                handle.seek(size - 8)
                handle.write(i.to_bytes(8, "big"))
            lines.append(f"100644 {server.git(name, 'hash-object', '-w', str(path))}\t"
                         f"data/b{i:03d}.bin")
            path.unlink()
    index = {"GIT_INDEX_FILE": str(server.root / f"{name}.index")}
    server.git(name, "read-tree", "main", env=index)
    server.git(name, "update-index", "--index-info", input=("\n".join(lines) + "\n").encode(),
               env=index)
    tree = server.git(name, "write-tree", env=index)
    commit = server.git(name, "commit-tree", tree, "-p", "main", "-m", "big")
    server.set_ref(name, "refs/heads/main", commit)


@contextmanager
def hostile_cases(*, quick: bool = False) -> Iterator[list[Case]]:
    """Servers on loopback with every hostile input; the cases to probe against them."""
    stop = threading.Event()
    with GitServer() as server:
        server.create_repo("zeros-unfiltered", {"deploy/app.yaml": "a: 1\n"})
        server.commit("zeros-unfiltered", {"deploy/blob.bin": Zeros(450 * MiB)})
        server.configure("zeros-unfiltered", "uploadpack.allowFilter", "false")
        server.create_repo("zeros-filtered", {"deploy/app.yaml": "a: 1\n"})
        server.commit("zeros-filtered", {"deploy/blob.bin": Zeros(450 * MiB)})
        server.create_repo("many-files", {"README.md": "many\n"})
        server.import_files("many-files", ((f"deploy/d{i // 1000:03d}/f{i:06d}.yaml",
                                            b"n: %d\n" % i) for i in range(100_000)))
        server.create_repo("tree-bomb")
        _tree_bomb(server, "tree-bomb")
        server.create_repo("wide-pack", {"deploy/app.yaml": "a: 1\n"})
        _distinct_big_blobs(server, "wide-pack", count=8 if quick else 55,
                            size=10 * MiB - 4096)
        server.configure("wide-pack", "uploadpack.allowFilter", "false")
        long_name = "a" * 3000
        server.create_repo("redos", {f"deploy/{long_name}": "x\n", "deploy/app.yaml": "a\n"})
        listing_port = _endless_listing(stop)
        wide_limits = {"max_fetch_bytes": 64 * MiB} if quick else {}
        cases = [
            Case("450 MB blob of zeros, server without partial clone",
                 "a blob that packs to ~450 KB and inflates to 450 MB",
                 {"url": server.url("zeros-unfiltered")}),
            Case("450 MB blob of zeros, server with partial clone",
                 "the same blob where the server honours blob:limit",
                 {"url": server.url("zeros-filtered")}),
            Case("100 000 files", "a commit with 100 000 small files",
                 {"url": server.url("many-files")}),
            Case("tree bomb (64 million paths)",
                 "6 levels of 20 entries pointing at one subtree",
                 {"url": server.url("tree-bomb")}),
            Case("wide pack (55 distinct 10 MB blobs)" if not quick else "wide pack",
                 "many objects each under the per-file limit, too many together",
                 {"url": server.url("wide-pack"), "limits": wide_limits}),
            Case("endless ref listing", "a server that streams refs forever",
                 {"url": f"http://127.0.0.1:{listing_port}/app.git"}),
            Case("catastrophic ignore pattern",
                 "spec.ignore '*a*a…a b' (18 stars) and a 3000-character file name",
                 {"url": server.url("redos"), "ignore": "*a" * 18 + " b\n"}),
        ]
        try:
            yield cases
        finally:
            stop.set()


def table(rows: list[tuple[Case, dict[str, Any]]]) -> str:
    """The Markdown table of docs/security.md."""
    lines = ["| hostile input | outcome | RSS before | peak | after | time |",
             "| --- | --- | --- | --- | --- | --- |"]
    for case, report in rows:
        outcome = report["outcome"].split(":")[0]
        lines.append(f"| {case.name} | {outcome} | {report['before']:.0f} MiB | "
                     f"{report['peak']:.0f} MiB | {report['after']:.0f} MiB | "
                     f"{report['seconds']:.1f} s |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    print(json.dumps(probe(json.loads(argv[0]))))
    return 0


ALL: Callable[..., Any] = hostile_cases

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
