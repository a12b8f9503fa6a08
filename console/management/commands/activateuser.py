"""``manage.py activateuser NAME [--reason R]``: undo ``deactivateuser`` (audited)."""

from console.management.commands import deactivateuser


class Command(deactivateuser.Command):
    help = "Reactivate a deactivated console user."
    active = True
