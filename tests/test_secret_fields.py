"""Text is redacted where it enters: every text column of every model of ``agent`` and ``fleet``.

``fleet.secrets.install_field_redaction`` is the one redaction point for stored text. Two walks
prove it, both over ``fleet.secrets.text_fields()`` (introspected from ``apps.get_models()``, so a
field or a model added later is walked too):

- each column is written the four ways the code writes (``save()``, ``create()``,
  ``bulk_create()``, ``QuerySet.update()``) with each corpus shape that fits in it, and read back;
- the real entry paths (an operator's rejection through the approvals view, the provider's
  ``gpu_name``/``label``/``status_msg`` through sync and a cycle, a Curio node's name through the
  demand reader) are driven with the corpus, then every column of every row is read: no secret
  part survives anywhere, nor on the pages a viewer loads, the ``rejected_recently`` detail or the
  model digest's evidence.
"""

import itertools
from datetime import UTC, datetime

import pytest
from django.db import models

from agent.memory.model_digest import consolidation_evidence
from agent.models import Approval
from agent.runtime.loop import resume_run
from fleet.models import DemandSample, Instance
from fleet.secrets import MARK, redact, text_fields
from fleet.sync import sync_instances
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)
from tests.rails_support import calls, fleet_entry, rails_world, verdict
from tests.secret_corpus import SECRETS

_counter = itertools.count(1)
BY_NAME = {name: (text, secret) for name, text, secret in SECRETS}
#: the nine shapes of the rejection comment (an OpenAI project key, a GitHub token, an AWS key id, a
#: Slack token, a database URL's password, a --password flag, a bearer JWT, an OpenSSH key block, a
#: JSON api_key)
NINE = ["openai_project", "github_classic", "aws_access_key_id", "slack_bot", "postgres_url", "cli_flag", "jwt",
        "pem_openssh", "api_key_json"]
COMMENT = "no: " + "\n".join(BY_NAME[n][0] for n in NINE)
ALL_SECRET_PARTS = [secret for _, _, secret in SECRETS]


def _fill(field):
    """A valid value for a required column (unique ones get a fresh number)."""
    n = next(_counter)
    if isinstance(field, models.JSONField):
        return {}
    if isinstance(field, models.CharField | models.TextField):
        return f"x{n}"[: field.max_length or 40]
    if isinstance(field, models.BooleanField):
        return False
    if isinstance(field, models.IntegerField | models.FloatField | models.DecimalField):
        return n
    if isinstance(field, models.DateTimeField):
        return datetime(2026, 6, 9, 12, 0, tzinfo=UTC)
    if isinstance(field, models.DurationField):
        from datetime import timedelta
        return timedelta(seconds=1)
    raise AssertionError(f"no filler for {field!r}: teach tests/test_secret_fields.py._fill this field type")


#: values a row needs beyond its required columns (a second running run breaks ``one_running_run``)
MODEL_VALUES = {"agent.Run": {"status": "done"}}


def build(model, /, **values):
    """An unsaved ``model`` with every required column filled (foreign keys get a saved row)."""
    values = {**MODEL_VALUES.get(model._meta.label, {}), **values}
    for field in model._meta.concrete_fields:
        if field.primary_key or field.name in values or field.null or field.has_default() or field.blank \
                and not isinstance(field, models.ForeignKey):
            continue
        if isinstance(field, models.ForeignKey):
            related = build(field.related_model)
            related.save()
            values[field.name] = related
        else:
            values[field.name] = _fill(field)
    return model(**values)


ALL_TEXT = "\n".join(text for _, text, _ in SECRETS)
#: a capped column is written with at most this many of the shapes that fit in it (a different slice
#: of the corpus per column, so the corpus is spread over the columns; the long ones take it all)
PER_COLUMN = 6


