"""The settings page's providers and demand sources: reference names only (variable names, file
paths, addresses without credentials), never a secret's value (docs/safety.md invariant 6)."""

import pytest
from django.urls import reverse

TOKEN = "dmd_" + "Zq7" * 14
DB_PASSWORD = "hunter-" + "Kp2" * 8
URL_SECRET = "qs" + "Vb9" * 10
PATH_SECRET = "ph" + "7fA2" * 8  # a token in the endpoint's path (webhook style)
CMD_SECRET = "cmdsecret" + "Mn4" * 8


@pytest.fixture
def configured(settings, monkeypatch, tmp_path):
    key = tmp_path / "id_owned"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----\n")
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f"""
[defaults]
user = "curio"
start = "CURIO_TOKEN={CMD_SECRET} systemctl start curio"
stop = "systemctl stop curio"
check = "systemctl is-active curio"

[[hosts]]
name = "rig-1"
host = "10.0.0.11"
key_file = "{key}"
gpu_name = "RTX 4090"

[[hosts]]
name = "rig-2"
host = "10.0.0.12"
port = 2222
key_file = "{tmp_path / 'missing_key'}"
""")
    monkeypatch.setitem(settings.WARDEN, "SSH_HOSTS_FILE", str(hosts))
    monkeypatch.setenv("DEMAND_TOKEN_FOR_PAGE", TOKEN)
    monkeypatch.setenv("HARMONY_DATABASE_URL", f"postgres://reader:{DB_PASSWORD}@db.example.test:5433/yugabyte")
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "http", "DEMAND_TOKEN_ENV": "DEMAND_TOKEN_FOR_PAGE",
                       "DEMAND_URL": f"https://ops:{DB_PASSWORD}@demand.example.test/v1/{PATH_SECRET}/demand?key={URL_SECRET}"}
    return {"key": key, "hosts": hosts}


@pytest.mark.django_db
def test_it_names_every_reference_and_shows_no_secret(client, alice, configured, settings):
    client.force_login(alice)
    page = client.get(reverse("settings")).content.decode()

    assert "Providers and demand sources" in page
    assert f"WARDEN_SSH_HOSTS_FILE={configured['hosts']}" in page
    assert "rig-1" in page and "10.0.0.11:22" in page and "10.0.0.12:2222" in page
    assert str(configured["key"]) in page and "cannot be read" in page  # rig-2's key file is missing
    assert "WARDEN_DEMAND_SOURCE=http" in page
    assert "https://demand.example.test/…" in page  # the path may carry a token: not shown
    assert "DEMAND_TOKEN_FOR_PAGE" in page
    for secret in (TOKEN, DB_PASSWORD, URL_SECRET, PATH_SECRET, CMD_SECRET, "BEGIN OPENSSH", "b3BlbnNzaC1rZXktdjEAAAA"):
        assert secret not in page, secret

    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "curio"}
    page = client.get(reverse("settings")).content.decode()
    assert "HARMONY_DATABASE_URL" in page and "postgres://db.example.test:5433/yugabyte" in page
    assert DB_PASSWORD not in page and "reader" not in page


@pytest.mark.django_db
def test_a_bad_hosts_file_is_named_on_the_page(client, alice, configured):
    configured["hosts"].write_text('[[hosts]]\nname = "rig-1"\nhost = "h"\n')
    client.force_login(alice)
    page = client.get(reverse("settings")).content.decode()
    assert 'id="owned-hosts-error"' in page and "host rig-1: user: Field required" in page
