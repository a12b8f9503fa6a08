"""The guards report the first refusal in the contract's order (docs/replay.md, docs/contract.md), and
``agent/policy/guards.py`` says that order where a newcomer looks for it.

Pairs the scenario files cannot set up in one file are driven here through the real cycle:
``target_gone`` beats ``rejected_recently``; ``observe_only`` beats ``rate_limited``.
"""

import re
from pathlib import Path

import pytest

import agent.policy.guards
from agent.models import Approval
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run
from fleet.models import Instance
from tests.rails_support import calls, fleet_entry, rails_world, verdict

ROOT = Path(__file__).resolve().parent.parent


def contract_order() -> list[str]:
    text = (ROOT / "docs" / "replay.md").read_text()
    para = text.split("<!-- refusal-order -->", 1)[1].split("<!-- /refusal-order -->", 1)[0]
    return re.findall(r"`([a-z_]+)`", para)


def test_the_guards_docstring_states_the_contract_order():
    doc = agent.policy.guards.__doc__
    para = re.split(r"The\s+whole\s+order", doc, maxsplit=1)[1].split("Rules and their sources", 1)[0]
    stated = [c for c in re.findall(r"``([a-z_]+)``", para) if c in contract_order()]
    assert stated == [c for c in contract_order() if c in stated]
    assert set(contract_order()) - {"approval_required"} <= set(stated)


CALM = {"state": "ok", "active": False, "queued": 0, "running": 0, "idle_min": 90}


@pytest.mark.django_db
def test_target_gone_beats_rejected_recently():
    diag = {"tool": "diagnose_instance", "args": {"instance_id": "v-2"}}
    stop = {"tool": "stop_instance", "args": {"instance_id": "v-2", "reason": "idle"}}
    with rails_world([fleet_entry("v-1"), fleet_entry("v-2")], CALM) as w:
        run = w.cycle([diag, stop])
        do_decide(Approval.objects.get(), "reject", "user:alice", "keep it")
        resume_run(run)
        w.clock.advance(60)
        near = w.cycle([diag, stop, verdict()])
        Instance.objects.filter(external_id="v-2").update(killed_at=w.clock.now(), killed_by="provider",
                                                          kill_reason="vanished")
        gone = w.cycle([stop, verdict()])
    assert calls(near)[1].reason_code == "rejected_recently"
    assert calls(gone)[0].reason_code == "target_gone"


@pytest.mark.django_db
def test_observe_only_beats_rate_limited():
    launch = {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P0", "reason": "q"}}
    queued = {**CALM, "queued": 5, "idle_min": None}
    offers = [{"id": "o-1", "gpu_name": "RTX 4090", "dph": 0.4}]
    with rails_world([], queued, offers=offers, limits={"launch_rate": [1, 600]}) as w:
        from agent.models import SideEffect

        SideEffect.objects.create(key="earlier-launch", tool="launch_instance", args={}, status="done",
                                  claimed_at=w.clock.now())
        limited = w.cycle([launch, verdict()])
        from agent.models import SessionState

        SessionState.objects.filter(pk=1).update(observe_only=True)
        both = w.cycle([launch, verdict()])
    assert calls(limited)[0].reason_code == "rate_limited"
    assert calls(both)[0].reason_code == "observe_only"
