"""Diagnosis fan-out across two real Celery worker processes: a ``group`` of
``agent.tasks.diagnose_instances`` chunks, each worker diagnosing its chunk over SSH (the test
sshd, recorded outputs) in its own thread pool, joined on the database by the caller. The
workers diagnose and change nothing else: no run is started, no instance is touched.
"""

import subprocess

import pytest
from django.conf import settings
from django.utils import timezone

from agent.models import Run
from agent.runtime.diagnosis import diagnose_fanout
from fleet.models import Diagnosis, Instance
from tests import fleet_support
from tests.fleet_support import FLEET_DB, wait_for
from tests.sshd import SSHServer
from tests.test_approval_restart import CELERY, ROOT, Worker, worker_env  # noqa: F401

pytestmark = [FLEET_DB, pytest.mark.slow]
local_fleet = fleet_support.local_fleet


class PrefetchOneWorker(Worker):
    """A solo worker that reserves one task at a time, so two workers share a group."""

    def start(self):
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                [str(CELERY), "-A", "console", "worker", "-Q", settings.CELERY_TASK_DEFAULT_QUEUE, "--pool", "solo",
                 "--prefetch-multiplier", "1", "-l", "info", "-n", f"{self.name}@%h", "--without-gossip",
                 "--without-mingle", "--without-heartbeat"],
                cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: self.proc.poll() is not None or "ready." in self.text(), timeout=60, what="celery worker ready")
        assert self.proc.poll() is None, f"celery worker exited:\n{self.text()}"
        return self


@pytest.fixture
def sshd_gpu_lost(tmp_path_factory):
    s = SSHServer(tmp_path_factory.mktemp("sshd-fanout"))
    s.start()
    s.profile("gpu_lost_xid79")
    s.script("uptime", "sleep 1; echo ' 10:00:00 up 3 days'")  # each diagnosis takes a second: both workers get work
    yield s
    s.stop()


def test_a_group_of_diagnoses_is_shared_by_two_workers_and_joined_on_the_database(worker_env, sshd_gpu_lost, tmp_path):  # noqa: F811
    env = {**worker_env, "WARDEN_SSH_USER": sshd_gpu_lost.user, "WARDEN_SSH_KEY_FILE": str(sshd_gpu_lost.key_file)}
    workers = [PrefetchOneWorker(env, tmp_path / f"celery-{n}.log", n).start() for n in ("w1", "w2")]
    try:
        now = timezone.now()
        instances = [Instance.objects.create(provider="local", external_id=f"f-{n}", status="running", status_since=now,
                                             created_at=now, ssh_host=sshd_gpu_lost.host, ssh_port=sshd_gpu_lost.port)
                     for n in range(4)]

        diags = diagnose_fanout(instances, chunk=1, timeout_s=30)

        assert [d.instance_id for d in diags] == [i.pk for i in instances]
        assert {(d.source, d.health, d.fault_class) for d in diags} == {("ssh", "failed", "host")}
        assert Diagnosis.objects.count() == 4
        for w in workers:  # each process diagnosed part of the group
            assert "agent.tasks.diagnose_instances" in w.text() and "succeeded" in w.text(), w.text()[-2000:]
        assert Run.objects.count() == 0  # the workers diagnosed; they started nothing
        assert set(Instance.objects.values_list("status", flat=True)) == {"running"}
    finally:
        for w in workers:
            w.kill()
