"""No secret shape of the corpus leaks through any path, end to end.

For each shape in ``tests/secret_corpus.py``: an operator types it into the chat (the real view);
a tool returns it inside its result, the model repeats it in its answer, escalates with it and
stores it in memory (a real cycle); a logger logs it; an action audits it. Then every row of every
table that keeps text is read back, the model's next context is built, a viewer loads every page,
and the log is read: the secret appears nowhere.
"""

import logging

import pytest

from agent.memory.context import build_context
from agent.models import Approval, MemoryFact, Run, ShortTermMessage, SideEffect, Step
from fleet.audit import do_audit
from fleet.models import Alert, AuditLog, Diagnosis, Instance
from fleet.secrets import MARK, RedactingFilter
from tests.rails_support import extra_tool, rails_world
from tests.secret_corpus import SECRETS

pytestmark = pytest.mark.django_db

TABLES = [Step, Run, AuditLog, Alert, MemoryFact, ShortTermMessage, SideEffect, Approval, Diagnosis, Instance]
VIEWER_PAGES = ["/", "/runs/", "/actions/", "/alerts/?state=all", "/approvals/", "/fleet/", "/traces/", "/instances/v-1/",
                "/memory/"]


@pytest.mark.parametrize(("name", "text", "secret"), [pytest.param(*s, id=s[0]) for s in SECRETS])
def test_a_secret_leaks_through_no_path(name, text, secret, client, alice, bob, broker_queue, caplog):
    caplog.handler.addFilter(RedactingFilter())
    log = logging.getLogger("warden.test.paths")

    # the chat, through the real view
    client.force_login(alice)
    resp = client.post("/actions/message/", {"text": f"use this: {text}"})
    assert resp.status_code == 302, resp.content[:300]

    # a tool result, the model's answer, an escalation and a memory, in one real cycle
    def leaky(ctx, args):
        return {"env": text, "nested": [{"log": f"connecting with {text}"}]}

    with extra_tool("read_env", leaky), rails_world() as w, caplog.at_level(logging.INFO):
        run = w.cycle([
            {"tool": "read_env", "args": {}},
            {"tool": "remember", "args": {"category": "creds", "key": "vast", "value": f"the key: {text}"}},
            {"tool": "escalate_human", "args": {"severity": "P2", "message": f"found {text}"}},
            {"text": f'I saw {text}. <verdict>{{"action": false, "state_changed": false}}</verdict>'},
        ], trigger="chat", message=f"what is {text}?")
        log.warning("provider answered: %s", text)
        log.info(f"retrying with {text}")
        do_audit("user:alice", "set_provider_key", "vast", reason=f"rotated: {text}", before={"key": text},
                 after={"keys": [text]})
        context = build_context(run=run)

    assert Step.objects.filter(run=run, tool="read_env", outcome="executed").exists()
    assert MemoryFact.objects.exists() and Alert.objects.filter(kind="escalation").exists()
    assert ShortTermMessage.objects.filter(run_number=run.number).exists()

    found = {}
    for model in TABLES:
        for row in model.objects.values():
            if secret in str(row):
                found.setdefault(model.__name__, []).append(row)
    for i, message in enumerate(context.messages):
        if secret in str(message):
            found[f"model context message {i} ({message['role']})"] = message
    if secret in caplog.text:
        found["log"] = caplog.text
    client.force_login(bob)
    for url in [*VIEWER_PAGES, f"/runs/{run.number}/"]:
        page = client.get(url)
        assert page.status_code == 200, url
        if secret in page.content.decode():
            found[f"page {url} as a viewer"] = True
    assert found == {}, {k: str(v)[:3000] for k, v in found.items()}

    # and it was really there to leak: redacted, not dropped
    assert MARK in Step.objects.get(run=run, tool="read_env").observation
    assert MARK in str(list(AuditLog.objects.filter(verb="set_provider_key").values()))
