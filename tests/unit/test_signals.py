"""A signal the kernel hands to another thread still stops the controller's main thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# The main thread blocks SIGTERM after the other thread exists, so the kernel must deliver it
# there; the Python handler then runs only when the main thread wakes up by itself.
SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    from stageset.controller.manager import wait_until_set

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    other = threading.Thread(target=time.sleep, args=(30,), daemon=True)
    other.start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
    started = time.monotonic()
    wait_until_set(stop)
    print(f"stopped after {time.monotonic() - started:.1f}s")
""")


def test_sigterm_delivered_to_another_thread_ends_the_wait() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("stopped after"), done.stdout
