"""``manage.py setrole NAME operator|viewer [--reason R]``: change a user's role (audited)."""

from django.core.management.base import BaseCommand, CommandError

from console.management.commands._users import cli_actor, get_user
from console.users import ROLES, UserError, do_set_role, role_of


class Command(BaseCommand):
    help = "Change a console user's role (operator or viewer)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("role", choices=ROLES)
        parser.add_argument("--reason", default="", help="why (goes to the audit log)")

    def handle(self, *args, username, role, reason, **options):
        user = get_user(username)
        before = role_of(user)
        try:
            do_set_role(user, role, actor=cli_actor(), reason=reason)
        except UserError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{username}: {before} → {role}")
