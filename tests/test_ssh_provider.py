"""Owned SSH hosts against the real test sshd (``tests.sshd``).

The hosts' start/stop/check commands are small shell scripts on the sshd's PATH that keep the
"worker" as a file in the sshd's directory, so every call really travels over SSH.
"""

import pytest
from django.utils import timezone

from fleet.diagnostics import unreachable_alerts
from fleet.models import Alert, Diagnosis, Instance
from fleet.providers import ProviderError, get_provider, set_override
from fleet.providers.base import Provider, ProviderInstance
from fleet.providers.ssh import SSHProvider, WithOwnedHosts, load_hosts
from fleet.sync import sync_instances
from tests import sshd as sshd_support
from tests.sshd import free_port

sshd = sshd_support.sshd
DB = pytest.mark.django_db(databases=["default", "harmony"])


@pytest.fixture
def hosts(sshd, tmp_path, settings, monkeypatch):
    """A hosts file with rig-1 and rig-2 on the test sshd and rig-3 where nothing listens."""
    settings.VAR_DIR = tmp_path / "var"
    state = sshd.root / "workers"
    state.mkdir()
    sshd.script("worker-start", f'[ "$1" = fail ] && {{ echo "no GPU driver" >&2; exit 3; }}\n'
                                f'echo "$CURIO_NODE_NAME $WARDEN_LABEL" > {state}/"$CURIO_NODE_NAME"')
    sshd.script("worker-stop", f'rm -f {state}/"$CURIO_NODE_NAME"')
    sshd.script("worker-check", f'test -f {state}/"$CURIO_NODE_NAME" || {{ echo "curio: inactive"; exit 3; }}')
    path = tmp_path / "hosts.toml"
    path.write_text(f"""
[defaults]
user = "{sshd.user}"
key_file = "{sshd.key_file}"
start = "worker-start"
stop = "worker-stop"
check = "worker-check"
timeout_s = 3

[[hosts]]
name = "rig-1"
host = "{sshd.host}"
port = {sshd.port}
gpu_name = "RTX 4090"

[[hosts]]
name = "rig-2"
host = "{sshd.host}"
port = {sshd.port}
gpu_name = "H200"
worker_name = "curio-rig-2"
dph = 0.4

[[hosts]]
name = "rig-3"
host = "127.0.0.1"
port = {free_port()}
""")
    monkeypatch.setitem(settings.WARDEN, "SSH_HOSTS_FILE", str(path))
    return state


def listed(provider) -> dict[str, ProviderInstance]:
    return {pi.external_id: pi for pi in provider.list_instances()}


def test_every_configured_host_is_listed_an_unreachable_one_offline_not_left_out(hosts):
    seen = listed(SSHProvider())

    assert sorted(seen) == ["rig-1", "rig-2", "rig-3"]
    assert seen["rig-1"].status == seen["rig-2"].status == "stopped"  # idle: free for a launch
    assert "worker not running (check exited 3: curio: inactive)" == seen["rig-1"].status_msg
    assert seen["rig-3"].status == "offline"
    assert "unreachable over SSH" in seen["rig-3"].status_msg
    assert (seen["rig-2"].gpu_name, seen["rig-2"].dph, seen["rig-2"].worker_name) == ("H200", 0.4, "curio-rig-2")
    assert seen["rig-1"].extra["provider"] == "ssh"


def test_launch_starts_the_worker_on_a_free_host_under_its_curio_name(hosts):
    p = SSHProvider()

    first = p.launch(label="warden-abc")
    second = p.launch()

    assert (first.external_id, first.status, first.worker_name) == ("rig-1", "running", "rig-1")
    assert (hosts / "rig-1").read_text().strip() == "rig-1 warden-abc"  # CURIO_NODE_NAME and the label, over SSH
    assert (second.external_id, second.worker_name) == ("rig-2", "curio-rig-2")
    assert (hosts / "curio-rig-2").exists()
    with pytest.raises(ProviderError) as exc:
        p.launch()  # rig-3 is unreachable: never a launch target
    assert exc.value.code == "no_free_host"
    assert listed(p)["rig-1"].status == "running"


def test_a_launch_can_ask_for_a_gpu_model_or_a_named_host(hosts):
    p = SSHProvider()

    assert p.launch(gpu_name="H200").external_id == "rig-2"
    assert p.launch(offer_id="rig-1").external_id == "rig-1"
    with pytest.raises(ProviderError) as exc:
        p.launch(gpu_name="A100")
    assert exc.value.code == "no_free_host" and "gpu A100" in str(exc.value)


@pytest.mark.slow
def test_stop_stops_the_worker_and_the_host_is_free_again(hosts):
    p = SSHProvider()
    p.launch()

    p.stop("rig-1")

    assert not (hosts / "rig-1").exists()
    pi = listed(p)["rig-1"]
    assert (pi.status, pi.intended_status) == ("stopped", "stopped")
    assert p.launch().external_id == "rig-1"


