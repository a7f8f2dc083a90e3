"""``stageset controller`` as a child process, for end-to-end tests and benchmarks.

A real process (not a thread) so that its memory, its signal handling and its
command line are exactly what a user runs.  Development only: it allows loopback ``http://``
Git servers and artifact downloads from loopback (``--allow-insecure-sources``) unless
``insecure=False`` (the address guard's own end-to-end tests).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path


class ControllerProcess:
    def __init__(self, *, kubeconfig: Path, workdir: Path, mirror_dir: Path | None = None,
                 log_level: str = "debug", extra: Iterable[str] = (), insecure: bool = True):
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "controller.log"
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stageset.cli", "controller", "--kubeconfig", str(kubeconfig),
                 *(["--allow-insecure-sources"] if insecure else []),
                 "--mirror-dir", str(mirror_dir or workdir / "mirrors"),
                 "--artifact-dir", str(workdir / "artifacts"), "--log-level", log_level, *extra],
                stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def memory_mib(self) -> dict[str, float]:
        """``VmRSS`` (now) and ``VmHWM`` (peak) of the controller process, MiB."""
        return memory_mib(self.process.pid)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"controller exited with {self.process.returncode}:\n{self.output()[-4000:]}")

    def exit_code(self, *, timeout: float) -> int:
        """Wait for the process to end; if it does not, its threads' stacks (SIGUSR1) reach
        :meth:`output` before the timeout is raised."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
            raise

    def stop(self, *, timeout: float = 30.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def memory_mib(pid: int) -> dict[str, float]:
    """``VmRSS`` (now) and ``VmHWM`` (peak) of process ``pid``, MiB."""
    found: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024
    return found
