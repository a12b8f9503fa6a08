"""``python manage.py score_traces [--last N] [--epoch E] [--json]``: score the stored traces.

Prints the step-count histogram, halt reasons, forbidden and forged attempt rates, side effects
with and without an approval, and entailment flags (``agent.replay.scoring``); ``--json`` prints the
same data as one JSON object.
"""

import json

from django.core.management.base import BaseCommand, CommandError

from agent.replay.scoring import format_table, score_traces

#: the largest --last / --epoch accepted (a database integer holds it; 10**23 does not)
MAX_LAST = 10**9


class Command(BaseCommand):
    help = "Score the agent's stored traces (runs, steps, approvals): histogram, halts, attempts, approvals, entailment."

    def add_arguments(self, parser):
        parser.add_argument("--last", type=int, default=None, help="only the newest N runs")
        parser.add_argument("--epoch", type=int, default=None, help="only runs of this session epoch")
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")

    def handle(self, *args, **opts):
        if opts["last"] is not None and not 1 <= opts["last"] <= MAX_LAST:
            raise CommandError(f"--last must be between 1 and {MAX_LAST} (the number of newest runs to score); got {opts['last']}")
        if opts["epoch"] is not None and not 0 <= opts["epoch"] <= MAX_LAST:
            raise CommandError(f"--epoch must be between 0 and {MAX_LAST}; got {opts['epoch']}")
        score = score_traces(last=opts["last"], epoch=opts["epoch"])
        if opts["json"]:
            self.stdout.write(json.dumps(score, indent=2, sort_keys=True))
        else:
            self.stdout.write(format_table(score))
