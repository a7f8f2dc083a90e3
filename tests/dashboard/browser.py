"""Debian's Chromium driven by Playwright, and ``stageset dashboard`` as a real process.

The browser is the system's (``/usr/bin/chromium``, installed by ``hack/bootstrap.sh``), never
one Playwright downloads; the flags keep it off the network (no background requests, updates,
sync or QUIC).  Used by the browser tests and by ``python -m tests.dashboard.screenshot``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = Path(os.environ.get("STAGESET_CHROMIUM", "/usr/bin/chromium"))
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@contextmanager
def chromium() -> Iterator[Browser]:
    """Headless Chromium (Playwright gives it a fresh, temporary user-data-dir)."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class DashboardProcess:
    url: str
    process: subprocess.Popen[str]
    banner: str
    stderr: str = ""


@contextmanager
def dashboard(*args: str, kubeconfig: Path | None, timeout: float = 60.0) -> Iterator[DashboardProcess]:
    """``stageset dashboard --address 127.0.0.1:0 ARGS`` until the block ends (then Ctrl-C);
    ``kubeconfig=None``: none at all (the shared dashboard, ``--login``)."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stageset.cli",
            "dashboard",
            "--address",
            "127.0.0.1:0",
            *(("--kubeconfig", str(kubeconfig)) if kubeconfig else ()),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1",
             **({} if kubeconfig else {"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""})},
    )
    assert process.stdout is not None
    try:
        deadline = time.monotonic() + timeout
        while not select.select([process.stdout], [], [], 0.5)[0]:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"stageset dashboard did not start: {process.stderr.read() if process.stderr else ''}"
                )
        first = process.stdout.readline()
        second = process.stdout.readline()
        url = first.strip().split()[-1]
        assert url.startswith("http://127.0.0.1:"), first
        running = DashboardProcess(url=url, process=process, banner=first + second)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    running.stderr = process.stderr.read() if process.stderr else ""
    # A page that failed to render is a 500 to the browser and a traceback here: never acceptable.
    assert "Traceback" not in running.stderr, running.stderr
    assert "ERROR" not in running.stderr, running.stderr  # e.g. a stream that did not complete
    assert process.returncode == 0, (process.returncode, running.stderr)
