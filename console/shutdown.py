"""The console's last line when it stops (Ctrl-C on ``make run``): what keeps running.

The local demo's worker processes run in their own sessions, so they outlive the console, as a
real fleet's machines outlive its control plane (kept on purpose). The line says so
and names the command that ends them, ``make stop``.
"""

import sys

from fleet.providers.local import LocalProvider


def shutdown_line() -> str:
    """One line for the console's exit: how many local demo workers keep running (their ids, at
    most five) and that ``make stop`` ends them. Never raises: when the workers cannot be listed
    the line says the workers may still run."""
    try:
        ids = [pi.external_id for pi in LocalProvider().list_instances() if pi.status == "running"]
    except Exception as exc:
        return (f"Warden console stopped. Demo workers, if any, keep running (listing them failed: "
                f"{type(exc).__name__}); `make stop` ends them.")
    return workers_line(ids)


def workers_line(ids: list[str]) -> str:
    """The exit line for the demo workers ``ids`` still running (at most five named), its verb
    agreeing with the count ("1 … worker (local-4) keeps running", "2 … workers … keep running")."""
    if not ids:
        return "Warden console stopped. No local demo worker is running."
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    one = len(ids) == 1
    return (f"Warden console stopped. {len(ids)} local demo worker{'' if one else 's'} ({shown}) "
            f"keep{'s' if one else ''} running, as a real fleet's machines would: `make stop` ends "
            f"{'it' if one else 'them'}.")


def say_shutdown() -> None:
    """Print :func:`shutdown_line` to stderr (registered with ``atexit`` by ``console.asgi``)."""
    print(shutdown_line(), file=sys.stderr, flush=True)
