"""Benchmark of :mod:`sources` against a real Git smart-HTTP server on loopback.

Run from the checkout's root::

    .venv/bin/python -m bench.git_fetch            # full run (~1 minute)
    .venv/bin/python -m bench.git_fetch --quick    # smaller repository, fewer rounds

It reports, as a Markdown table:

* **fetch + extract vs git CLI**: a cold ``MirrorStore.fetch`` of a repository plus
  ``read_tree`` of its whole tree into memory, against ``git clone --depth 1`` (which
  checks the same commit out to disk) from the same server; medians of several rounds,
  and their ratio (below 1 is faster than git).  The transfer alone is compared too
  (``git clone --no-checkout``), since git's checkout is mostly disk writes;
* **no-op poll**: ``fetch`` when nothing changed — time, and HTTP requests the server saw
  (over SSH too when ``sshd`` is installed: time and SSH sessions);
* **fan-in**: 200 callers ("GitRepositories") on 200 threads pointing at 5 URLs, with
  different spellings of the URL and of the ref, after one new commit per URL: how many
  pack fetches reach the server (target: exactly 5) and how many ``ls-refs`` (one per
  caller: each caller's credentials are checked by the remote);
* **many cold mirrors** (``--mirrors K``, default 200): K repositories of 5 small files each
  (the ``pairs`` shape of ``bench.scale``: every StageSet with its own repository), each fetched
  cold into a mirror of its own and its stage path read, on 4 threads (the controller's default
  source workers): wall and this process's CPU per mirror, and the ``fsync`` calls made
  (``os.fsync``, counted by wrapping it for the run).  ``--only-mirrors`` runs only this part,
  for whole-process A/B runs of two checkouts;
* **resources**: the mirrors' disk use and this process's RSS (now and peak).

``--hostile`` instead fetches and reads each hostile input of ``tests/sources/memprobe.py``
(a 450 MB blob of zeros, 100 000 files, a tree bomb, a pack of many big blobs, an endless
ref listing, a catastrophic ignore pattern) in a fresh process and prints its RSS before,
at peak and after, and the outcome (the table in docs/security.md).

The Git server is ``tests/gitserver.py`` (``git http-backend`` behind ``http.server``), so
absolute times include a CGI process per request on both sides of each comparison.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sources import Credentials, Limits, MirrorStore, RefSelector, UrlPolicy
from tests.gitserver import GitServer

POLICY = UrlPolicy(allow_http=True)
LIMITS = Limits(max_files=100_000, max_file_bytes=10 * 1024 * 1024,
                max_total_bytes=1024 * 1024 * 1024)


def _files(count: int, size: int) -> Iterator[tuple[str, bytes]]:
    """``count`` distinct YAML-ish files of about ``size`` bytes in 100-file directories."""
    for i in range(count):
        body = (f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\ndata:\n"
                f"  value: \"{i}\"\n").encode()
        pad = os.urandom(max(0, (size - len(body)) // 2)).hex().encode()
        yield f"deploy/d{i // 100:03d}/cm-{i:05d}.yaml", body + b"  pad: " + pad + b"\n"


def _median_seconds(action: Callable[[], object], rounds: int) -> float:
    """Median wall time of ``action``; a callable it returns is run afterwards, untimed
    (clean-up such as deleting a checkout is not part of what is measured)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        after = action()
        times.append(time.perf_counter() - start)
        if callable(after):
            after()
    return statistics.median(times)