def test_a_worker_that_dies_while_wanted_is_exited_and_reboot_restarts_it(hosts):
    p = SSHProvider()
    p.launch()
    (hosts / "rig-1").unlink()  # the worker died on its own

    pi = listed(p)["rig-1"]
    assert (pi.status, pi.intended_status) == ("exited", "running")

    p.reboot("rig-1")
    assert listed(p)["rig-1"].status == "running"


def test_a_failing_start_command_is_an_error_naming_the_host_and_its_output(hosts, sshd):
    sshd.script("worker-start", 'echo "no GPU driver" >&2; exit 3')

    with pytest.raises(ProviderError) as exc:
        SSHProvider().launch()

    assert exc.value.code == "command_failed"
    assert "rig-1: start exited 3: no GPU driver" in str(exc.value)


def test_an_owned_host_is_never_destroyed(hosts):
    p = SSHProvider()
    p.launch()

    with pytest.raises(ProviderError) as exc:
        p.destroy("rig-1")

    assert exc.value.code == "owned_host" and "never destroyed" in str(exc.value)
    assert listed(p)["rig-1"].status == "running"  # nothing was done to it


@pytest.mark.parametrize("body, error", [
    ('[[hosts]]\nname = "a"\nhost = "h"\nuser = "u"\nstop = "s"\ncheck = "c"\n', "host a: start: Field required"),
    ('[[hosts]]\nname = "a b"\nhost = "h"\nuser = "u"\nstart = "s"\nstop = "s"\ncheck = "c"\n', "host a b: name:"),
    ('[[hosts]]\nname = "a"\nhost = "h"\nport = 70000\nuser = "u"\nstart = "s"\nstop = "s"\ncheck = "c"\n',
     "host a: port:"),
    ('[defaults]\nuser = "u"\nstart = "s"\nstop = "s"\ncheck = "c"\n[[hosts]]\nname = "a"\nhost = "h"\n'
     '[[hosts]]\nname = "a"\nhost = "h2"\n', "host name 'a' is used twice"),
    ('[[hosts]]\nname = "a"\nhost = "h"\nuser = "u"\nstart = "s"\nstop = "s"\ncheck = "c"\npassword = "x"\n',
     "host a: password: Extra inputs are not permitted"),
    # two workers under one Curio machine name: one live worker would count for both hosts
    ('[defaults]\nuser = "u"\nstart = "s"\nstop = "s"\ncheck = "c"\n[[hosts]]\nname = "a"\nhost = "h"\n'
     '[[hosts]]\nname = "b"\nhost = "h2"\nworker_name = "a"\n', "host b: Curio machine name 'a' is also host a's"),
    # a rented instance's id (vast.ai: a number) would be routed to the owned host, never destroyed
    ('[[hosts]]\nname = "31337"\nhost = "h"\nuser = "u"\nstart = "s"\nstop = "s"\ncheck = "c"\n',
     "host name '31337' is a number"),
    ('[hosts\n', "not valid TOML"),
    ('[server]\n', "unknown section(s) server"),
])
def test_a_bad_hosts_file_is_an_error_naming_the_entry_and_the_field(tmp_path, body, error):
    path = tmp_path / "hosts.toml"
    path.write_text(body)

    with pytest.raises(ProviderError) as exc:
        load_hosts(str(path))

    assert exc.value.code == "config"
    assert error in str(exc.value) and str(path) in str(exc.value)


def test_a_missing_hosts_file_says_which_setting_names_it(tmp_path):
    with pytest.raises(ProviderError) as exc:
        load_hosts(str(tmp_path / "nope.toml"))
    assert "WARDEN_SSH_HOSTS_FILE=" in str(exc.value) and "cannot read it" in str(exc.value)


class RentedProvider(Provider):
    """A stand-in for a rented cloud beside the owned hosts: launches add listed instances."""

    name = "rented"

    def __init__(self):
        self.instances: list[ProviderInstance] = []

    def list_instances(self):
        return list(self.instances)

    def launch(self, *, gpu_name="", offer_id="", label=""):
        pi = ProviderInstance(f"v-{len(self.instances) + 1}", "running", label=label, dph=1.5)
        self.instances.append(pi)
        return pi

    def search_offers(self, *, gpu_name="", max_dph=None, limit=10):
        return [{"id": "o-1", "gpu_name": "A100", "dph": 1.5}]


