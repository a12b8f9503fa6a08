"""A command that writes forever (``yes``), or a byte at a time (a dripping ``tail -f``), over the
real test sshd: the runner answers 124 within its timeout with the head of the output, instead of
waiting for an end that never comes (paramiko's own timeout bounds each read only)."""

import time

from fleet.ssh import SSHRunner
from tests import sshd as sshd_support

sshd = sshd_support.sshd


def _runner(sshd) -> SSHRunner:
    return SSHRunner(sshd.host, sshd.port, user=sshd.user, key_filename=str(sshd.key_file), timeout_s=5,
                     connect_attempts=1)


def test_a_command_that_writes_forever_times_out_with_bounded_output(sshd):
    with _runner(sshd) as r:
        started = time.monotonic()
        rc, text = r.run("yes warden", timeout_s=1)
        assert rc == 124 and "timed out after 1s" in text
        assert time.monotonic() - started < 4
        assert not r.broken
        # the session still serves the next command, with its output and exit code in order
        assert r.run("echo out; echo err >&2; exit 3", timeout_s=5) == (3, "out\nerr\n")


def test_a_command_that_drips_a_line_at_a_time_times_out_as_a_whole(sshd):
    with _runner(sshd) as r:
        started = time.monotonic()
        rc, text = r.run("while true; do echo tick; sleep 0.2; done", timeout_s=1)
    assert rc == 124 and time.monotonic() - started < 4
