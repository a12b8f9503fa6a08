"""``manage.py listusers``: every console user with role, active and last login (a table)."""

from django.core.management.base import BaseCommand

from console.users import users_table


class Command(BaseCommand):
    help = "List console users: name, role, active, last login."

    def handle(self, *args, **options):
        rows = users_table()
        width = max([len("user"), *(len(r["user"].username) for r in rows)])
        self.stdout.write(f"{'user':{width}}  {'role':9}  {'active':6}  last login")
        for r in rows:
            last = r["last_login"].strftime("%Y-%m-%d %H:%M") if r["last_login"] else "never"
            self.stdout.write(f"{r['user'].username:{width}}  {r['role']:9}  {'yes' if r['active'] else 'no':6}  {last}")
