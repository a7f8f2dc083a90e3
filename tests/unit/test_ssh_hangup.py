"""A server that refuses a request and hangs up while the client still writes: the reason is kept.

Over SSH, ``git upload-pack`` refuses an unadvertised want with ``fatal: ... not our ref`` on its
stderr and exits.  If that reaches the client while it is still writing its request, dulwich
sees only a broken pipe; the transport then reads what the ended ``ssh`` wrote to stderr, so the
refusal is still recognised (``_REFUSED_WANT``) and not reported as a broken connection.  The
"ssh" here is a local process that behaves so, on no network.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from dulwich.errors import GitProtocolError

from sources import ssh
from sources.errors import GitOperationError
from sources.ssh import StrictSSHVendor, _KeepingWrapper
from sources.transport import Remote
from sources.urls import UrlPolicy, parse_url

PINNED = "1" * 40


def vendor_with(tmp_path: Path, script: str) -> StrictSSHVendor:
    vendor = StrictSSHVendor(known_hosts_file=tmp_path / "known_hosts", identity_file=None, timeout=10)
    vendor.processes.append(subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return vendor


def remote() -> Remote:
    return Remote(url=parse_url("ssh://git@127.0.0.1:2222/app.git", UrlPolicy()), credentials=None,
                  timeout=10)


def wrapped(cause: OSError) -> GitProtocolError:
    """As dulwich's ``Protocol.write_pkt_line`` raises a failed write."""
    error = GitProtocolError(str(cause))
    error.__cause__ = cause
    return error


@pytest.mark.parametrize("hangup", [
    BrokenPipeError(32, "Broken pipe"),
    ConnectionResetError(104, "Connection reset by peer"),
    wrapped(BrokenPipeError(32, "Broken pipe")),  # what a fetch actually sees
])
def test_a_refusal_on_stderr_survives_a_broken_pipe(tmp_path: Path, hangup: Exception) -> None:
    vendor = vendor_with(tmp_path, f"echo 'fatal: git upload-pack: not our ref {PINNED}' >&2")
    try:
        with pytest.raises(GitOperationError, match=f"not our ref {PINNED}"), \
                remote()._ssh_errors("fetching from", vendor):
            raise hangup
    finally:
        vendor.reap()


def test_a_broken_pipe_without_a_reason_stays_a_broken_pipe(tmp_path: Path) -> None:
    vendor = vendor_with(tmp_path, "exit 1")
    try:
        with pytest.raises(GitOperationError, match=r"fetching from ssh://127\.0\.0\.1:2222/app\.git failed: "
                                                     r"\[Errno 32\] Broken pipe$"), \
                remote()._ssh_errors("fetching from", vendor):
            raise BrokenPipeError(32, "Broken pipe")
    finally:
        vendor.reap()


def test_the_reason_is_kept_when_dulwich_closed_the_pipes_first(tmp_path: Path) -> None:
    """What a fetch really meets: dulwich closes the connection (and with it the process's
    stderr) before the error reaches the transport; the vendor kept stderr as it closed."""
    vendor = vendor_with(tmp_path, f"echo 'fatal: git upload-pack: not our ref {PINNED}' >&2")
    try:
        _KeepingWrapper(vendor.processes[0], keep=vendor._keep_stderr).close()
        stderr = vendor.processes[0].stderr
        assert stderr is not None
        assert stderr.closed
        with pytest.raises(GitOperationError, match=f"not our ref {PINNED}"), \
                remote()._ssh_errors("fetching from", vendor):
            raise wrapped(BrokenPipeError(32, "Broken pipe"))
    finally:
        vendor.reap()


def test_an_ssh_that_does_not_end_is_not_waited_for_long(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh, "_STDERR_WAIT", 0.2)
    vendor = vendor_with(tmp_path, "echo 'still talking' >&2; sleep 30")
    try:
        assert vendor.hangup_reason() == ""
    finally:
        vendor.reap()
