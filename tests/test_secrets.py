"""Secrets are redacted from stored observations, audit rows, log records and rendered pages.

Each realistic secret shape goes through the real paths: a tool returns it (the runtime writes the
Step observation), an action audits it, a logger logs it through ``RedactingFilter``, and the run
page renders the trace.
"""

import logging

import pytest

from agent.models import Step
from fleet.audit import do_audit
from fleet.models import AuditLog
from fleet.secrets import MARK, RedactingFilter, redact
from tests.rails_support import calls, extra_tool, rails_world, verdict
from tests.secret_corpus import NOT_SECRETS, SECRETS

pytestmark = pytest.mark.django_db

SHAPES = SECRETS
ALL = [pytest.param(*s, id=s[0]) for s in SECRETS]


@pytest.mark.parametrize(("name", "text", "secret"), ALL)
def test_redact_removes_the_secret(name, text, secret):
    out = redact(text)
    assert secret not in out and MARK in out


@pytest.mark.parametrize(("name", "text"), [pytest.param(*s, id=s[0]) for s in NOT_SECRETS])
def test_ids_references_and_prose_are_not_redacted(name, text):
    assert redact(text) == text


@pytest.mark.parametrize(("text", "expected"), [
    # a quoted value is secret to its closing quote, and the quotes stay (JSON text stays JSON)
    ('DB creds: {"password": "QuotedPw77xyz"} and password: "correct horse battery staple"',
     'DB creds: {"password": "[REDACTED]"} and password: "[REDACTED]"'),
    ('api_key="abc def ghi"', 'api_key="[REDACTED]"'),
    ('my password is "hunter 2 secret"', 'my password is "[REDACTED]"'),
    ("--password 'pale blue dot' -h db", "--password '[REDACTED]' -h db"),
    ('{\\"password\\": \\"hunter two\\"}', '{\\"password\\": \\"[REDACTED]\\"}'),
    # an unquoted value runs to the next whitespace, punctuation and all
    ("passwd: Tr0ub4dor&3", "passwd: [REDACTED]"),
    ("login?user=a&password=hunter2&next=/", "login?user=a&password=[REDACTED]"),
    # a value that is itself a pair's key is not the value: the inner pair is cut whole
    ("PASSWD IS passwd: Tr0ub4dor&3 ok", "PASSWD IS passwd: [REDACTED] ok"),
    # a closed quote ends the secret; an unclosed one ends at the line end
    ('password: "open quote\nnext line', 'password: "[REDACTED]\nnext line'),
])
def test_quoted_and_punctuated_values_are_redacted_whole(text, expected):
    assert redact(text) == expected
    assert redact(expected) == expected


def test_a_quoted_value_is_cut_at_a_bounded_length():
    from fleet.secrets import QUOTED_MAX

    out = redact('password: "' + "x" * (QUOTED_MAX + 10))
    assert out == 'password: "' + MARK + "x" * 10


def test_a_pem_header_inside_an_earlier_cut_still_has_its_block_cut():
    """An empty header whose END line runs into the next header must not hide the real block."""
    from tests.secret_corpus import PEM_RSA

    out = redact("-----BEGINPRIVATE KEY----------END " + PEM_RSA)
    assert "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun" not in out


def test_a_long_log_message_is_cut_before_it_is_redacted(caplog):
    """A 404 for a 1 MB path logs ``LOG_CAP`` characters of it, and a secret at the cut is caught whole."""
    from fleet.secrets import LOG_CAP

    caplog.handler.addFilter(RedactingFilter())
    path = "/" + "a" * (LOG_CAP - 12) + " password=hunter2hunter2 " + "b" * 1_000_000
    with caplog.at_level(logging.WARNING, logger="django.request"):
        logging.getLogger("django.request").warning("Not Found: %s", path)
    (record,) = caplog.records
    assert "hunter2" not in record.getMessage()
    assert len(record.getMessage()) < LOG_CAP + 100
    assert f"{len('Not Found: ') + len(path)} characters, cut to {LOG_CAP}" in record.getMessage()


@pytest.mark.parametrize(("name", "text", "secret"), [pytest.param(*s, id=s[0]) for s in SHAPES])
def test_secret_in_a_tool_result_is_redacted_from_the_stored_step_and_the_page(name, text, secret, client, alice):
    def leaky(ctx, args):
        return {"env": text, "nested": [{"log": f"connecting with {text}"}]}

    with extra_tool("read_env", leaky), rails_world() as w:
        run = w.cycle([{"tool": "read_env", "args": {}}, {"text": f"I saw {text}. <verdict>{{\"action\": false, "
                                                                  f"\"state_changed\": false}}</verdict>"}])
    (step,) = calls(run)
    assert step.outcome == "executed"
    stored = [step.observation, step.detail, run.final_answer, run.final_report]
    stored += list(Step.objects.filter(run=run).values_list("text", flat=True))
    for value in stored:
        assert secret not in value
    assert MARK in step.observation
    client.force_login(alice)
    page = client.get(f"/runs/{run.number}/").content.decode()
    assert secret not in page and MARK in page


