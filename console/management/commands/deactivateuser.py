"""``manage.py deactivateuser NAME [--reason R]``: the user can no longer sign in; their session
and open consoles stop (audited). ``activateuser`` undoes it."""

from django.core.management.base import BaseCommand, CommandError

from console.management.commands._users import cli_actor, get_user
from console.users import UserError, do_set_active


class Command(BaseCommand):
    help = "Deactivate a console user (they can no longer sign in)."
    active = False  # activateuser sets True

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--reason", default="", help="why (goes to the audit log)")

    def handle(self, *args, username, reason, **options):
        try:
            do_set_active(get_user(username), self.active, actor=cli_actor(), reason=reason)
        except UserError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{username} {'reactivated' if self.active else 'deactivated'}")
