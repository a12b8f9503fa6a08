"""Runs list (trigger, status, verdict, tokens, steps, the "no-op" badge) and the run page's full trace."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent.models import Run, Step

HX = {"HX-Request": "true"}


def make_run(number: int, **kw) -> Run:
    defaults = {"trigger": "beat", "planner": "rules", "status": "done", "started_at": timezone.now()}
    return Run.objects.create(number=number, **{**defaults, **kw})


def step(run: Run, seq: int, **kw) -> Step:
    return Step.objects.create(run=run, seq=seq, created_at=timezone.now(), **kw)


def test_it_lists_runs_with_verdict_tokens_and_steps(client, alice):
    run = make_run(7, trigger="operator", verdict_action=True, verdict_state_changed=False, tokens_in=1234, tokens_out=56)
    for i in range(3):
        step(run, i, kind="observe")
    make_run(8, status="halted", halt_reason="breaker_loop", included_in_prompt=False)
    client.force_login(alice)
    html = client.get("/runs/").content.decode()
    assert 'id="run-7"' in html and "operator" in html
    assert "action yes · changed no" in html
    assert "1234 / 56" in html
    assert "<td>3</td>" in html
    assert "breaker_loop" in html and ">no-op</span>" in html


def test_it_shows_every_step_of_a_run(client, bob):
    run = make_run(3, final_report="Launched one worker: 12 tasks queued, 0 live workers.")
    step(run, 0, kind="observe", actor="agent", observation="queued=12 live=0 state=ok")
    step(run, 1, kind="call", turn=1, tool="launch_instance", args={"gpu": "RTX 4090"}, outcome="executed",
         observation="launched local-3")
    step(run, 2, kind="call", turn=2, tool="stop_instance", args={"instance": "local-1"}, outcome="refused",
         reason_code="demand_not_ok", detail="demand unknown: no scale-down")
    step(run, 3, kind="text", turn=3, text="Done for now.")
    client.force_login(bob)
    html = client.get("/runs/3/").content.decode()
    for needle in ["Run #3", "queued=12 live=0", "launch_instance", "RTX 4090", "launched local-3", "stop_instance",
                   "refused", "demand_not_ok", "demand unknown: no scale-down", "Done for now.", "Launched one worker",
                   'id="step-0"', 'id="step-3"']:
        assert needle in html, needle
    part = client.get("/runs/3/", headers=HX).content.decode()
    assert "stop_instance" in part and "<html" not in part


def test_it_answers_404_for_an_unknown_run(client, alice):
    client.force_login(alice)
    assert client.get("/runs/999/").status_code == 404


def test_it_keeps_the_query_count_constant(client, alice):
    client.force_login(alice)
    make_run(1)
    with CaptureQueriesContext(connection) as few:
        client.get("/runs/")
    for n in range(2, 40):
        r = make_run(n)
        step(r, 0, kind="observe")
    with CaptureQueriesContext(connection) as many:
        client.get("/runs/")
    assert len(many) == len(few)