def _rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process, MiB."""
    current = 0.0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return current, peak


def _disk_mib(path: Path) -> float:
    total = 0
    for directory, _, names in os.walk(path):
        for name in names:
            total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total / (1024 * 1024)


def bench_fetch_vs_git(server: GitServer, work: Path, *, files: int, size: int,
                       rounds: int) -> list[tuple[str, str]]:
    url = server.create_repo("big", {"README.md": "bench\n"})
    server.import_files("big", _files(files, size))
    for i in range(3):  # a little history, which a shallow fetch must not pay for
        server.commit("big", {f"deploy/d000/cm-{i:05d}.yaml": f"changed: {i}\n"})
    repo_mib = _disk_mib(server.repo_path("big"))

    def ours(extract: bool) -> Callable[[], None]:
        root = Path(tempfile.mkdtemp(dir=work, prefix="ours-"))
        store = MirrorStore(root=root, policy=POLICY, limits=LIMITS)
        snap = store.fetch(url, ref=RefSelector(branch="main"))
        if extract:
            tree = store.read_tree(url, commit=snap.commit, path="./")
            assert len(tree) == files + 1, len(tree)
        return lambda: shutil.rmtree(root)

    def git_cli(*extra: str) -> Callable[[], None]:
        target = Path(tempfile.mkdtemp(dir=work, prefix="git-")) / "checkout"
        subprocess.run(["git", "-c", "protocol.version=2", "clone", "--quiet", "--depth", "1",
                        "--no-tags", "--single-branch", "--branch", "main", *extra, url,
                        str(target)],
                       check=True, env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"})
        return lambda: shutil.rmtree(target.parent)

    ours(True)()  # warm up both (imports, page cache)
    git_cli()()
    ours_s = _median_seconds(lambda: ours(True), rounds)
    fetch_s = _median_seconds(lambda: ours(False), rounds)
    git_s = _median_seconds(git_cli, rounds)
    git_fetch_s = _median_seconds(lambda: git_cli("--no-checkout"), rounds)
    extract_store = MirrorStore(root=work / "extract", policy=POLICY, limits=LIMITS)
    commit = extract_store.fetch(url).commit
    read_s = _median_seconds(lambda: extract_store.read_tree(url, commit=commit, path="./"),
                             rounds)
    shape = f"{files} files of ~{size} B, {repo_mib:.1f} MiB repo"
    return [
        (f"fetch + extract, cold ({shape})", f"{ours_s * 1000:.0f} ms"),
        ("git clone --depth 1 + checkout, same repo", f"{git_s * 1000:.0f} ms"),
        ("**ratio ours / git (fetch + extract vs clone + checkout)**", f"**{ours_s / git_s:.2f}**"),
        ("  fetch only (into a new mirror)", f"{fetch_s * 1000:.0f} ms"),
        ("  git clone --depth 1 --no-checkout", f"{git_fetch_s * 1000:.0f} ms"),
        ("  ratio, transfer only", f"{fetch_s / git_fetch_s:.2f}"),
        ("  extract only (read_tree of the whole tree, in memory)", f"{read_s * 1000:.0f} ms"),
    ]


def bench_noop_poll(server: GitServer, work: Path, *, rounds: int) -> list[tuple[str, str]]:
    url = server.create_repo("poll", {"deploy/app.yaml": "a: 1\n"})
    store = MirrorStore(root=work / "poll", policy=POLICY)
    store.fetch(url, ref=RefSelector(branch="main"))
    server.reset_log()
    seconds = _median_seconds(lambda: store.fetch(url, ref=RefSelector(branch="main")), rounds)
    requests = server.requests
    per_poll = len(requests) / rounds
    fetches = server.fetch_count("poll")
    kinds = sorted({f"{r.method} {r.command or 'info/refs'}" for r in requests})
    return [
        ("no-op poll over HTTP (unchanged remote)", f"{seconds * 1000:.1f} ms"),
        ("  HTTP requests per no-op poll", f"{per_poll:g} ({', '.join(kinds)}); pack fetches: "
                                           f"{fetches}"),
    ]


def bench_noop_poll_ssh(server: GitServer, work: Path, *, rounds: int) -> list[tuple[str, str]]:
    from tests.sshserver import SshServer, sshd_available

    if not sshd_available():
        return [("no-op poll over SSH", "skipped: sshd not installed (./hack/bootstrap.sh)")]
    server.create_repo("poll-ssh", {"deploy/app.yaml": "a: 1\n"})
    with SshServer(server.root) as ssh:
        url = ssh.url("poll-ssh")
        creds = Credentials(identity=ssh.identity, known_hosts=ssh.known_hosts)
        store = MirrorStore(root=work / "poll-ssh", policy=POLICY)
        store.fetch(url, credentials=creds)
        before = len(ssh.sessions())
        seconds = _median_seconds(lambda: store.fetch(url, credentials=creds), rounds)
        sessions = (len(ssh.sessions()) - before) / rounds
    return [("no-op poll over SSH (OpenSSH client and server)",
             f"{seconds * 1000:.0f} ms, {sessions:g} SSH session(s)")]


def bench_fan_in(server: GitServer, work: Path, *, callers: int, urls: int) -> list[tuple[str, str]]:
    bases = [server.create_repo(f"fan{i}", {"deploy/app.yaml": f"n: {i}\n"}) for i in range(urls)]
    store = MirrorStore(root=work / "fan", policy=POLICY)
    # Spellings that reach the same repository byte for byte (".git" or not would be two
    # repositories on many servers, so two mirrors: see sources.urls).
    spellings = [lambda u: u, lambda u: u + "/", lambda u: u.replace("http://", "HTTP://"),
                 lambda u: u + "//"]
    refs = [RefSelector(branch="main"), RefSelector(), RefSelector(name="refs/heads/main")]
    callers_list = [(spellings[c % len(spellings)](bases[c % urls]), refs[c % len(refs)],
                     c % urls) for c in range(callers)]
    for base in bases:  # the steady state: every mirror exists
        store.fetch(base)
    expected = [server.commit(f"fan{i}", {"deploy/app.yaml": f"n: {i} v2\n"}) for i in range(urls)]
    server.reset_log()
    start = threading.Barrier(callers)

    def caller(args: tuple[str, RefSelector, int]) -> bool:
        url, ref, index = args
        start.wait()
        snap = store.fetch(url, ref=ref)
        assert snap.commit == expected[index]
        return snap.fetched

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=callers) as pool:
        fetched = list(pool.map(caller, callers_list))
    seconds = time.perf_counter() - began
    fetches = server.fetch_count()
    ls_refs = sum(1 for r in server.requests if r.command == "ls-refs")
    verdict = "OK" if fetches == urls else "MISSED TARGET"
    return [
        (f"fan-in: {callers} callers -> {urls} URLs, 1 new commit each",
         f"{fetches} pack fetches (target {urls}: {verdict}); callers that fetched: "
         f"{sum(fetched)}"),
        ("  ls-refs requests", f"{ls_refs} ({callers} change checks, one per caller; "
                               "the pack fetches reuse them)"),
        ("  wall time for all callers", f"{seconds * 1000:.0f} ms"),
        ("  mirrors on disk", f"{len(list((work / 'fan').iterdir()))}"),
    ]


def bench_many_mirrors(server: GitServer, work: Path, *, count: int,
                       threads: int = 4) -> list[tuple[str, str]]:
    """``count`` cold fetches, each into a mirror of its own, and a read of each stage path."""
    urls = [server.create_repo(f"many{i}", {f"deploy/cm-{j}.yaml": f"n: {i}-{j}\n" for j in range(5)})
            for i in range(count)]
    store = MirrorStore(root=work / "many", policy=POLICY)
    calls = [0]
    real_fsync = os.fsync

    def counted(fd: int) -> None:
        calls[0] += 1
        real_fsync(fd)

    def one(url: str) -> int:
        snap = store.fetch(url, ref=RefSelector(branch="main"), consumer="bench/one")
        return len(store.read_tree(url, commit=snap.commit, path="deploy", consumer="bench/one"))

    os.fsync = counted
    try:
        cpu = time.process_time()
        began = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            read = list(pool.map(one, urls))
        seconds = time.perf_counter() - began
        cpu = time.process_time() - cpu
    finally:
        os.fsync = real_fsync
    assert read == [5] * count, read
    return [
        (f"many cold mirrors: {count} repositories of 5 files, each fetched into its own mirror and "
         f"read, {threads} threads", f"{seconds * 1000 / count:.1f} ms wall per mirror"),
        ("  CPU of this process per mirror (the server's request threads included, not git's)",
         f"{cpu * 1000 / count:.1f} ms"),
        ("  fsync calls per mirror", f"{calls[0] / count:g}"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.git_fetch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller repository, fewer rounds")
    parser.add_argument("--files", type=int, default=None, help="files in the big repository")
    parser.add_argument("--mirrors", type=int, default=200,
                        help="repositories for the many-cold-mirrors part")
    parser.add_argument("--only-mirrors", action="store_true",
                        help="run only the many-cold-mirrors part")
    parser.add_argument("--hostile", action="store_true",
                        help="memory of each hostile input, in a fresh process each")
    args = parser.parse_args(argv)
    if args.hostile:
        return _hostile(quick=args.quick)
    files = args.files or (500 if args.quick else 5000)
    rounds = 3 if args.quick else 7

    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-git-") as tmp, GitServer() as server:
        work = Path(tmp)
        if args.only_mirrors:
            rows += bench_many_mirrors(server, work, count=args.mirrors)
            _print(rows)
            return 0
        rows += bench_fetch_vs_git(server, work, files=files, size=1024, rounds=rounds)
        rows += bench_noop_poll(server, work, rounds=rounds * 3)
        rows += bench_noop_poll_ssh(server, work, rounds=rounds)
        rows += bench_fan_in(server, work, callers=200, urls=5)
        rows += bench_many_mirrors(server, work, count=args.mirrors)
        disk = sum(_disk_mib(work / d) for d in ("extract", "poll", "poll-ssh", "fan", "many")
                   if (work / d).exists())
        current, peak = _rss_mib()
        rows += [
            (f"mirror disk use (big repo + {7 + args.mirrors} small mirrors)", f"{disk:.1f} MiB"),
            ("process RSS now / peak (server threads included)",
             f"{current:.0f} MiB / {peak:.0f} MiB"),
        ]
    _print(rows)
    return 0


def _print(rows: list[tuple[str, str]]) -> None:
    print(f"git fetch benchmark (Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, git {_git_version()})\n")
    print("| measure | result |")
    print("| --- | --- |")
    for name, value in rows:
        print(f"| {name.replace('|', '/')} | {value} |")


def _hostile(*, quick: bool) -> int:
    from tests.sources.memprobe import hostile_cases, measure, table

    with hostile_cases(quick=quick) as cases:
        rows = [(case, measure(case.spec)) for case in cases]
    print(f"hostile Git inputs (Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"git {_git_version()}); default limits\n")
    print(table(rows))
    return 0


def _git_version() -> str:
    out = subprocess.run(["git", "--version"], capture_output=True, text=True, check=True).stdout
    return out.split()[-1]


if __name__ == "__main__":
    raise SystemExit(main())
