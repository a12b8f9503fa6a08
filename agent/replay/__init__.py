"""Scenario replay: run one scenario file through the real observe cycle and report from its rows.

Format: ``docs/replay.md``, checked by :mod:`agent.replay.file_format`. The package: ``file_format``
(loading and checking a file), ``world`` (the scenario's world and its isolation), ``run`` (the
cycles and the operator's answers), ``report`` (the report and its comparison with ``expect``);
the names callers use are re-exported here.
:func:`run_scenario` sets up the world in the *current* database (the ``replay`` management
command points that at a throwaway SQLite file first; tests use pytest's test database), routes
``get_provider()`` and the demand source to the file's fleet and demand, swaps in a virtual clock
that starts at the file's ``now``, runs ``agent.runtime.loop.run_cycle`` (the entry point the Celery task
calls), answers parked approvals as the file's ``operator`` says and resumes, then plays each
``timeline`` moment (clock, demand, fleet, objectives, operator decisions dispatched at once, a
heartbeat cycle unless ``run`` is ``none``) — :class:`Replay`. The report is built from the Run,
Step, Approval and Alert rows those cycles wrote, plus the provider's final fleet and request
counts. :func:`match_expect` compares a report with the file's ``expect``.
"""

from agent.replay.file_format import (
    ALERT_KINDS,
    HALT_CODES,
    REASON_CODES,
    CallExpect,
    ExpectSpec,
    Moment,
    Scenario,
    ScenarioFileError,
    load_scenario,
)
from agent.replay.report import build_report, flat_calls, format_report, match_expect, public_report
from agent.replay.run import Replay, make_planner, run_scenario
from agent.replay.world import World, file_policy, isolated, setup_world

__all__ = [
    "ALERT_KINDS",
    "CallExpect",
    "ExpectSpec",
    "HALT_CODES",
    "Moment",
    "REASON_CODES",
    "Replay",
    "Scenario",
    "ScenarioFileError",
    "World",
    "build_report",
    "file_policy",
    "flat_calls",
    "format_report",
    "isolated",
    "load_scenario",
    "make_planner",
    "match_expect",
    "public_report",
    "run_scenario",
    "setup_world",
]