@pytest.mark.slow
@DB
def test_owned_hosts_run_beside_a_rented_provider_owned_first(hosts, settings):
    from agent.actions.instances import do_launch_instance

    rented = RentedProvider()
    fleet = WithOwnedHosts(rented, SSHProvider())
    set_override(fleet)
    try:
        offers = fleet.search_offers()
        assert [o["id"] for o in offers] == ["rig-1", "rig-2", "o-1"]  # free owned hosts first
        a = do_launch_instance(actor="test", label="l-1")
        b = do_launch_instance(actor="test", label="l-2")
        c = do_launch_instance(actor="test", label="l-3")  # no owned host free: rented
        rows = {i.external_id: i for i in sync_instances()}
    finally:
        set_override(None)

    assert [(i.provider, i.external_id) for i in (a, b, c)] == [("ssh", "rig-1"), ("ssh", "rig-2"), ("rented", "v-1")]
    assert {k: (v.provider, v.status) for k, v in rows.items()} == {
        "rig-1": ("ssh", "running"), "rig-2": ("ssh", "running"), "rig-3": ("ssh", "offline"), "v-1": ("rented", "running"),
    }
    assert rows["rig-1"].is_owned_host and not rows["v-1"].is_owned_host
    with pytest.raises(ProviderError) as exc:
        fleet.destroy("rig-2")  # per-instance calls go to the provider that owns the id
    assert exc.value.code == "owned_host"


@DB
def test_the_registry_puts_owned_hosts_beside_the_configured_provider(hosts, settings):
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "local"}
    fleet = get_provider()
    assert isinstance(fleet, WithOwnedHosts) and fleet.names == {"local", "ssh"}
    assert isinstance(get_provider("ssh"), SSHProvider)
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "ssh"}
    assert isinstance(get_provider(), SSHProvider)


@DB
def test_an_unreachable_host_gets_an_alert_and_a_diagnosis_not_removal(hosts, sshd):
    set_override(SSHProvider())
    try:
        rows = {i.external_id: i for i in sync_instances()}
        raised = unreachable_alerts(list(rows.values()))
        again = unreachable_alerts(list(rows.values()))
    finally:
        set_override(None)

    assert [a.key for a in raised] == ["provider_error:ssh:rig-3"] and again == []  # once per episode
    alert = raised[0]
    assert alert.kind == "provider_error" and alert.instance == rows["rig-3"]
    assert "never removed" in alert.message and "Diagnosis: failed/host: provider reports offline" in alert.message
    d = Diagnosis.objects.get(instance=rows["rig-3"])
    assert d.source == "provider" and d.evidence["ssh"]["rc"] == 255
    assert rows["rig-3"].killed_at is None


@DB
def test_the_alert_resolves_when_the_host_answers_again(hosts, sshd):
    now = timezone.now()
    inst = Instance.objects.create(provider="ssh", external_id="rig-1", status="offline", status_since=now,
                                   created_at=now, ssh_host=sshd.host, ssh_port=free_port())
    set_override(SSHProvider())
    try:
        unreachable_alerts([inst])
        assert Alert.objects.get(key="provider_error:ssh:rig-1").state == "firing"
        inst.status = "stopped"
        unreachable_alerts([inst])
    finally:
        set_override(None)
    assert Alert.objects.get(key="provider_error:ssh:rig-1").state == "resolved"



@pytest.mark.slow
@pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
def test_a_cycle_reads_http_demand_and_starts_a_worker_on_an_owned_host(hosts, settings):
    """End to end: the http endpoint says work waits and no worker is live; the rules planner
    launches, and the launch starts the worker on the first free owned host over SSH."""
    from agent.runtime.loop import run_cycle
    from tests.test_demand_http import Endpoint

    ep = Endpoint()
    ep.answer({"queued": 5, "running": 0, "workers": []})
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "ssh", "DEMAND_SOURCE": "http", "DEMAND_URL": ep.url,
                       "DEMAND_TIMEOUT_S": 2.0, "DEMAND_TOKEN_ENV": "", "DEMAND_TOKEN_FILE": "",
                       "MAX_INSTANCES": 4, "PROOF_SECONDS": 20.0}
    try:
        run = run_cycle("test")
    finally:
        ep.close()

    launches = list(run.steps.filter(kind="call", tool="launch_instance").order_by("pk"))
    # 360/hr wanted at 20 s per proof: two workers, on the two reachable owned hosts
    assert [(s.outcome, s.ok, s.reason_code) for s in launches] == [("executed", True, "")] * 2
    rows = {i.external_id: i for i in Instance.objects.filter(provider="ssh")}
    assert {k: v.status for k, v in rows.items()} == {"rig-1": "running", "rig-2": "running", "rig-3": "offline"}
    assert (hosts / "rig-1").exists() and (hosts / "curio-rig-2").exists()  # the workers really started over SSH
    assert Alert.objects.filter(key="provider_error:ssh:rig-3", state="firing").exists()  # rig-3 unreachable
    assert rows["rig-3"].killed_at is None


def test_a_launch_is_found_by_its_label_and_a_refused_start_leaves_no_trace(hosts, sshd):
    p = SSHProvider()
    p.launch(label="warden-k1")

    assert [pi.external_id for pi in p.find_by_label("warden-k1")] == ["rig-1"]  # how a lost answer is found
    assert p.find_by_label("warden-other") == []

    sshd.script("worker-start", "exit 3")
    with pytest.raises(ProviderError):
        p.launch(label="warden-k2")  # rig-2's start fails: it stays free and unlabelled
    assert p.find_by_label("warden-k2") == []
    assert listed(p)["rig-2"].intended_status == "stopped"
