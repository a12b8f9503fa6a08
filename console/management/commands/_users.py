"""Shared by the user commands: the audit actor of a shell user and looking a user up by name."""

import getpass

from django.contrib.auth.models import User
from django.core.management.base import CommandError


def cli_actor() -> str:
    """``cli:<login name>`` of whoever runs the command (``cli`` when the name is unknown)."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


def get_user(username: str) -> User:
    """The user named ``username``; :class:`CommandError` naming it and ``listusers`` otherwise."""
    try:
        return User.objects.get(username=username)
    except User.DoesNotExist:
        raise CommandError(f"no user {username!r}; see manage.py listusers") from None