def samples(field, index: int) -> list[tuple[object, list[str]]]:
    """``(value to write, secret parts that must not survive)``: the whole corpus at once for a
    JSON, text or long column; for a short one, up to :data:`PER_COLUMN` shapes that fit, one by one."""
    cap = getattr(field, "max_length", None)
    if isinstance(field, models.JSONField):
        return [({"k": ALL_TEXT, "nested": [{"log": t} for _, t, _ in SECRETS], **{t[:200]: 1 for _, t, _ in SECRETS}},
                 ALL_SECRET_PARTS)]
    if cap is None or cap >= len(ALL_TEXT):
        return [(ALL_TEXT, ALL_SECRET_PARTS)]
    fits = []
    for _name, text, secret in SECRETS:
        if len(text) <= cap:
            fits.append((text, [secret]))
        elif len(secret) <= cap and redact(secret) != secret:
            fits.append((secret, [secret]))  # the secret alone fits a short column
    start = (index * PER_COLUMN) % len(fits) if fits else 0
    return (fits[start:] + fits[:start])[:PER_COLUMN]


def by_save(model, field, value):
    row = build(model, **{field.name: value})
    row.save()
    assert MARK in str(getattr(row, field.attname)), "the saved instance keeps the redacted value"
    return row.pk


def by_create(model, field, value):
    row = build(model, **{field.name: value})
    return model.objects.create(**{f.name: getattr(row, f.name) for f in model._meta.concrete_fields
                                   if not f.primary_key}).pk


def by_bulk_create(model, field, value):
    [row] = model.objects.bulk_create([build(model, **{field.name: value})])
    return row.pk


def by_update(model, field, value):
    row = build(model)
    row.save()
    assert model.objects.filter(pk=row.pk).update(**{field.name: value}) == 1
    return row.pk


WAYS = [by_save, by_create, by_bulk_create, by_update]


@pytest.mark.django_db
def test_every_text_column_redacts_each_way_it_is_written():
    fields = list(text_fields())
    assert len(fields) > 60 and {m._meta.label for m, _ in fields} >= {"agent.Approval", "fleet.Instance",
                                                                          "fleet.DemandSample"}
    leaks, checked = [], 0
    for index, (model, field) in enumerate(fields):
        cases = samples(field, index)
        if not cases:
            assert field.max_length < 20, f"{model._meta.label}.{field.name} holds no corpus shape?"
            continue  # too short for any secret shape (e.g. a 10-character status)
        for value, secrets in cases:
            for way in WAYS:
                pk = way(model, field, value)
                stored = str(model.objects.filter(pk=pk).values_list(field.name, flat=True).get())
                checked += 1
                if MARK not in stored or [s for s in secrets if s in stored]:
                    leaks.append((model._meta.label, field.name, way.__name__, stored[:120]))
                model.objects.filter(pk=pk).delete()  # a unique column takes the next one
    assert leaks == []
    assert checked > 400


def leaks_in_every_column(secrets) -> list[tuple[str, str, int]]:
    """``(model, column, pk)`` of every stored value holding one of ``secrets``."""
    found = []
    for model, field in text_fields():
        for pk, value in model.objects.values_list("pk", field.name):
            text = str(value)
            found += [(model._meta.label, field.name, pk) for s in secrets if s in text]
    return found


STOP = {"tool": "stop_instance", "args": {"instance_id": "local-5", "reason": "idle"}}
DIAG = {"tool": "diagnose_instance", "args": {"instance_id": "local-5"}}
CALM = {"state": "ok", "active": False, "queued": 0, "running": 0, "idle_min": 90}


