"""SSH diagnosis trusts a host key on first use: the key an instance offers on first contact is
kept on the instance; the same key later is accepted; another key on the same address (a second
real sshd with its own host key, started on the port of the first) is refused before logging in,
raises an alert, and the diagnosis says so — nothing runs on that machine."""

import pytest
from django.conf import settings
from django.utils import timezone

from fleet.diagnostics import diagnose
from fleet.models import Alert, Instance
from fleet.providers import set_override
from fleet.ssh import POOL, fingerprint
from tests.sshd import HEALTHY_L, SSHServer
from tests.test_diagnose_ssh import RentedProvider

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def _server(root, port: int = 0) -> SSHServer:
    server = SSHServer(root, port=port)
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    server.fake("nvidia-smi", HEALTHY_L)
    return server


@pytest.fixture
def first(tmp_path, monkeypatch):
    server = _server(tmp_path / "first")
    monkeypatch.setitem(settings.WARDEN, "SSH_USER", server.user)
    monkeypatch.setitem(settings.WARDEN, "SSH_KEY_FILE", str(server.key_file))
    yield server
    POOL.close_all()
    server.stop()


def _instance(server) -> Instance:
    from fleet.providers.base import ProviderInstance

    now = timezone.now()
    inst = Instance.objects.create(provider="rented", external_id="r-1", status="running", status_since=now,
                                   created_at=now, gpu_name="H200", dph=2.5, ssh_host=server.host, ssh_port=server.port)
    set_override(RentedProvider([ProviderInstance("r-1", "running", ssh_host=server.host, ssh_port=server.port)]))
    return inst


def _offered_key(server) -> str:
    import paramiko

    key = paramiko.RSAKey.from_private_key_file(str(server.root / "ssh_host_ed25519_key"))
    return f"{key.get_name()} {key.get_base64()}"


def test_the_first_key_is_kept_and_the_same_key_is_accepted_again(first):
    try:
        inst = _instance(first)
        assert inst.ssh_host_key == ""
        d = diagnose(inst)
        assert (d.health, d.source) == ("healthy", "ssh")
        inst.refresh_from_db()
        assert inst.ssh_host_key == _offered_key(first) and inst.ssh_host_key_at is not None
        POOL.close_all()  # a new connection, not the pooled one
        again = diagnose(inst)
        assert (again.health, again.source) == ("healthy", "ssh")
        assert not Alert.objects.filter(kind="ssh_host_key_changed").exists()
    finally:
        set_override(None)


def test_another_host_key_on_the_same_address_is_refused_with_an_alert_and_said_in_the_diagnosis(first, tmp_path):
    try:
        inst = _instance(first)
        assert diagnose(inst).source == "ssh"
        inst.refresh_from_db()
        kept = inst.ssh_host_key
        POOL.close_all()
        first.stop()
        impostor = _server(tmp_path / "impostor", port=first.port)  # same address, its own host key
        try:
            # it would even let us in with our key: only the host key tells it apart
            (impostor.root / "authorized_keys").write_text((first.root / "authorized_keys").read_text())
            impostor.fake("nvidia-smi", "GPU 0: NVIDIA H200 (UUID: GPU-impostor)")
            d = diagnose(inst)
            assert d.source == "provider" and d.health == "degraded"
            assert d.cause.startswith("SSH host key changed: the machine was not diagnosed")
            assert d.evidence["ssh"]["kind"] == "host_key"
            assert fingerprint(_offered_key(impostor)) in d.evidence["ssh"]["out"]
            assert "nvidia-smi -L" not in d.evidence  # nothing ran on it
            inst.refresh_from_db()
            assert inst.ssh_host_key == kept  # the kept key is not replaced
            alert = Alert.objects.get(kind="ssh_host_key_changed")
            assert alert.severity == "P1" and "r-1" in alert.message and fingerprint(kept) in alert.message
        finally:
            POOL.close_all()
            impostor.stop()
    finally:
        set_override(None)


def test_forgethostkey_forgets_the_kept_key_audited_and_the_next_contact_keeps_the_new_one(first, tmp_path):
    from django.core.management import CommandError, call_command

    from fleet.models import AuditLog

    try:
        inst = _instance(first)
        diagnose(inst)
        POOL.close_all()
        first.stop()
        rebuilt = _server(tmp_path / "rebuilt", port=first.port)
        try:
            (rebuilt.root / "authorized_keys").write_text((first.root / "authorized_keys").read_text())
            assert diagnose(inst).source == "provider"  # refused until an operator says otherwise
            with pytest.raises(CommandError, match="no live instance"):
                call_command("forgethostkey", "r-404", reason="rebuilt")
            call_command("forgethostkey", "r-1", reason="rebuilt by the provider, checked with them")
            row = AuditLog.objects.get(verb="forget_host_key")
            assert row.target == "r-1" and row.reason.startswith("rebuilt by the provider")
            assert Alert.objects.get(kind="ssh_host_key_changed").state == "resolved"
            POOL.close_all()
            assert diagnose(inst).source == "ssh"
            inst.refresh_from_db()
            assert inst.ssh_host_key == _offered_key(rebuilt)
        finally:
            POOL.close_all()
            rebuilt.stop()
    finally:
        set_override(None)
