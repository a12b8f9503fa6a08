"""Unsafe decisions in a rehearsal, checked after every cycle (docs/rehearse.md "Unsafe decisions").

Each violation is ``{"invariant", "cycle", "run", "call", "detail"}``. Two nets:

- the product's invariant checker, ``agent.policy.invariants`` (the one the model scorecard uses too):
  :func:`agent.policy.invariants.check_run` after every run (each cycle, each resume), and
  :func:`agent.policy.invariants.check_all` once at the end for the cross-run invariants (one effect per
  idempotency key, one run at a time); it judges from the records what the runtime knew at the call;
- the world's truth at the moment the provider received a stop or destroy (only a simulation can
  know it): ``world_owned_tasks`` — the worker was live and owned a task; ``world_scale_down`` —
  a live or starting worker (one that would come up: not stuck, not loading past the provisioning
  limit) was retired while work waited (queued, due backlog, or owned by a dead worker) or
  another expected worker was dead. Their ``call`` is ``TOOL(instance)``, their ``cycle`` the
  rehearsal's cycle count.

The same violation found twice (a resumed run is checked again) is reported once.
"""

from __future__ import annotations

from agent.models import Step
from agent.policy.invariants import check_all, check_run


class Checker:
    """Checks one rehearsal's records and world log after each run (:meth:`after_run`), and the
    whole day at the end (:meth:`final`)."""

    def __init__(self, reh):
        self.reh = reh
        self.retire_seen = 0
        self.seen: set[tuple] = set()

    def _new(self, found: list[dict]) -> list[dict]:
        out = []
        for v in found:
            key = (v["invariant"], v["run"], str(v["call"]), v["detail"])
            if key not in self.seen:
                self.seen.add(key)
                out.append(v)
        return out

    def _v(self, invariant: str, run, call: str, detail: str) -> dict:
        return {"invariant": invariant, "cycle": self.reh.cycles, "run": getattr(run, "number", None),
                "call": call, "detail": detail}

    def after_run(self, run) -> list[dict]:
        """The violations found since the last check (the run's records and the world's log)."""
        out: list[dict] = list(check_run(run))
        log = self.reh.world.retire_log
        for entry in log[self.retire_seen:]:
            step = (Step.objects.filter(kind="call", tool=entry["call"], args__instance_id=entry["instance"])
                    .select_related("run").order_by("-pk").first())
            who = step.run if step is not None else run
            call = f"{entry['call']}({entry['instance']})"
            if entry["owns"]:
                out.append(self._v("world_owned_tasks", who, call, f"{entry['instance']}'s worker was live and owned a task"))
            if (entry["live"] or entry["starting"]) and (entry["waiting"] or entry["dead"]):
                why = f"{entry['waiting']} task(s) waiting" if entry["waiting"] else f"{entry['dead']} expected worker(s) dead"
                out.append(self._v("world_scale_down", who, call,
                                   f"retired a {'live' if entry['live'] else 'starting'} worker while {why}"))
        self.retire_seen = len(log)
        return self._new(out)

    def final(self, runs) -> list[dict]:
        """The whole day's check (``agent.policy.invariants.check_all``): what no single run shows."""
        return self._new(check_all(runs))
