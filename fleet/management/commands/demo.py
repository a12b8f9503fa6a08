"""``python manage.py demo prepare | enqueue N [--name PoRep] | kill-worker`` — the local demo queue.

Bad input and an unreadable harmony database end with one line (``CommandError``) that names
the problem and what to do.
"""

from django.core.management.base import BaseCommand, CommandError

from fleet import demo
from fleet.demand.base import DemandError
from fleet.numbers import NumberError, parse_number


class Command(BaseCommand):
    help = "Local demo: prepare the HarmonyDB tables, enqueue proving tasks, kill a worker."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", metavar="{prepare,enqueue,kill-worker}")
        sub.add_parser("prepare", help="create the HarmonyDB tables on the harmony database (idempotent)")
        enq = sub.add_parser("enqueue", help="add N unclaimed proving tasks")
        enq.add_argument("n", metavar="N", help="how many tasks (1-10000)")
        enq.add_argument("--name", default="PoRep", help="task name (default PoRep)")
        sub.add_parser("kill-worker", help="SIGKILL one running local worker")

    def handle(self, *args, action=None, **opts):
        try:
            if action == "prepare":
                created = demo.prepare()
                self.stdout.write("created " + ", ".join(created) if created else "harmony tables already exist")
            elif action == "enqueue":
                try:  # the operator-number rule: "１０", "1_0", "1e3" and "-0" are refused
                    n = parse_number(opts["n"], "demo enqueue: N", low=1, high=10_000, whole=True, example="20")
                except NumberError as exc:
                    raise CommandError(str(exc)) from None
                ids = demo.enqueue(n, name=opts["name"])
                self.stdout.write(f"enqueued {len(ids)} {opts['name']} task(s): ids {ids[0]}..{ids[-1]}")
            elif action == "kill-worker":
                inst = demo.kill_one_worker()
                if inst is None:
                    raise CommandError("demo kill-worker: no running local worker to kill (launch one first)")
                self.stdout.write(f"killed {inst.external_id} (pid {inst.pid}) with SIGKILL; status {inst.status}")
            else:
                raise CommandError("demo: say what to do: prepare, enqueue N [--name PoRep] or kill-worker")
        except (ValueError, DemandError) as exc:
            raise CommandError(f"demo {action}: {exc}") from exc
