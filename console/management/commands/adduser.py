"""``manage.py adduser NAME --role operator|viewer [--password-file F] [--reason R]``.

Creates a console user with a role (``console.users.do_add_user``, audited as ``cli:<you>``).
The password comes from ``--password-file`` (its first line; the file is read, never stored or
printed) or, in a terminal, from a prompt typed twice. Django's password validators apply.
Exit 1 with one line naming what was wrong (taken or look-alike name, weak password, unreadable
file, a FIFO or a device given as the password file).
"""

import getpass
import os
import stat
import sys

from django.core.management.base import BaseCommand, CommandError

from console.management.commands._users import cli_actor
from console.users import PASSWORD_CAP, ROLES, UserError, do_add_user


def read_password_file(path: str) -> str:
    """The first line of ``path`` (without its newline); :class:`CommandError` when unreadable, empty
    or not a regular file. The file is checked by ``stat`` before it is opened (a FIFO with no writer
    would block for ever, a device would never end) and opened non-blocking, as replay reads its files."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
                "not a regular file"
            raise CommandError(f"--password-file {path}: {kind}; put the password alone in a regular file")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between the stat and the open
            os.close(fd)
            raise CommandError(f"--password-file {path}: not a regular file; put the password alone in a regular file")
        with os.fdopen(fd, encoding="utf-8") as fh:
            line = fh.readline(PASSWORD_CAP + 2)
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"--password-file {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    password = line.rstrip("\r\n")
    if not password:
        raise CommandError(f"--password-file {path}: the first line is empty; put the password on it")
    return password


def prompt_password() -> str:
    """Ask twice in the terminal; :class:`CommandError` when there is no terminal or they differ."""
    if not sys.stdin.isatty():
        raise CommandError("no terminal to prompt for the password: use --password-file FILE")
    first = getpass.getpass("password: ")
    if first != getpass.getpass("password again: "):
        raise CommandError("the two passwords differ; nothing was created")
    return first


class Command(BaseCommand):
    help = "Add a console user with a role (operator: acts and approves; viewer: sees, cannot act)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=ROLES)
        parser.add_argument("--password-file", metavar="FILE", help="read the password from the first line of FILE")
        parser.add_argument("--reason", default="", help="why (goes to the audit log)")

    def handle(self, *args, username, role, password_file, reason, **options):
        password = read_password_file(password_file) if password_file else prompt_password()
        try:
            user = do_add_user(username, role, password, actor=cli_actor(), reason=reason)
        except UserError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"added {user.username} as {role}")