@pytest.mark.django_db
def test_a_rejection_comment_is_redacted_where_it_enters(client, alice, bob, broker_queue,
                                                        django_capture_on_commit_callbacks):
    secrets = [BY_NAME[n][1] for n in NINE]
    with rails_world([fleet_entry("local-4"), fleet_entry("local-5")], CALM) as w:
        run = w.cycle([DIAG, STOP])
        approval = Approval.objects.get()
        client.force_login(alice)
        with django_capture_on_commit_callbacks(execute=True):
            resp = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "reject", "comment": COMMENT})
        assert resp.status_code == 302
        approval.refresh_from_db()
        assert approval.status == "rejected" and approval.comment.count(MARK) >= len(NINE) - 1
        resume_run(run)
        rejected = run.steps.get(tool="stop_instance")
        assert rejected.outcome == "rejected" and MARK in rejected.observation
        w.clock.advance(120)
        again = w.cycle([DIAG, STOP, verdict()])
        refused = calls(again)[1]
        assert refused.reason_code == "rejected_recently" and MARK in refused.detail
        digest = consolidation_evidence()
    assert MARK in digest and not [s for s in secrets if s in digest]
    assert leaks_in_every_column(secrets) == []
    client.force_login(bob)
    for url in ("/approvals/?state=all", "/approvals/", f"/runs/{run.number}/", f"/runs/{again.number}/", "/memory/"):
        page = client.get(url)
        assert page.status_code == 200, url
        assert not [s for s in secrets if s in page.content.decode()], url


HOSTILE_PROVIDER = {
    "gpu_name": "RTX 4090 api_key: sk-live-9f8e7d6c5b4a3928170",
    "status_msg": "booted; password=hunter2hunter2 " + BY_NAME["pem_openssh"][0],
    "label": "lab " + BY_NAME["github_classic"][0],
}
PROVIDER_SECRETS = ["9f8e7d6c5b4a3928170", "hunter2hunter2", BY_NAME["pem_openssh"][1], BY_NAME["github_classic"][1]]


@pytest.mark.django_db
def test_provider_fields_are_redacted_where_they_enter(client, bob):
    with rails_world([fleet_entry("v-8")], CALM) as w:
        # a new instance listed by the provider with our label is adopted at sync, its fields as listed
        w.provider.instances["v-7"] = {"status": "running", "intended_status": "running", "dph": 0.4, "started_at": None,
                                       **{k: v for k, v in HOSTILE_PROVIDER.items() if k != "label"}}
        orig = w.provider._view

        def view(ext, inst):
            v = orig(ext, inst)
            if ext == "v-7":
                v.label = HOSTILE_PROVIDER["label"]
            return v

        w.provider._view = view
        sync_instances()
        w.cycle([{"tool": "list_instances", "args": {}}, verdict()])
        w.cycle([verdict()])
    inst = Instance.objects.get(external_id="v-7")
    assert MARK in inst.gpu_name and MARK in inst.status_msg and MARK in inst.label
    assert inst.gpu_name.startswith("RTX 4090")
    assert DemandSample.objects.count() >= 2
    assert leaks_in_every_column(PROVIDER_SECRETS) == []
    client.force_login(bob)
    for url in ("/", "/fleet/", "/instances/v-7/", "/runs/", "/traces/"):
        page = client.get(url)
        assert page.status_code == 200, url
        assert not [s for s in PROVIDER_SECRETS if s in page.content.decode()], url


WORKER_NAME = "sealer password=hunter2hunter2"
WORKER_HOST = "10.0.0.9:12300 api_key: sk-live-9f8e7d6c5b4a3928170"


@CURIO_DB
def test_a_worker_reported_name_is_redacted_in_every_demand_sample(curio):  # noqa: F811
    from agent.runtime.observe import read_and_record_demand

    curio.machine(WORKER_NAME, age_s=5, host=WORKER_HOST)  # a Curio node that matches no instance
    instance("vast-201")
    for _ in range(3):
        read_and_record_demand(instances())
    samples = list(DemandSample.objects.all())
    assert len(samples) == 3
    assert all(MARK in str(s.detail.get("unmatched")) for s in samples), [s.detail for s in samples]
    assert leaks_in_every_column(["hunter2hunter2", "9f8e7d6c5b4a3928170"]) == []
