"""An approval is decided and executed exactly once: a double click, two operators approving at the
same moment (two real HTTP requests in flight together against a live server), and a replayed POST.

Each test ends by running what the Celery worker would run for every resume task that reached the
broker, and counts the provider's ``stop_instance`` calls: exactly one.
"""

import re
import threading
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from agent.models import Approval, Run, SideEffect
from agent.runtime.loop import resume_run
from fleet.models import AuditLog
from tests.console_support import IDLE, park_stops, purge_broker, resume_messages
from tests.scenario_world import entry, scenario_world


def _run_resume_tasks(planner) -> None:
    """Do what the worker does with each ``agent.tasks.resume`` message in the broker."""
    for m in resume_messages():
        resume_run(Run.objects.get(pk=m["args"][0]), planner=planner)


def _stops(provider) -> int:
    return [c for c, _ in provider.calls].count("stop_instance")


@pytest.mark.django_db
def test_a_double_click_decides_and_executes_once(client, alice, broker_queue, django_capture_on_commit_callbacks):
    with scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, planner = park_stops("v-1")
        approval = Approval.objects.get(run=run)
        client.force_login(alice)
        with django_capture_on_commit_callbacks(execute=True):
            first = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "approve"})
            second = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "approve"})
        assert first.status_code == 302
        assert second.status_code == 409
        assert f"approval {approval.pk} was already approved" in second.content.decode()
        assert len(resume_messages()) == 1  # only the winner enqueued the resume
        _run_resume_tasks(planner)
        resume_run(run, planner=planner)  # a duplicated task delivery changes nothing
        assert _stops(provider) == 1
    assert AuditLog.objects.filter(verb="approve_call").count() == 1
    assert Approval.objects.get(pk=approval.pk).status == "executed"
    assert SideEffect.objects.filter(tool="stop_instance").count() == 1


@pytest.mark.django_db
def test_a_replayed_post_executes_nothing_more(alice, broker_queue, django_capture_on_commit_callbacks):
    """The same POST (same session, same CSRF token, same body) sent again after it took effect."""
    csrf_client = Client(enforce_csrf_checks=True)
    with scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, planner = park_stops("v-1")
        approval = Approval.objects.get(run=run)
        csrf_client.force_login(alice)
        page = csrf_client.get("/approvals/").content.decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        body = {"csrfmiddlewaretoken": token, "decision": "approve"}
        with django_capture_on_commit_callbacks(execute=True):
            assert csrf_client.post(f"/approvals/{approval.pk}/decide/", body).status_code == 302
        _run_resume_tasks(planner)
        assert _stops(provider) == 1
        purge_broker()
        with django_capture_on_commit_callbacks(execute=True):
            replay = csrf_client.post(f"/approvals/{approval.pk}/decide/", body)
        assert replay.status_code == 409
        assert "was already executed" in replay.content.decode()
        assert resume_messages() == []
        resume_run(run, planner=planner)
        assert _stops(provider) == 1
        # a forged POST without the token is refused by CSRF before anything happens
        assert csrf_client.post(f"/approvals/{approval.pk}/decide/", {"decision": "approve"}).status_code == 403
    assert AuditLog.objects.filter(verb="approve_call").count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_operators_approving_at_the_same_moment_decide_once(live_server, alice, broker_queue):
    """alice and carol each have a real session; both POSTs are in flight together (a barrier
    releases them at once) against the live server's threads and separate database connections."""
    carol = User.objects.create_user("carol", password="carol-pass-1")
    carol.groups.add(Group.objects.get_or_create(name="operators")[0])
    with scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, planner = park_stops("v-1")
        approval = Approval.objects.get(run=run)
        url = f"{live_server.url}/approvals/{approval.pk}/decide/"

        def session(username, password):
            jar = CookieJar()
            opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _NoRedirect)
            html = opener.open(f"{live_server.url}/login/").read().decode()
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
            data = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "username": username, "password": password})
            _open(opener, f"{live_server.url}/login/", data.encode(), referer=f"{live_server.url}/login/")
            page = opener.open(f"{live_server.url}/approvals/").read().decode()
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
            return opener, token

        sessions = [session("alice", "alice-pass-1"), session("carol", "carol-pass-1")]
        barrier = threading.Barrier(len(sessions))
        statuses: dict[str, int] = {}

        def post(name, opener, token):
            data = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "decision": "approve"}).encode()
            barrier.wait()
            statuses[name] = _open(opener, url, data, referer=f"{live_server.url}/approvals/")

        threads = [threading.Thread(target=post, args=(n, o, t)) for n, (o, t) in zip(("alice", "carol"), sessions, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(statuses.values()) == [302, 409], statuses
        winner = next(n for n, s in statuses.items() if s == 302)
        approval.refresh_from_db()
        assert approval.status == "approved" and approval.decided_by.username == winner
        assert [r.actor for r in AuditLog.objects.filter(verb="approve_call")] == [f"user:{winner}"]
        assert len(resume_messages()) == 1
        _run_resume_tasks(planner)
        assert _stops(provider) == 1
    assert Approval.objects.get(pk=approval.pk).status == "executed"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _open(opener, url: str, data: bytes, referer: str) -> int:
    req = urllib.request.Request(url, data=data, headers={"Referer": referer})
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.django_db
def test_a_decision_arriving_while_the_other_approved_call_executes_is_not_lost(alice):
    """Two parked calls: the first is approved; while its side effect runs, an operator rejects the
    second. Both resume tasks run; the rejection must reach the agent as ``rejected``."""
    from agent.runtime.approvals import do_decide

    with scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, planner = park_stops("v-1", "v-2")
        first, second = (Approval.objects.get(run=run, args__instance_id=i) for i in ("v-1", "v-2"))
        do_decide(first, "approve", "user:alice", user=alice)
        real_stop = provider.stop

        def stop_while_a_colleague_rejects(external_id):
            real_stop(external_id)
            do_decide(second, "reject", "user:carol", comment="keep v-2 for the night batch")

        provider.stop = stop_while_a_colleague_rejects
        resume_run(run, planner=planner)  # the resume task of the approval
        resume_run(run, planner=planner)  # the resume task of the rejection
    steps = {s.args["instance_id"]: s for s in Run.objects.get(pk=run.pk).steps.filter(tool="stop_instance")}
    assert steps["v-1"].outcome == "approved_executed"
    assert steps["v-2"].outcome == "rejected"
