"""Secrets are redacted from stored observations, audit rows, log records and rendered pages.

Each realistic secret shape goes through the real paths: a tool returns it (the runtime writes the
Step observation), an action audits it, a logger logs it through ``RedactingFilter``, and the run
page renders the trace.
"""

import logging

import pytest

from agent.actions import do_audit
from agent.models import AuditLog, Step
from fleet.secrets import MARK, RedactingFilter, redact
from tests.rails_support import calls, extra_tool, rails_world, verdict

pytestmark = pytest.mark.django_db

PEM_RSA = """-----BEGIN RSA PRIVATE KEY-----
MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun
VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK
LxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW/VDL5AaWTg0nLVkjRo
-----END RSA PRIVATE KEY-----"""
PEM_OPENSSH = """-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACDd9Yz0kTq5sWQx8p2lW3cYJm6o9v1eXr3Yy7bT0fJ0nQAAAJgyZ2V0Mmdl
-----END OPENSSH PRIVATE KEY-----"""

#: (name, text as it would appear, the secret part that must not survive)
SHAPES = [
    ("openai", "OPENAI key sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3iJk6l in env",
     "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"),
    ("openai_project", "key=sk-proj-Zq8w1E4r7T0y3U6i9O2p5A8s1D4f7G0h3J6k9L2z5X8c1V4b7N0m3Q6w9E2rT3BlbkFJ",
     "Zq8w1E4r7T0y3U6i9O2p5A8s1D4f7G0h3J6k9L2z"),
    ("anthropic", "x-api-key sk-ant-api03-4f3Jk9LmN2pQ7rS1tU5vW8xY0zA3bC6dE9fG2hI5jK8lM1nO4pQ7rS0tU3v-AbCdEfAA",
     "4f3Jk9LmN2pQ7rS1tU5vW8xY0zA3bC6dE9fG2hI5"),
    ("github_classic", "git clone https://ghp_1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6P7q8R@github.com/acme/proving",
     "1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6P7q8R"),
    ("github_fine_grained", "GH_TOKEN=github_pat_11ABCDEFG0123456789abc_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOP",
     "0123456789abcdefghijklmnopqrstuvwxyz"),
    ("aws_access_key_id", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("slack_bot", "SLACK_BOT_TOKEN=xoxb-1234567890123-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
     "AbCdEfGhIjKlMnOpQrStUvWx"),
    ("jwt", "cookie session=eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwiYWRtaW4iOnRydWV9"
            ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
    ("pem_rsa", "found key:\n" + PEM_RSA + "\nend", "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"),
    ("pem_openssh", PEM_OPENSSH, "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"),
    ("bearer_header", "curl -H 'Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0ffee' https://console.vast.ai/api/v0",
     "9f8e7d6c5b4a39281706f5e4d3c2b1a0ffee"),
    ("postgres_url", "HARMONY_DATABASE_URL=postgres://yugabyte:s3cr3t-P4ss@10.0.0.5:5433/yugabyte", "s3cr3t-P4ss"),
    ("password_pair", "login with user=curio password=hunter2hunter2 now", "hunter2hunter2"),
    ("api_key_yaml", "vast:\n  api_key: 4d1c7d3e9a2b5c8f0e1d2c3b4a5f6e7d\n", "4d1c7d3e9a2b5c8f0e1d2c3b4a5f6e7d"),
    ("api_key_json", '{"api_key": "9f8e7d6c5b4a39281706f5e4d3c2b1a0", "region": "eu"}', "9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
]

#: shapes an earlier redactor missed
GAPS = [
    ("aws_secret_access_key", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
     "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("redis_url_no_user", "REDIS_URL=redis://:hunter2hunter2@cache:6379/0", "hunter2hunter2"),
]

ALL = [pytest.param(*s, id=s[0]) for s in SHAPES + GAPS]


@pytest.mark.parametrize(("name", "text", "secret"), ALL)
def test_redact_removes_the_secret(name, text, secret):
    out = redact(text)
    assert secret not in out and MARK in out


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
    with extra_tool("crashy", crash), rails_world() as w, caplog.at_level(logging.ERROR, logger="agent.pipeline"):
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
