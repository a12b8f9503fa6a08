"""SIGTERM/SIGHUP as an exception, for the commands that play work in a scratch child process
(``replay``, ``rehearse``, ``evaluate-model``): the parent catches :class:`Stopped`, ends its child
and exits with 128 + the signal, so nothing is left running and the scratch folder is removed."""


class Stopped(Exception):
    """SIGTERM or SIGHUP reached the parent; ``signum`` is the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def raise_stopped(signum, frame):
    """A ``signal.signal`` handler that raises :class:`Stopped`."""
    raise Stopped(signum)