@pytest.mark.parametrize(("name", "text", "secret"), [pytest.param(*s, id=s[0]) for s in SHAPES])
def test_secret_is_redacted_from_audit_rows(name, text, secret):
    do_audit("user:alice", "set_provider_key", "vast", reason=f"rotated: {text}", before={"key": text},
             after={"keys": [text]})
    row = AuditLog.objects.get(verb="set_provider_key")
    assert secret not in row.reason and secret not in str(row.before) and secret not in str(row.after)


@pytest.mark.parametrize(("name", "text", "secret"), [pytest.param(*s, id=s[0]) for s in SHAPES])
def test_secret_is_redacted_from_log_records(name, text, secret, caplog):
    caplog.handler.addFilter(RedactingFilter())
    log = logging.getLogger("warden.test.secrets")
    with caplog.at_level(logging.INFO, logger="warden.test.secrets"):
        log.info("provider answered: %s", text)
        log.warning(f"retrying with {text}")
    assert secret not in caplog.text
    assert caplog.text.count(MARK) >= 2


def test_secret_in_arguments_and_raw_arguments_is_redacted():
    key = "sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3iJk6l"
    with rails_world() as w:
        run = w.cycle([{"tool": "remember", "args": {"category": "creds", "key": "openai", "value": key}},
                       {"tool": "recall", "raw_arguments": '{"query": "' + key + '", "categ'}, verdict()])
    remember, recall = calls(run)
    assert key not in str(remember.args) and key not in remember.raw_arguments
    assert key not in recall.raw_arguments and recall.reason_code == "invalid_args"


def test_secret_in_a_crashing_tools_traceback_is_redacted_from_logs(caplog):
    url = "postgres://yugabyte:s3cr3t-P4ss@10.0.0.5:5433/yugabyte"

    def crash(ctx, args):
        raise ConnectionError(f"could not connect to {url}")

    caplog.handler.addFilter(RedactingFilter())
    with extra_tool("crashy", crash), rails_world() as w, caplog.at_level(logging.ERROR, logger="agent.runtime.pipeline"):
        run = w.cycle([{"tool": "crashy", "args": {}}, verdict()])
    (step,) = calls(run)
    assert "s3cr3t-P4ss" not in step.observation  # the stored observation is clean either way
    assert "s3cr3t-P4ss" not in caplog.text


KEY = "sk-proj-ABCDEF1234567890abcdefXYZ"


@pytest.mark.django_db
def test_secrets_never_reach_memory_alerts_side_effects_or_diagnoses():
    from agent.models import MemoryFact, SideEffect
    from fleet.models import Alert, Diagnosis
    from tests.rails_support import fleet_entry

    ssh = {"reachable": True, "commands": {"nvidia-smi -L": {"rc": 0, "out": f"GPU 0: RTX 4090\nOPENAI_API_KEY={KEY}"}}}
    with rails_world(fleet=[fleet_entry("v-1", ssh=ssh)], policy={"stop_instance": "auto"}) as w:
        w.cycle([
            {"tool": "remember", "args": {"category": "note", "key": "k", "value": f"the key is {KEY}"}},
            {"tool": "escalate_human", "args": {"severity": "P2", "message": f"leaked {KEY}"}},
            {"tool": "diagnose_instance", "args": {"instance_id": "v-1"}},
            {"tool": "stop_instance", "args": {"instance_id": KEY, "reason": "x"}},
            verdict(),
        ])
    stored = [MemoryFact.objects.values_list("value", flat=True), Alert.objects.values_list("message", "key"),
              SideEffect.objects.values_list("instance_ref", "args"), Diagnosis.objects.values_list("evidence", "cause")]
    assert Diagnosis.objects.exists() and MemoryFact.objects.exists() and Alert.objects.filter(kind="escalation").exists()
    for rows in stored:
        assert KEY not in str(list(rows))


@pytest.mark.parametrize("text, secret", [
    ("PASSWD IS X-Api-Key: 0f9e8d7c6b5a4f3e2d1c", "0f9e8d7c6b5a4f3e2d1c"),  # found by hypothesis
    ("password: hunter2: x", "hunter2"),  # a value ending in a colon holds no pair: still redacted
])
def test_a_pair_inside_a_value_that_looks_like_a_key_is_taken_whole(text, secret):
    assert secret not in redact(text)
